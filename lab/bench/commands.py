"""The `bench` and `soak` commands of `python -m lab`: their arguments, and the run each one
starts (the accuracy/speed table, concurrency, grammar cost, tool use, the soak)."""

from __future__ import annotations

import argparse
import shlex
from pathlib import Path

from core.errors import EnsembleError, InvalidConfigError

BENCH_METHODS = "single,token,safe,specem"  # what `bench` compares unless --methods says


def _command(args: argparse.Namespace) -> str:
    return "python -m lab " + " ".join(shlex.quote(a) for a in args.argv)


def _show(args: argparse.Namespace) -> None:
    """Where the run's results went, and its table as written there."""
    path = Path(args.out) / "results.md"
    print(path)
    print(path.read_text())


def _members_and_setups(args: argparse.Namespace):
    """The loaded members and one setup per method at its default options (plus --config), for
    the benchmarks that compare methods under load, grammar or tools."""
    from .setups import default_models, load_members, method_setups

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
    methods = [m for m in (args.methods or BENCH_METHODS).split(",") if m]
    if args.aggregator is not None:
        raise InvalidConfigError(
            "--aggregator expands the accuracy/speed table's configurations; with "
            "--concurrency, --grammar-cost or --form tool each method runs at its default "
            "options: add others with --config label=method:aggregator=gac."
        )
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    models = args.model or (None if args.shape else default_models(args.task))
    members = load_members(models, args.device, args.dtype, args.shape, args.ignore_stop)
    names = [m.name for m in members]
    return members, method_setups(methods, len(members), args.config, names)


def _run_on_task(args: argparse.Namespace, run, **extra) -> None:
    """One bench mode over the task's prompts and the members and setups the flags give (the
    arguments every such mode takes), then the results shown."""
    from .setups import load_task, without_generation

    task = load_task(args.task, args.n, args.seed, args.form)
    members, setups = _members_and_setups(args)
    run(
        members=members,
        setups=without_generation(setups),
        items=[messages for messages, _ in task.items],
        task=task.name,
        max_new_tokens=args.max_new_tokens,
        out=args.out,
        command=_command(args),
        **extra,
    )
    _show(args)


def _bench_concurrency(args: argparse.Namespace) -> None:
    from . import concurrency

    levels = concurrency.parse_levels(args.concurrency)
    _run_on_task(args, concurrency.run, levels=levels, prompt_tokens=args.prompt_tokens)


def _bench_grammar(args: argparse.Namespace) -> None:
    from . import grammar

    _run_on_task(args, grammar.run)


def _bench_tools(args: argparse.Namespace) -> None:
    from . import tools

    if args.task not in ("arithmetic", "real"):
        raise InvalidConfigError(
            "--form tool runs the tiny testbed's tool problems, or the real task's with --task "
            "real; a JSONL file has no tools to offer."
        )
    task = tools.testbed_tool_task(args.n, args.seed, real=args.task == "real")
    methods = [m for m in (args.methods or BENCH_METHODS).split(",") if m]
    members, _ = _members_and_setups(args)
    tools.run(
        members=members,
        setups=tools.tool_setups(methods, [m.name for m in members], args.config),
        task=task,
        max_new_tokens=args.max_new_tokens,
        out=args.out,
        command=_command(args),
    )
    _show(args)


def _bench_serve(args: argparse.Namespace) -> None:
    from . import serve
    from .concurrency import parse_levels
    from .setups import default_models

    if args.shape:
        raise InvalidConfigError(
            "--serve loads its members in a server process, which cannot build --shape's random "
            "weights; drop --shape (or compare shapes with --concurrency)."
        )
    levels = parse_levels(args.serve)
    intervals = _stream_intervals(args.stream_intervals)
    _run_on_task(
        args,
        serve.run_load,
        models=args.model or default_models(args.task),  # the members the run in process loads
        levels=levels,
        intervals=intervals,
        threads=args.threads,
        device=args.device,
        dtype=args.dtype,
    )


