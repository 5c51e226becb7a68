"""Counts for the fault-injection suite (``tests/test_fault_injection_*.py``), shown after the run.

Each case is marked ``@pytest.mark.fault(kind)``: ``"refused"`` (the bad input stops with an error
naming the file, key or sample) or ``"contained"`` (the input is used but made harmless: a secret
kept out of output, a request answered 413, a non-finite step skipped and counted). A case marked
``guards_data=True`` also asserts that nothing already written is lost. A failing case is a silent
acceptance (and, if it guards data, possible data loss). ``docs/reliability.md`` tables these counts.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest

FAULT_KINDS = ("refused", "contained")
_counts: dict[str, Counter] = {}


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "fault(kind, guards_data=False): a fault-injection case; kind is 'refused' or 'contained'"
    )


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: Any) -> Any:
    outcome = yield
    report = outcome.get_result()
    marker = item.get_closest_marker("fault")
    if marker is None or report.skipped or report.when != "call" and not (report.when == "setup" and report.failed):
        return
    kind = marker.args[0] if marker.args else marker.kwargs.get("kind")
    if kind not in FAULT_KINDS:
        raise pytest.UsageError(f"{item.nodeid}: fault kind must be one of {FAULT_KINDS}, got {kind!r}")
    area = item.path.stem.removeprefix("test_fault_injection_")
    for counts in (_counts.setdefault(area, Counter()), _counts.setdefault("all", Counter())):
        counts["cases"] += 1
        if report.passed:
            counts[kind] += 1
        else:
            counts["silent"] += 1
            counts["data_lost"] += bool(marker.kwargs.get("guards_data"))


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if "all" not in _counts:
        return
    columns = ("cases", "refused", "contained", "silent", "data_lost")
    terminalreporter.write_line(
        "fault injection (refused = clear error; silent = silent acceptance or unclear error; "
        "data_lost = a failed case that guards existing data)"
    )
    terminalreporter.write_line(f"  {'area':<12}" + "".join(f"{c:>11}" for c in columns))
    for area in sorted(_counts, key=lambda a: (a == "all", a)):
        terminalreporter.write_line(f"  {area:<12}" + "".join(f"{_counts[area][c]:>11}" for c in columns))
