"""What the runtime workarounds in ``cosmos_sana.compat.cosmos_rl`` do to a launch."""

from __future__ import annotations

import logging

import pytest
from cosmos_rl.utils.constant import RedisStreamConstant

from cosmos_sana.compat import cosmos_rl as compat


@pytest.fixture
def command_block(monkeypatch):
    monkeypatch.setattr(RedisStreamConstant, "CMD_READING_TIMEOUT_MS", 10_000)
    monkeypatch.delenv(compat.COMMAND_POLL_ENV, raising=False)
    return monkeypatch


def test_command_reads_block_20_ms_by_default(command_block):
    compat.patch_command_poll()
    assert RedisStreamConstant.CMD_READING_TIMEOUT_MS == 20
    # the rollout stream's read (a real wait for data) keeps its own timeout
    assert RedisStreamConstant.ROLLOUT_READING_TIMEOUT_MS == 10_000


def test_command_block_from_the_environment(command_block):
    command_block.setenv(compat.COMMAND_POLL_ENV, "250")
    compat.patch_command_poll()
    assert RedisStreamConstant.CMD_READING_TIMEOUT_MS == 250


@pytest.mark.parametrize("raw", ["0", "-5", "1.5", "fast"])
def test_bad_command_block_is_refused_by_name(command_block, raw):
    command_block.setenv(compat.COMMAND_POLL_ENV, raw)
    with pytest.raises(ValueError, match=rf"COSMOS_SANA_COMMAND_POLL_MS='{raw}'.*>= 1"):
        compat.patch_command_poll()
    assert RedisStreamConstant.CMD_READING_TIMEOUT_MS == 10_000


class Exited(Exception):
    def __init__(self, code: int) -> None:
        super().__init__(code)
        self.code = code


def _failing_worker(monkeypatch):
    import cosmos_rl.launcher.worker_entry as worker_entry

    def boom(**kwargs):
        raise RuntimeError("dataset sample 3 is broken")

    def fake_exit(code):
        raise Exited(code)

    monkeypatch.setattr(worker_entry, "main", boom)
    monkeypatch.setattr(compat.os, "_exit", fake_exit)


def test_failing_worker_stops_the_whole_launch(monkeypatch, caplog):
    monkeypatch.delenv(compat.WORKER_ERROR_ENV, raising=False)
    _failing_worker(monkeypatch)
    with caplog.at_level(logging.ERROR), pytest.raises(Exited) as exited:
        compat.run_worker_entry(dataset=None)
    assert exited.value.code == compat.worker_failure_exit_code() == 86
    assert "stopping the whole launch" in caplog.text and "dataset sample 3 is broken" in caplog.text


def test_failing_worker_can_keep_upstreams_behaviour(monkeypatch):
    monkeypatch.setenv(compat.WORKER_ERROR_ENV, "wait")
    _failing_worker(monkeypatch)
    with pytest.raises(RuntimeError, match="sample 3"):
        compat.run_worker_entry(dataset=None)


def test_unknown_worker_error_policy_is_refused(monkeypatch):
    monkeypatch.setenv(compat.WORKER_ERROR_ENV, "retry")
    _failing_worker(monkeypatch)
    with pytest.raises(ValueError, match="COSMOS_SANA_ON_WORKER_ERROR='retry': use 'stop'"):
        compat.run_worker_entry(dataset=None)
