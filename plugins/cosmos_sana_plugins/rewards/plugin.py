"""Entry point of the built-in rewards plugin."""

from cosmos_sana.hookspecs import hookimpl  # noqa: F401
