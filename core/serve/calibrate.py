"""The `calibrate` command of `llm-ensembling`: member trust for the ensemble a server loads.

It builds the ensemble exactly as `serve` would (the same `--config` file and flags), runs
`Ensemble.calibrate` (the built-in prompts, or `--prompts` like the server's traffic) and writes
what it measured where `serve --weights` (or the config file's `weights`) reads it. Measured
once, before serving: a server starts without minutes of calibration, and every replica loads
the same weights, so their answers agree. Free of the server libraries.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from pathlib import Path
from typing import Any

from ..calibration import MAX_NEW_TOKENS
from ..cli_options import add_member_flags, add_option_flags, ensemble_flags
from ..errors import InvalidConfigError
from ..options import GROUPS, Options
from .settings import SERVE_DEFAULTS, build_settings, read_config


def calibrate(args: argparse.Namespace) -> int:
    config = read_config(args.config) if args.config else None
    spec = build_settings(config, ensemble=ensemble_flags(args, GROUPS)).ensemble
    out = args.out or spec.weights
    if out is None:
        raise InvalidConfigError(
            "calibrate needs where to write the trust: --out trust.json, or weights = "
            '"trust.json" in the --config file (which serve then loads).'
        )
    prompts = read_prompts(args.prompts) if args.prompts else None
    # what a weights file or the built-in self-preference would set, calibration replaces
    settings = Options({**spec.settings, "self_preference": "off"})
    ensemble = dataclasses.replace(spec, weights=None, settings=settings).load()
    weights = ensemble.calibrate(prompts, max_new_tokens=args.max_new_tokens)
    saved = ensemble.save_weights(out)
    report = {
        "weights": weights,
        "self_preference": ensemble.summary().get("self_preference"),
        "saved": str(saved),
    }
    print(json.dumps(report, indent=2))
    return 0


def read_prompts(path: str) -> list[Any]:
    """Calibration prompts from a file: one JSON value per line in a `.jsonl` file (a string,
    or a list of chat messages), otherwise one plain-text prompt per line; blank lines are
    skipped."""
    try:
        lines = Path(path).read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as error:
        raise InvalidConfigError(f"cannot read --prompts {path!r}: {error}.") from None
    prompts: list[Any] = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        if not path.endswith(".jsonl"):
            prompts.append(line.strip())
            continue
        try:
            prompts.append(json.loads(line))
        except json.JSONDecodeError as error:
            raise InvalidConfigError(
                f"--prompts {path!r}, line {number}: not JSON ({error.msg}); write one JSON "
                'string or message list per line, e.g. "What is 2 + 3?".'
            ) from None
    if not prompts:
        raise InvalidConfigError(f"--prompts {path!r} holds no prompt.")
    return prompts


def add_command(sub) -> None:
    p = sub.add_parser(
        "calibrate",
        help="measure member trust (weights, self-preference) for the ensemble serve loads, "
        "and write it for serve --weights",
    )
    p.add_argument("--config", default=None, help="ensemble.toml: the members, method, options")
    add_member_flags(p)
    p.add_argument(
        "--prompts",
        default=None,
        help="prompts like the traffic: one per line, or a .jsonl file of JSON strings or "
        "message lists (default: the built-in set)",
    )
    p.add_argument(
        "--max-new-tokens", type=int, default=MAX_NEW_TOKENS, help="each member's answer"
    )
    p.add_argument(
        "--out", default=None, help="where to write the trust (default: the config's weights)"
    )
    add_option_flags(p, GROUPS, SERVE_DEFAULTS)
    p.set_defaults(func=calibrate)
