"""``cosmos-sana reward-server``: serve rewards over cosmos-rl's remote reward protocol.

Point cosmos-rl at it with ``use_remote_reward = true`` and
``REMOTE_REWARD_ENQUEUE_URL=http://HOST:PORT/api/reward/enqueue``,
``REMOTE_REWARD_FETCH_URL=http://HOST:PORT/api/reward/pull``, ``REMOTE_REWARD_TOKEN``.
"""

from __future__ import annotations

import argparse
import sys

HELP = "serve rewards over cosmos-rl's remote reward protocol (FastAPI/uvicorn)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--host", default="127.0.0.1", help="bind address (default: loopback only)")
    parser.add_argument("--port", type=int, default=8080)
    parser.add_argument("--reward", action="append", default=[], metavar="NAME", help="a reward to serve (repeatable)")
    parser.add_argument("--reward-args", action="append", default=[], metavar="NAME:JSON", help="a reward's args")
    parser.add_argument("--config", metavar="RECIPE.toml", help="serve a recipe's [[custom.rewards]] instead")
    parser.add_argument("--device", default="cpu", help="scoring device, e.g. cuda:0 (default: cpu)")
    parser.add_argument("--workers", type=int, default=None, help="scoring threads (default: reward_runtime.workers)")
    parser.add_argument("--token-env", default="REMOTE_REWARD_TOKEN", help="variable holding the bearer token")
    parser.add_argument("--token-file", help="file holding the bearer token (wins over --token-env)")
    parser.add_argument("--no-auth", action="store_true", help="accept requests without a token (trusted networks only)")


def build_app(args: argparse.Namespace) -> object:
    """The FastAPI app for these arguments (raises on bad arguments)."""
    from cosmos_sana.plugin_manager import installed_plugins
    from cosmos_sana.rewards.protocol import load_token
    from cosmos_sana.rewards.scheduler import RewardScheduler
    from cosmos_sana.rewards.scorers import ScorerSet
    from cosmos_sana.rewards.selection import SelectionError, select_rewards
    from cosmos_sana.rewards.server import create_app

    token = None if args.no_auth else load_token(args.token_env, args.token_file)
    if token is None and not args.no_auth:
        raise SelectionError(f"no bearer token: set ${args.token_env}, give --token-file, or pass --no-auth")
    refs, runtime = select_rewards(args.reward, args.reward_args, args.config)
    scheduler = RewardScheduler(
        ScorerSet.build(refs, installed_plugins(), device=args.device),
        workers=args.workers or runtime.workers, retries=runtime.retries, timeout_s=runtime.timeout_s,
        fail_fast=False,
    )
    return create_app(scheduler, token)


def run(args: argparse.Namespace) -> int:
    import uvicorn

    from cosmos_sana.log import get_logger
    from cosmos_sana.rewards.server import ENQUEUE_PATH, PULL_PATH

    try:
        app = build_app(args)
    except (ValueError, KeyError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    base = f"http://{args.host}:{args.port}"
    get_logger(__name__).info("serving rewards: enqueue %s%s, pull %s%s", base, ENQUEUE_PATH, base, PULL_PATH)
    uvicorn.run(app, host=args.host, port=args.port, log_level="info")
    return 0
