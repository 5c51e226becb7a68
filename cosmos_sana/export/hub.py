"""``export --push-to-hub REPO``: upload a finished export folder (model card included) to the Hugging Face Hub."""

from __future__ import annotations

import os
from pathlib import Path


class HubPushError(RuntimeError):
    """The export cannot be (or was not) uploaded; the message says why and what to do."""


def hub_offline() -> bool:
    """``HF_HUB_OFFLINE`` as huggingface_hub read it at import, or as the environment says now."""
    from huggingface_hub import constants

    return bool(constants.HF_HUB_OFFLINE) or os.environ.get("HF_HUB_OFFLINE", "").upper() in ("1", "ON", "YES", "TRUE")


def check_can_push(repo: str) -> None:
    """Refuse before any work: a malformed repo id, or offline mode."""
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    try:
        validate_repo_id(repo)
    except HFValidationError as exc:
        raise HubPushError(f"--push-to-hub {repo!r}: not a Hub repo id 'owner/name' ({exc})") from exc
    if hub_offline():
        raise HubPushError(
            f"--push-to-hub {repo}: HF_HUB_OFFLINE is set, so the Hub cannot be reached; unset it and log in "
            "(`huggingface-cli login` or HF_TOKEN) to push"
        )


def push_to_hub(folder: Path, repo: str, *, public: bool = False) -> str:
    """Create ``repo`` (a model repo; private unless ``public``, since the manifest names local
    paths and the run's settings) if needed and upload ``folder``; returns the commit URL. An
    existing repo keeps its visibility."""
    from huggingface_hub import HfApi
    from huggingface_hub.errors import HfHubHTTPError

    check_can_push(repo)
    api = HfApi()
    try:
        api.create_repo(repo, repo_type="model", exist_ok=True, private=not public)
        commit = api.upload_folder(folder_path=str(folder), repo_id=repo, repo_type="model",
                                   commit_message=f"cosmos-sana export {folder.name}")
    except (HfHubHTTPError, OSError, ValueError) as exc:  # network, auth, permission, offline
        raise HubPushError(f"--push-to-hub {repo}: upload failed ({type(exc).__name__}: {exc})") from exc
    return str(commit.commit_url)
