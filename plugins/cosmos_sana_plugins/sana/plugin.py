"""Entry point of the built-in sana plugin."""

from cosmos_sana.hookspecs import hookimpl  # noqa: F401
