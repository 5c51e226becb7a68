"""Built-in datasets plugin."""
