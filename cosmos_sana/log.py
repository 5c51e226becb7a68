"""The ``cosmos_sana`` logger namespace, with secret redaction on every record."""

from __future__ import annotations

import logging

from cosmos_sana.redaction import redact_text

ROOT = "cosmos_sana"


class RedactingFilter(logging.Filter):
    """Masks secret environment values in the fully formatted message."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        clean = redact_text(message)
        if clean != message:
            record.msg, record.args = clean, None
        return True


class RedactingFormatter(logging.Formatter):
    """Also masks secrets that only appear in exception text."""

    def format(self, record: logging.LogRecord) -> str:
        return redact_text(super().format(record))


def get_logger(name: str = "") -> logging.Logger:
    """``cosmos_sana`` or a child of it (``get_logger(__name__)`` works too)."""
    if not name or name == ROOT:
        return _root()
    if not name.startswith(ROOT):
        name = f"{ROOT}.{name}"
    _root()
    return logging.getLogger(name)


def _root() -> logging.Logger:
    logger = logging.getLogger(ROOT)
    if not getattr(logger, "_cosmos_sana_configured", False):
        handler = logging.StreamHandler()
        handler.setFormatter(RedactingFormatter("[cosmos-sana %(levelname)s %(name)s] %(message)s"))
        handler.addFilter(RedactingFilter())
        logger.addHandler(handler)
        logger.addFilter(RedactingFilter())
        logger.setLevel(logging.INFO)
        logger.propagate = False
        logger._cosmos_sana_configured = True  # type: ignore[attr-defined]
    return logger


def add_file_handler(path: str) -> logging.Handler:
    """Mirror the namespace to a file (the run's output folder), redacted too."""
    handler = logging.FileHandler(path)
    handler.setFormatter(RedactingFormatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    handler.addFilter(RedactingFilter())
    _root().addHandler(handler)
    return handler
