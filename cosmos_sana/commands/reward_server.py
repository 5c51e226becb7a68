"""``cosmos-sana reward-server``: serve rewards over cosmos-rl's remote reward protocol.

Point cosmos-rl at it with ``use_remote_reward = true`` and
``REMOTE_REWARD_ENQUEUE_URL=http://HOST:PORT/api/reward/enqueue``,
``REMOTE_REWARD_FETCH_URL=http://HOST:PORT/api/reward/pull``, ``REMOTE_REWARD_TOKEN``.
"""

from __future__ import annotations

import argparse
import sys

from cosmos_sana.commands.arg_types import device

HELP = "serve rewards over cosmos-rl's remote reward protocol (FastAPI/uvicorn)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--host", default="127.0.0.1", help="bind address (default: loopback only)")
    parser.add_argument("--port", type=int, default=8080)
    parser.add_argument("--reward", action="append", default=[], metavar="NAME", help="a reward to serve (repeatable)")
    parser.add_argument("--reward-args", action="append", default=[], metavar="NAME:JSON", help="a reward's args")
    parser.add_argument("--config", metavar="RECIPE.toml", help="serve a recipe's [[custom.rewards]] instead")
    parser.add_argument("--device", type=device, default="cpu", help="scoring device, e.g. cuda:0 (default: cpu)")
    parser.add_argument("--workers", type=int, default=None, help="scoring threads (default: reward_runtime.workers)")
    parser.add_argument("--token-env", default="REMOTE_REWARD_TOKEN", help="variable holding the bearer token")
    parser.add_argument("--token-file", help="file holding the bearer token (wins over --token-env)")
    parser.add_argument("--no-auth", action="store_true", help="accept requests without a token (loopback only)")
    parser.add_argument(
        "--insecure", action="store_true",
        help="with --no-auth, also allow a non-loopback --host: anyone who can reach it may use the server",
    )
    parser.add_argument(
        "--max-request-mb", type=float, default=None, metavar="MB",
        help="refuse request bodies larger than this with HTTP 413 (default: 1024)",
    )


def build_app(args: argparse.Namespace) -> object:
    """The FastAPI app for these arguments (raises on bad arguments)."""
    from cosmos_sana.log import get_logger
    from cosmos_sana.plugin_manager import installed_plugins
    from cosmos_sana.rewards.protocol import load_token
    from cosmos_sana.rewards.scheduler import RewardScheduler
    from cosmos_sana.rewards.scorers import ScorerSet
    from cosmos_sana.rewards.selection import SelectionError, select_rewards
    from cosmos_sana.rewards.server import DEFAULT_MAX_BODY_MB, create_app

    logger = get_logger(__name__)
    token = None if args.no_auth else load_token(args.token_env, args.token_file)
    if token is None and not args.no_auth:
        raise SelectionError(f"no bearer token: set ${args.token_env}, give --token-file, or pass --no-auth")
    if args.no_auth and not is_loopback(args.host):
        if not args.insecure:
            raise SelectionError(
                f"--no-auth with --host {args.host} lets anyone who reaches this address run the scorers: "
                "serve on 127.0.0.1, set a token, or add --insecure to accept that"
            )
        logger.warning("INSECURE: no authentication on %s:%s — anyone who can reach it may submit work",
                       args.host, args.port)
    max_mb = DEFAULT_MAX_BODY_MB if args.max_request_mb is None else args.max_request_mb
    if not max_mb > 0:
        raise SelectionError(f"--max-request-mb must be positive, got {args.max_request_mb}")
    refs, runtime = select_rewards(args.reward, args.reward_args, args.config)
    scheduler = RewardScheduler(
        ScorerSet.build(refs, installed_plugins(), device=args.device),
        workers=args.workers or runtime.workers, retries=runtime.retries, timeout_s=runtime.timeout_s,
        fail_fast=False,
    )
    return create_app(scheduler, token, max_body_bytes=int(max_mb * 2**20))


def is_loopback(host: str) -> bool:
    """Whether ``host`` is reachable from this machine only (127.0.0.0/8, ::1, localhost)."""
    import ipaddress

    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:  # a host name other than localhost may resolve anywhere
        return False


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
