"""`llm-ensembling demo | generate | bench | soak | serve`."""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from collections.abc import Sequence

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
    from .bench import _literal

    options = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep:
            raise InvalidConfigError(f"--option {pair!r}: use key=value, e.g. aggregator=gac.")
        options[key] = _literal(value)
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


def _command(args: argparse.Namespace) -> str:
    return "llm-ensembling " + " ".join(shlex.quote(a) for a in args.argv)


def _members_and_setups(args: argparse.Namespace):
    """The loaded members and one setup per method at its default options (plus --config), for
    the benchmarks that compare methods under load, grammar or tools."""
    from .bench import load_members, method_setups

    if args.remote:
        raise InvalidConfigError(
            "--remote compares served models in the accuracy/speed table only; drop it with "
            "--concurrency, --grammar-cost or --form tool."
        )
    if args.temperature:
        raise InvalidConfigError(
            "--concurrency, --grammar-cost and --form tool compare texts and answers of greedy "
            "requests; drop --temperature."
        )
    methods = [m for m in args.methods.split(",") if m]
    if args.aggregator is not None:
        raise InvalidConfigError(
            "--aggregator expands the accuracy/speed table's configurations; with "
            "--concurrency, --grammar-cost or --form tool each method runs at its default "
            "options: add others with --config label=method:aggregator=gac."
        )
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    members = load_members(args.model, args.device, args.dtype, args.shape, args.ignore_stop)
    names = [m.name for m in members]
    return members, method_setups(methods, len(members), args.config, names)


def _bench_concurrency(args: argparse.Namespace) -> None:
    from . import bench_concurrency
    from .bench import load_task

    levels = bench_concurrency.parse_levels(args.concurrency)
    task = load_task(args.task, args.n, args.seed, args.form)
    members, setups = _members_and_setups(args)
    result = bench_concurrency.run(
        members=members,
        setups=setups,
        items=[messages for messages, _ in task.items],
        task=task.name,
        levels=levels,
        max_new_tokens=args.max_new_tokens,
        out=args.out,
        command=_command(args),
    )
    print(args.out.rstrip("/") + "/results.md")
    print(bench_concurrency.markdown(result))


def _bench_grammar(args: argparse.Namespace) -> None:
    from . import bench_grammar
    from .bench import load_task

    task = load_task(args.task, args.n, args.seed, args.form)
    members, setups = _members_and_setups(args)
    result = bench_grammar.run(
        members=members,
        setups=setups,
        items=[messages for messages, _ in task.items],
        task=task.name,
        max_new_tokens=args.max_new_tokens,
        out=args.out,
        command=_command(args),
    )
    print(args.out.rstrip("/") + "/results.md")
    print(bench_grammar.markdown(result))


def _bench_tools(args: argparse.Namespace) -> None:
    from . import bench_tools

    if args.task != "arithmetic":
        raise InvalidConfigError(
            "--form tool runs the testbed's tool problems; drop --task (a JSONL file has no "
            "tools to offer)."
        )
    task = bench_tools.testbed_tool_task(args.n, args.seed)
    methods = [m for m in args.methods.split(",") if m]
    members, _ = _members_and_setups(args)
    result = bench_tools.run(
        members=members,
        setups=bench_tools.tool_setups(methods, [m.name for m in members], args.config),
        task=task,
        max_new_tokens=args.max_new_tokens,
        out=args.out,
        command=_command(args),
    )
    print(args.out.rstrip("/") + "/results.md")
    print(bench_tools.markdown(result))


def bench(args: argparse.Namespace) -> None:
    from .bench import markdown_table, parse_setups, run

    if args.concurrency and args.grammar_cost:
        raise InvalidConfigError("--concurrency and --grammar-cost are two runs; pick one.")
    if args.concurrency:
        return _bench_concurrency(args)
    if args.grammar_cost:
        return _bench_grammar(args)
    if args.form == "tool":
        return _bench_tools(args)
    methods = [m for m in args.methods.split(",") if m]
    aggregators = [a for a in (args.aggregator or "unite,gac").split(",") if a]

    def setups_from(names: list[str]):
        return parse_setups(methods, aggregators, len(names), args.config, names)

    result = run(
        setups_from=setups_from,
        models=args.model,
        task=args.task,
        form=args.form,
        n=args.n,
        seed=args.seed,
        max_new_tokens=args.max_new_tokens,
        out=args.out,
        device=args.device,
        dtype=args.dtype,
        shape=args.shape,
        threads=args.threads,
        temperature=args.temperature,
        ignore_stop=args.ignore_stop,
        remote=args.remote,
        command=_command(args),
    )
    print(args.out.rstrip("/") + "/results.md")
    print(markdown_table(result["rows"], with_accuracy=args.shape is None))


def soak(args: argparse.Namespace) -> None:
    from . import bench_soak
    from .bench import load_members, load_task, method_setups

    for name in ("requests", "workers", "tasks", "window", "problems"):
        if getattr(args, name) < 1:
            raise InvalidConfigError(f"--{name} must be at least 1, got {getattr(args, name)}.")
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    task = load_task("arithmetic", args.problems, args.seed)
    members = load_members(args.model, args.device, args.dtype)
    names = [m.name for m in members]
    methods = [m for m in args.methods.split(",") if m]
    result = bench_soak.run(
        members=members,
        models=args.model,
        setups=method_setups(methods, len(members), args.config, names),
        problems=[messages for messages, _ in task.items],
        requests=args.requests,
        threads=args.workers,
        tasks=args.tasks,
        window=args.window,
        max_new_tokens=args.max_new_tokens,
        seed=args.seed,
        device=args.device,
        dtype=args.dtype,
        out=args.out,
        command=_command(args),
    )
    print(args.out.rstrip("/") + "/results.md")
    print(bench_soak.markdown(result))
    if result["mismatches"] or result["held_slots"]:
        raise EnsembleError(
            f"soak: {result['mismatches']} answers differ from a fresh ensemble's and "
            f"{result['held_slots']} request slots are still held; see {args.out}/results.md."
        )


