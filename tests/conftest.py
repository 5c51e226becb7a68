"""Shared test configuration. Area fixtures live in ``tests/fixtures_<area>.py``."""

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("WANDB_MODE", "disabled")

pytest_plugins: list[str] = ["fixtures_plugins", "fixtures_tiny", "fixtures_data", "fixtures_rewards", "fixtures_checkpoint", "fixtures_trainers", "fixtures_faults"]