def _stream_intervals(text: str) -> list[int]:
    """`--stream-intervals 1,4`: distinct positive deltas-per-chunk values, in order."""
    from .concurrency import positive_counts

    values = positive_counts(text)
    if not values:
        raise InvalidConfigError(
            f"--stream-intervals {text!r}: give comma-separated positive numbers of deltas per "
            "streamed chunk, e.g. --stream-intervals 1,4."
        )
    return values


def _bench_headroom(args: argparse.Namespace) -> None:
    from . import headroom
    from .setups import task_form

    if args.shape or args.task not in ("arithmetic", "real"):
        raise InvalidConfigError(
            "--headroom runs the shipped testbed members (and the weak one) on chain-of-thought "
            "problems, or the real pair on the real task with --task real (--form qa or rag), "
            "or the --model members on either; drop --shape and a JSONL --task."
        )
    form = task_form(args.task, args.form)
    if form not in ("cot", "qa", "rag"):
        raise InvalidConfigError(
            f"--headroom measures answers to questions (--form cot, or qa|rag with --task "
            f"real), not --form {form}: run --form {form} without --headroom."
        )
    given = args.methods.split(",") if args.methods else headroom.METHODS
    methods = [m for m in given if m and m != "single"]
    headroom.run(
        models=args.model,
        task=args.task,
        form=form,
        n=args.n,
        seed=args.seed,
        warmup=args.warmup,
        warmup_seed=args.warmup_seed,
        calibrate=args.calibrate,
        methods=methods,
        which=[s for s in args.sets.split(",") if s],
        configs=args.config,
        max_new_tokens=args.max_new_tokens,
        out=args.out,
        device=args.device,
        dtype=args.dtype,
        threads=args.threads,
        command=_command(args),
    )
    _show(args)


