"""Built-in rewards plugin."""
