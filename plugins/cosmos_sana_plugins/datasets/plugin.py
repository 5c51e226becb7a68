"""Entry point of the built-in datasets plugin."""

from cosmos_sana.hookspecs import hookimpl  # noqa: F401
