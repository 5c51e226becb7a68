"""Our commands hide other packages' known-harmless start-up messages (``-v`` shows them) and nothing else."""

from __future__ import annotations

import io
import logging
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

from cosmos_sana import log

REPO = Path(__file__).resolve().parents[1]
TINY_NFT = REPO / "toml" / "tiny" / "sana-image-nft.toml"


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "cosmos_sana.cli", *args], cwd=REPO,
                          capture_output=True, text=True, timeout=300)


def test_validate_of_a_valid_recipe_prints_at_most_two_lines(tiny_image_pipeline_dir: Path) -> None:
    model = f'policy.model_name_or_path="{tiny_image_pipeline_dir}"'
    quiet = cli("validate", str(TINY_NFT), "--set", model)
    assert quiet.returncode == 0, quiet.stderr
    lines = (quiet.stdout + quiet.stderr).splitlines()
    assert len(lines) <= 2 and lines[0] == f"{TINY_NFT}: OK", lines
    loud = cli("validate", "-v", str(TINY_NFT), "--set", model)  # -v shows what was hidden
    assert loud.returncode == 0 and f"{TINY_NFT}: OK" in loud.stdout
    assert "top_k is not set for distillation" in loud.stderr, loud.stderr


def test_an_invalid_recipe_still_reports_every_problem_on_stderr(tmp_path: Path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text(TINY_NFT.read_text().replace("timesteps_fraction = 0.6", "timestep_fraction = 0.6"))
    out = cli("validate", "--no-path-check", str(bad))
    assert out.returncode == 1 and out.stdout == ""
    lines = out.stderr.splitlines()
    assert any("timestep_fraction" in line and "timesteps_fraction" in line for line in lines), lines
    assert lines[-1] == f"{bad}: INVALID (1 issue)" and len(lines) == 2, lines


@pytest.fixture
def capture():
    """``capture(name)``: a logger and the messages its records reach handlers with."""
    added: list[tuple[logging.Logger, logging.Handler]] = []

    def attach(name: str) -> tuple[logging.Logger, list[str]]:
        seen: list[str] = []
        handler = logging.Handler()
        handler.emit = lambda record: seen.append(record.getMessage())  # type: ignore[method-assign]
        logger = logging.getLogger(name)
        logger.addHandler(handler)
        added.append((logger, handler))
        return logger, seen

    yield attach
    for logger, handler in added:
        logger.removeHandler(handler)


def test_only_the_listed_records_are_dropped(capture) -> None:
    log.quiet_third_party()
    log.quiet_third_party()  # idempotent: one filter per logger
    cosmos, seen = capture("cosmos")
    assert sum(isinstance(f, log.MessageFilter) for f in cosmos.filters) == 1
    cosmos.error("Failed to import VLLM Rollout. Please make sure vllm is installed. Error: No module named 'vllm'")
    cosmos.warning("top_k is not set for distillation, so trainer_token_ids_from_teacher is set to False.")
    for row in ("model_part | optimizer_cls | lr   | num_parameters | num_trainable_parameters | status   ",
                "-----------+---------------+------+----------------+--------------------------+----------",
                "part_1     | AdamW         | 0.01 | 70468          | 0                        | FROZEN   "):
        cosmos.warning(row)  # cosmos-rl's optimizer table (logged at INFO; the level does not matter here)
    cosmos.error("Rollout failed: CUDA out of memory")  # a real problem of the same package
    cosmos.warning("Config checked successfully, 2 warnings")  # not the exact harmless line
    assert seen == ["Rollout failed: CUDA out of memory", "Config checked successfully, 2 warnings"]
    ours, ours_seen = capture("cosmos_sana.quiet_test")
    ours.error("Failed to import VLLM Rollout")  # our own records are never filtered
    assert ours_seen == ["Failed to import VLLM Rollout"]


def test_harmless_warning_patterns_match_only_their_warnings() -> None:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for category, pattern in log.HARMLESS_WARNINGS:  # as quiet_third_party installs them
            warnings.filterwarnings("ignore", message=pattern, category=category)
        warnings.warn("The pynvml package is deprecated. Please install nvidia-ml-py instead.", FutureWarning)
        warnings.warn("Already found a `peft_config` attribute in the model. This will lead to ...", UserWarning)
        warnings.warn("The pynvml package is deprecated.", UserWarning)  # another category: shown
        warnings.warn("peft_config missing", UserWarning)
    assert [str(w.message) for w in caught] == ["The pynvml package is deprecated.", "peft_config missing"]


def test_chatty_imports_print_nothing(tmp_path: Path, monkeypatch, capsys) -> None:
    (tmp_path / "chatty_pkg").mkdir()
    (tmp_path / "chatty_pkg" / "__init__.py").write_text("print('Auto-discovering ...')\nVALUE = 42\n")
    (tmp_path / "other_chatty.py").write_text("print('not on the list')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(log, "CHATTY_IMPORTS", frozenset({"chatty_pkg"}))
    finder = log._SilentImportFinder()
    monkeypatch.setattr(sys, "meta_path", [finder, *sys.meta_path])
    for name in ("chatty_pkg", "other_chatty"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    import chatty_pkg  # noqa: F401
    import other_chatty  # noqa: F401

    assert chatty_pkg.VALUE == 42
    assert "VALUE = 42" in chatty_pkg.__spec__.loader.get_source("chatty_pkg")  # the real loader's other methods
    assert capsys.readouterr().out == "not on the list\n"


@pytest.mark.parametrize(("argv", "verbose"), [
    (["validate", "x.toml"], False), (["-v", "validate", "x.toml"], True), (["validate", "--verbose", "x"], True),
    (["run", "x.toml", "--", "-v"], False),
])
def test_verbose_flag_is_read_before_the_command(argv: list[str], verbose: bool) -> None:
    from cosmos_sana.cli import build_parser, wants_verbose

    assert wants_verbose(argv) is verbose
    if argv[0] != "run":  # the parser takes -v before and after the command name
        assert build_parser(argv).parse_args(argv).verbose is verbose


def test_our_log_lines_go_above_an_open_progress_bar() -> None:
    from tqdm import tqdm

    stream = io.StringIO()
    handler = log.ProgressAwareHandler(stream)
    handler.setFormatter(logging.Formatter("%(message)s"))

    def emit(message: str) -> None:
        handler.emit(logging.LogRecord("cosmos_sana.t", logging.INFO, __file__, 1, message, None, None))

    bar = tqdm(total=2, file=stream, desc="train", mininterval=0)
    bar.update(1)
    emit("saved checkpoint")
    bar.close()
    text = stream.getvalue()
    # the bar's line is cleared (carriage return) before the message, which ends its own line
    assert "\rsaved checkpoint\n" in text and "1/2" in text.split("saved checkpoint")[0]
    emit("after the bar")
    assert stream.getvalue().endswith("\nafter the bar\n")
