"""The `serve` command of `llm-ensembling`: its arguments, and the server it starts. Free of
the server libraries until the server starts, so the CLI loads without the serve extra."""

from __future__ import annotations

import argparse

from ..cli_options import add_member_flags, add_option_flags, ensemble_flags
from ..errors import InvalidConfigError
from ..options import GROUPS
from .settings import SERVE_DEFAULTS, ServeSettings, build_settings, read_config

_LIMITS = (
    "max_body_bytes", "max_messages", "max_tools", "max_schema_bytes", "max_tokens", "max_stop",
)  # fmt: skip


def serve(args: argparse.Namespace) -> int:
    settings = serve_settings(args)
    try:
        from .runner import run
    except ImportError as error:
        raise InvalidConfigError(
            f"serve needs the serve extra ({error.name} is missing): "
            "pip install 'llm-ensembling[serve]'."
        ) from None
    return run(settings)


def serve_settings(args: argparse.Namespace) -> ServeSettings:
    """The server's settings: the --config file's, with the flags given over them."""
    return build_settings(
        read_config(args.config) if args.config else None,
        ensemble={**ensemble_flags(args, GROUPS), "weights": args.weights},
        server={
            "host": args.host,
            "port": args.port,
            "names": args.name or None,
            "api_key_file": args.api_key_file,
            "grace_seconds": args.grace,
            "log_level": args.log_level,
            "threads": args.threads,
            "header_timeout": args.header_timeout,
            "body_timeout": args.body_timeout,
            "stream_interval": args.stream_interval,
        },
        limits={name: getattr(args, name) for name in _LIMITS},
        api_keys=args.api_key,
    )


def add_command(sub) -> None:
    p = sub.add_parser(
        "serve",
        help="serve the ensemble as one OpenAI-compatible model over HTTP (needs the serve extra)",
    )
    p.add_argument("--config", default=None, help="ensemble.toml: members, method, options, ...")
    add_member_flags(p)
    p.add_argument(
        "--weights",
        default=None,
        help="member weights (and self-preference) that Ensemble.save_weights wrote after "
        "calibrate(), loaded frozen",
    )
    p.add_argument("--host", default=None, help="default 127.0.0.1 (others need a key)")
    p.add_argument("--port", type=int, default=None, help="default 8000")
    p.add_argument("--name", action="append", default=[], help="served model name (repeat)")
    p.add_argument(
        "--api-key",
        action="append",
        default=[],
        help="a key clients send as a bearer token (repeat); also LLM_ENSEMBLING_API_KEY",
    )
    p.add_argument("--api-key-file", default=None, help="keys, one per line")
    p.add_argument("--grace", type=float, default=None, help="seconds to drain on SIGTERM")
    p.add_argument("--log-level", default=None, choices=["debug", "info", "warning", "error"])
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    p.add_argument(
        "--header-timeout", type=float, default=None, help="seconds to send headers (10)"
    )
    p.add_argument("--body-timeout", type=float, default=None, help="seconds to send a body (30)")
    p.add_argument(
        "--stream-interval",
        type=int,
        default=None,
        help="deltas per streamed chunk (1: each as it comes; the first and last go at once)",
    )
    for name in _LIMITS:
        p.add_argument("--" + name.replace("_", "-"), type=int, default=None)
    add_option_flags(p, GROUPS, SERVE_DEFAULTS)
    p.set_defaults(func=serve)