def bench(args: argparse.Namespace) -> None:
    from .accuracy import run
    from .setups import parse_setups

    runs = (args.concurrency, args.grammar_cost, args.serve, args.headroom)
    if sum(map(bool, runs)) > 1:
        raise InvalidConfigError(
            "--concurrency, --grammar-cost, --serve and --headroom are separate runs; pick one."
        )
    if args.prompt_tokens is not None and not args.concurrency:
        raise InvalidConfigError("--prompt-tokens pads the prompts of a --concurrency run; add it.")
    if args.serve:
        return _bench_serve(args)
    if args.headroom:
        return _bench_headroom(args)
    if args.concurrency:
        return _bench_concurrency(args)
    if args.grammar_cost:
        return _bench_grammar(args)
    if args.form == "tool":
        return _bench_tools(args)
    methods = [m for m in (args.methods or BENCH_METHODS).split(",") if m]
    aggregators = [a for a in (args.aggregator or "unite,gac").split(",") if a]

    def setups_from(names: list[str]):
        return parse_setups(methods, aggregators, len(names), args.config, names)

    run(
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
    _show(args)


def soak(args: argparse.Namespace) -> None:
    from . import soak as soak_run
    from .setups import (
        load_members,
        load_task,
        method_setups,
        shipped_model_paths,
        without_generation,
    )

    for name in ("requests", "workers", "tasks", "window", "problems"):
        if getattr(args, name) < 1:
            raise InvalidConfigError(f"--{name} must be at least 1, got {getattr(args, name)}.")
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    task = load_task("arithmetic", args.problems, args.seed)
    members = load_members(args.model, args.device, args.dtype)
    methods = [m for m in args.methods.split(",") if m]
    run = {  # what the soak in process and the soak over HTTP share
        "members": members,
        "setups": without_generation(
            method_setups(methods, len(members), args.config, [m.name for m in members])
        ),
        "problems": [messages for messages, _ in task.items],
        "requests": args.requests,
        "window": args.window,
        "max_new_tokens": args.max_new_tokens,
        "seed": args.seed,
        "device": args.device,
        "dtype": args.dtype,
        "out": args.out,
        "command": _command(args),
    }
    if args.serve:
        from . import serve

        models = args.model or shipped_model_paths()
        result = serve.run_soak(models=models, clients=args.tasks, **run)
        _show(args)
        if result["mismatches"] or result["held_slots"] or result["server_errors"]:
            raise EnsembleError(
                f"soak --serve: {result['mismatches']} wrong answers, {result['server_errors']} "
                f"5xx and {result['held_slots']} slots held; see {args.out}/results.md."
            )
        return
    result = soak_run.run(models=args.model, threads=args.workers, tasks=args.tasks, **run)
    _show(args)
    if result["mismatches"] or result["held_slots"] or result["held_rows"]:
        raise EnsembleError(
            f"soak: {result['mismatches']} answers differ from a fresh ensemble's, "
            f"{result['held_slots']} request slots and {result['held_rows']} key/value rows are "
            f"still held; see {args.out}/results.md."
        )


def add_commands(sub) -> None:
    """The `bench` and `soak` sub-commands, on the lab's sub-parsers."""
    from .setups import CONFIG_HELP

    p = sub.add_parser("bench", help="measure methods side by side in one run")
    p.add_argument(
        "--methods", default=None, help="default: single,token,safe,specem (--headroom: every one)"
    )
    p.add_argument("--aggregator", default=None, help="for token and safe (default: unite,gac)")
    p.add_argument("--config", action="append", default=[], help=CONFIG_HELP)
    p.add_argument("--model", action="append", default=None, help="member (default: shipped)")
    p.add_argument(
        "--task",
        default="arithmetic",
        help="'arithmetic' (the tiny testbed's task, on the shipped models), 'real' (the real "
        "task's short questions, on the real pair: core.testbed.real_models, the real extra) "
        'or a JSONL file of {"prompt": ..., "answer": ...} lines, scored by the FINAL answer '
        "compared exactly: the number, the multiple-choice letter or the text after the last "
        "'The answer is'/'Answer:' (else the last number or the final line)",
    )
    p.add_argument(
        "--form",
        default=None,
        choices=["cot", "rag", "tool", "qa"],
        help="arithmetic: cot (default), rag, tool; real: qa (default), rag, tool. tool: each "
        "single model and method on tool-use problems (right tool, arguments and final answer; "
        "schema-valid calls with the grammar and with the prompt only)",
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
        "--prompt-tokens",
        type=int,
        default=None,
        metavar="N",
        help="with --concurrency --form rag: pad each prompt's retrieved context with more "
        "passages to about N tokens (e.g. 720, a RAG query's length)",
    )
    p.add_argument(
        "--grammar-cost",
        action="store_true",
        help="every method (default options) with and without a grammar that allows any text "
        "(tools, tool_choice none): time per output token side by side, same text",
    )
    p.add_argument(
        "--serve",
        default=None,
        metavar="LEVELS",
        help="e.g. 1,8,32: every method served over HTTP (a server process, a pool of streaming "
        "clients) against the same requests in process, at each number of concurrent clients",
    )
    p.add_argument(
        "--stream-intervals",
        default="1",
        metavar="N,...",
        help="--serve: each method's server with each of these --stream-interval values "
        "(deltas per streamed chunk), e.g. 1,4",
    )
    p.add_argument(
        "--headroom",
        action="store_true",
        help="every member alone, and every method at its default and best options on every "
        "pair of the shipped members, the three, and the three with the weak member (--task "
        "real: the real pair; --model: those members): accuracy, the either-right ceiling, the "
        "share of the gap closed, the paired difference to the best member, time per token, "
        "weights",
    )
    p.add_argument(
        "--warmup",
        type=int,
        default=0,
        help="--headroom: warm-up problems per ensemble, learning its member weights (then "
        "frozen); 0: every ensemble as Ensemble(members, method) gives it",
    )
    p.add_argument(
        "--calibrate",
        type=int,
        default=0,
        help="--headroom: also SAFE, SpecEM and rerank on the three, the three with the weak "
        "member and the real pair after Ensemble.calibrate on the prompts of this many "
        "problems of --warmup-seed (the testbed's training split; --task real: its --form)",
    )
    p.add_argument("--warmup-seed", type=int, default=2, help="--headroom: their seed")
    p.add_argument(
        "--sets", default="pairs,three,weak", help="--headroom: member sets (pairs,three,weak)"
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
    p.add_argument(
        "--serve",
        action="store_true",
        help="over HTTP: one server per method (on_member_failure=drop), --tasks clients; "
        "adds dropped connections and malformed requests",
    )
    p.set_defaults(func=soak)
