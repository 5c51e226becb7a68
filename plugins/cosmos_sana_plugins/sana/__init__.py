"""Built-in sana plugin."""
