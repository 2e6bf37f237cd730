"""`llm-ensembling demo | generate | bench | soak`: argument parsing, then one call into the
engine (demo, generate) or into the benchmarks (`core.bench.commands`)."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence

from .bench.commands import add_commands
from .errors import EnsembleError, InvalidConfigError


def _available_methods() -> list[str]:
    from .methods import METHOD_NAMES, method_class

    available = []
    for name in METHOD_NAMES:
        try:
            method_class(name)
            available.append(name)
        except InvalidConfigError:
            pass
    return available


def _options(pairs: Sequence[str]) -> dict:
    from .bench.setups import parse_value

    options = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep:
            raise InvalidConfigError(f"--option {pair!r}: use key=value, e.g. aggregator=gac.")
        options[key] = parse_value(value)
    return options


def demo(args: argparse.Namespace) -> None:
    from tqdm.auto import tqdm

    from . import Ensemble, GenerationConfig, HFMember
    from .testbed import check_answer, make_problems, model_paths

    paths = model_paths()
    members = [
        HFMember.load(p, device="cpu") for p in tqdm(paths, desc="loading models", unit="model")
    ]
    print("members:", ", ".join(f"{i}: {m.name}" for i, m in enumerate(members)))
    methods = args.methods.split(",") if args.methods else _available_methods()
    setups = []
    for method in methods:
        if method == "single":
            setups += [(f"single {m.name}", Ensemble([m], "single")) for m in members]
        elif method == "token":  # the baseline as published, and the variant that holds up here
            setups.append(("token (UniTE as published)", Ensemble(members, "token")))
            setups.append(("token, first sub-token", Ensemble(members, "token", subtoken="first")))
        else:
            setups.append((method, Ensemble(members, method)))
    config = GenerationConfig(max_new_tokens=args.max_new_tokens)
    totals = {label: 0 for label, _ in setups}
    problems = make_problems(args.n, seed=args.seed, form="cot")
    for number, problem in enumerate(problems, 1):
        print(f"\n=== problem {number}: {problem.question}  (answer {problem.answer})")
        for label, ensemble in setups:
            out = ensemble.generate(problem.messages, config)
            ok = check_answer(out.text, problem)
            totals[label] += ok
            stats = out.stats
            per_token = 1000 * stats.seconds / max(stats.tokens, 1)
            print(f"--- {label}: {'right' if ok else 'wrong'}")
            print("   ", out.text.strip().replace("\n", "\n    "))
            print(
                f"    [{stats.tokens} tokens, E/T {100 * stats.ensemble_rate:.0f} %, "
                f"{per_token:.1f} ms/token]"
            )
    print("\naccuracy on these problems:")
    for label, right in totals.items():
        print(f"  {label:28s} {right}/{len(problems)}")


def generate(args: argparse.Namespace) -> None:
    from . import Ensemble, GenerationConfig

    if not args.model:
        raise InvalidConfigError("generate needs at least one --model (a directory or hub id).")
    ensemble = Ensemble.from_pretrained(
        args.model,
        args.method,
        device=args.device,
        dtype=args.dtype,
        progress=True,
        **_options(args.option),
    )
    config = GenerationConfig(
        max_new_tokens=args.max_new_tokens,
        stop=tuple(args.stop),
        temperature=args.temperature,
        top_p=args.top_p,
        seed=args.seed,
    )

    def show(event) -> None:
        print(json.dumps(event.to_dict()), file=sys.stderr)

    messages = [{"role": "user", "content": args.prompt}]
    if args.system:
        messages.insert(0, {"role": "system", "content": args.system})
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

    p = sub.add_parser("demo", help="the shipped tiny models on a few problems (offline, CPU)")
    p.add_argument("--methods", default="", help="comma-separated (default: all available)")
    p.add_argument("--n", type=int, default=3)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--max-new-tokens", type=int, default=120)
    p.set_defaults(func=demo)

    p = sub.add_parser("generate", help="stream one answer from an ensemble")
    p.add_argument("prompt")
    p.add_argument("--model", action="append", default=[], help="repeat for each member")
    p.add_argument("--method", default="safe")
    p.add_argument("--option", action="append", default=[], help="method option key=value")
    p.add_argument("--system", default="")
    p.add_argument("--max-new-tokens", type=int, default=256)
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--stop", action="append", default=[])
    p.add_argument("--device", default="auto")
    p.add_argument("--dtype", default="auto")
    p.add_argument("--events", action="store_true", help="print ensemble events to stderr")
    p.set_defaults(func=generate)

    add_commands(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(argv)
    args.argv = argv
    try:
        args.func(args)
    except EnsembleError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