def serve(args: argparse.Namespace) -> int:
    from .serve.settings import build_settings, read_config

    settings = build_settings(
        read_config(args.config) if args.config else None,
        ensemble={
            "members": args.model or None,
            "method": args.method,
            "options": _options(args.option) or None,
            "device": args.device,
            "dtype": args.dtype,
            "on_member_failure": args.on_member_failure,
            "max_concurrency": args.max_concurrency,
            "max_queue": args.max_queue,
            "queue_timeout": args.queue_timeout,
        },
        server={
            "host": args.host,
            "port": args.port,
            "names": args.name or None,
            "api_key_file": args.api_key_file,
            "grace_seconds": args.grace,
            "log_level": args.log_level,
            "threads": args.threads,
        },
        limits={name: getattr(args, name) for name in _SERVE_LIMITS},
        api_keys=args.api_key,
    )
    try:
        from .serve.runner import run as run_server
    except ImportError as error:
        raise InvalidConfigError(
            f"serve needs the serve extra ({error.name} is missing): "
            "pip install 'llm-ensembling[serve]'."
        ) from None
    return run_server(settings)


_SERVE_LIMITS = (
    "max_body_bytes", "max_messages", "max_tools", "max_schema_bytes", "max_tokens", "max_stop",
)  # fmt: skip


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

    p = sub.add_parser("bench", help="measure methods side by side in one run")
    p.add_argument("--methods", default="single,token,safe,specem")
    p.add_argument("--aggregator", default=None, help="for token and safe (default: unite,gac)")
    p.add_argument("--config", action="append", default=[], help="label=method:key=value,...")
    p.add_argument("--model", action="append", default=None, help="member (default: shipped)")
    p.add_argument(
        "--task",
        default="arithmetic",
        help='\'arithmetic\' or a JSONL file of {"prompt": ..., "answer": ...} lines, scored by '
        "the FINAL answer compared exactly: the number, the multiple-choice letter or the text "
        "after the last 'The answer is'/'Answer:' (else the last number or the final line)",
    )
    p.add_argument(
        "--form",
        default="cot",
        choices=["cot", "rag", "tool"],
        help="tool: each single model and method on tool-use problems (right tool, arguments "
        "and final answer; schema-valid calls with the grammar and with the prompt only)",
    )
    p.add_argument("--n", type=int, default=200)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--max-new-tokens", type=int, default=160)
    p.add_argument("--out", default="bench-out")
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", default="auto")
    p.add_argument(
        "--shape", default=None, help="tiny|testbed|1b|3b: random weights of these shapes"
    )
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    p.add_argument("--temperature", type=float, default=0.0, help="> 0: seeded sampling")
    p.add_argument(
        "--ignore-stop", action="store_true", help="never stop early (fixed-length speed runs)"
    )
    p.add_argument(
        "--remote",
        action="append",
        default=[],
        help="a vLLM server's URL serving the n-th model (repeat per model): every "
        "configuration also runs with its members on the servers, in the same run",
    )
    p.add_argument(
        "--concurrency",
        default=None,
        metavar="LEVELS",
        help="e.g. 1,2,4,8,16: every method (default options) at each number of concurrent "
        "requests, against the same requests one at a time (tokens/s, latency, same text)",
    )
    p.add_argument(
        "--grammar-cost",
        action="store_true",
        help="every method (default options) with and without a grammar that allows any text "
        "(tools, tool_choice none): time per output token side by side, same text",
    )
    p.set_defaults(func=bench)

    p = sub.add_parser(
        "soak",
        help="many requests of every kind (threads, asyncio, abandoned and cancelled streams, "
        "injected member failures): memory, latency and answers over time",
    )
    p.add_argument("--requests", type=int, default=1000)
    p.add_argument("--methods", default="single,token,safe,specem")
    p.add_argument("--config", action="append", default=[], help="label=method:key=value,...")
    p.add_argument("--model", action="append", default=None, help="member (default: shipped)")
    p.add_argument("--workers", type=int, default=6, help="request threads")
    p.add_argument("--tasks", type=int, default=6, help="asyncio tasks at once")
    p.add_argument("--window", type=int, default=100, help="requests per measurement")
    p.add_argument("--problems", type=int, default=24, help="distinct held-out problems")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--max-new-tokens", type=int, default=48)
    p.add_argument("--out", default="bench-out/soak")
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", default="auto")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    p.set_defaults(func=soak)

    p = sub.add_parser(
        "serve",
        help="serve the ensemble as one OpenAI-compatible model over HTTP (needs the serve extra)",
    )
    p.add_argument("--config", default=None, help="ensemble.toml: members, method, options, ...")
    p.add_argument("--model", action="append", default=[], help="repeat for each member")
    p.add_argument("--method", default=None, help="safe | specem | token | single")
    p.add_argument("--option", action="append", default=[], help="method option key=value")
    p.add_argument("--device", default=None)
    p.add_argument("--dtype", default=None)
    p.add_argument("--on-member-failure", default=None, choices=["raise", "drop"])
    p.add_argument("--max-concurrency", type=int, default=None)
    p.add_argument("--max-queue", type=int, default=None)
    p.add_argument("--queue-timeout", type=float, default=None, help="seconds; then 429")
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
    for name in _SERVE_LIMITS:
        p.add_argument("--" + name.replace("_", "-"), type=int, default=None)
    p.set_defaults(func=serve)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(argv)
    args.argv = argv
    try:
        return int(args.func(args) or 0)
    except EnsembleError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
