"""Our log handler writes to whatever ``sys.stderr`` is when a message is logged."""

from __future__ import annotations

import io
import sys

from cosmos_sana.log import get_logger


def test_messages_follow_a_replaced_stderr(monkeypatch):
    logger = get_logger("cosmos_sana.test_log_stream")  # the handler exists before stderr is replaced
    first, second = io.StringIO(), io.StringIO()
    monkeypatch.setattr(sys, "stderr", first)
    logger.info("one")
    monkeypatch.setattr(sys, "stderr", second)
    first.close()  # a closed earlier stream must not be written to (a logging error before)
    logger.info("two")
    assert second.getvalue() == "[cosmos-sana INFO cosmos_sana.test_log_stream] two\n"
