"""Entry point of the built-in trainers plugin."""

from cosmos_sana.hookspecs import hookimpl  # noqa: F401
