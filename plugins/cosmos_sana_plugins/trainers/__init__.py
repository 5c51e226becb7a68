"""Built-in trainers plugin."""
