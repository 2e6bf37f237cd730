"""`llm-ensembling demo`: why ensemble, shown on the shipped testbed models (offline, CPU), or
with `--real` on the real pair (SmolLM2-135M-Instruct and Gemma-3-270M as GGUF files from PyPI,
the `real` extra) and the real task's short questions.

Every member alone and the default ensemble answer the same held-out problems; the demo prints
each configuration's accuracy next to the best single member and the either-right ceiling (the
share of problems at least one member answers right alone: what an ensemble could reach), then
one problem where the members disagree and the default ensemble decides, with its events.
"""

from __future__ import annotations

from collections.abc import Sequence

from .config import GenerationConfig, Output
from .ensemble import Ensemble
from .events import Event
from .hf_member import HFMember

QUIET = ("draft", "skip_consensus", "skip_mismatch", "skip_gate", "segment_candidates")


def run(
    n: int | None = None,
    seed: int = 1,
    max_new_tokens: int | None = None,
    methods: Sequence[str] = (),
    real: bool = False,
    dtype: str = "auto",
) -> None:
    """`real`: the real pair on the real task's qa form (14 problems and 48 new tokens unless
    given: real models on a CPU take seconds per answer); otherwise the shipped tiny models on
    chain-of-thought problems (60 and 120). `dtype`: the members' (auto: float32 on a CPU;
    bfloat16 runs the real pair about a third faster on a CPU with bfloat16 instructions)."""
    from tqdm.auto import tqdm

    from .testbed import extract_answer, testbed

    bed = testbed(real)
    sources = bed.members()  # without the real extra: an error naming it, before any loading
    problems = bed.problems(n or (14 if real else 60), seed=seed)
    n = len(problems)
    max_new_tokens = max_new_tokens or (48 if real else 120)
    # a real reply's answer is its text; a tiny model's, what follows "The answer is"
    answer_of = (lambda text: text.strip()) if real else extract_answer
    loading = tqdm(sources, desc="loading", unit="model")
    members = [HFMember.load(p, device="cpu", dtype=dtype) for p in loading]
    singles = {f"{m.name} alone": Ensemble([m], "single") for m in members}
    default = Ensemble(members)
    paper = Ensemble(members, "safe", preset="paper")
    label = f"default ensemble: {describe(default, paper)}"
    ensembles = {**singles, label: default, "SAFE as published (preset='paper')": paper}
    for method in methods:
        ensembles[f"{method} (its defaults)"] = Ensemble(members, method)
    config = GenerationConfig(max_new_tokens=max_new_tokens)
    right: dict[str, list[bool]] = {name: [] for name in ensembles}
    outputs: dict[str, list[Output]] = {name: [] for name in ensembles}
    for problem in tqdm(problems, desc="held-out problems", unit="problem"):
        for name, ensemble in ensembles.items():
            out = ensemble.generate(problem.messages, config)
            outputs[name].append(out)
            right[name].append(bed.right(out.text, problem, cut=out.finish_reason == "length"))
    alone = [right[name] for name in singles]
    ceiling = sum(map(any, zip(*alone, strict=True))) / n
    best_name = max(singles, key=lambda name: sum(right[name]))
    best = sum(right[best_name]) / n
    maker = "make_real_problems" if real else "make_problems"
    kinds = sorted({str(m.dtype).removeprefix("torch.") for m in members})
    print(f"\nAccuracy on {n} held-out problems ({maker}({n}, seed={seed}); {', '.join(kinds)}):")
    for name in ensembles:
        accuracy = sum(right[name]) / n
        note = ""
        if name not in singles and ceiling > best:
            note = f"  closes {100 * (accuracy - best) / (ceiling - best):.0f} % of the gap"
        elif name not in singles:
            note = "  (no gap to close: the best member is at the ceiling here)"
        print(f"  {name:60s} {100 * accuracy:5.1f} %{note}")
    print(f"  {'at least one member right (the ceiling)':60s} {100 * ceiling:5.1f} %")
    print(f"  best single member: {best_name.removesuffix(' alone')} ({100 * best:.1f} %)")
    if default.learn_weights:
        shown = ", ".join(f"{k} {v:.2f}" for k, v in default.member_weights.items())
        print(f"  member weights the default ensemble learned on the way: {shown}")
    example = _disagreement(problems, singles, label, right, outputs, answer_of)
    if example is None:
        print("\n(no problem here where the members disagree and the ensemble is right)")
        return
    problem = problems[example]
    print(f"\nWhere the members disagree: {problem.question}  (answer {problem.answer})")
    for name in singles:
        mark = "right" if right[name][example] else "wrong"
        print(f"  {name:24s} {mark}: {outputs[name][example].text.strip()}")
    out = outputs[label][example]
    mark = "right" if right[label][example] else "wrong"
    print(f"  {'default ensemble':24s} {mark}: {out.text.strip()}")
    print("  how it decided:")
    for line in events_summary(out.events):
        print(f"    {line}")


def describe(ensemble: Ensemble, published: Ensemble) -> str:
    """The ensemble's method and the options where it differs from `published` (the same
    method as its paper publishes it, or another method: then every option is shown)."""
    mine, theirs = ensemble.summary(), published.summary()
    if mine["method"] != theirs["method"]:
        theirs = {}
    shown = {
        k: v
        for k, v in mine.items()
        if k not in ("method", "members", "preset") and (not theirs or theirs.get(k) != v)
    }
    options = ", ".join(f"{k}={v!r}" for k, v in shown.items())
    return f"{mine['method']} ({options})" if options else mine["method"]


def events_summary(events: Sequence[Event]) -> list[str]:
    """The events that decided something, one line each; the routine ones counted."""
    lines, routine = [], {}
    for event in events:
        if event.name in QUIET:
            routine[event.name] = routine.get(event.name, 0) + 1
            continue
        data = {k: v for k, v in event.to_dict().items() if k != "name"}
        lines.append(f"{event.name}: {data}")
    if routine:
        lines.append("and " + ", ".join(f"{v} × {k}" for k, v in sorted(routine.items())))
    return lines


def _disagreement(problems, singles, label, right, outputs, answer_of) -> int | None:
    """The first problem whose members wrote different final answers, not all right, that the
    default ensemble answers right."""
    for i in range(len(problems)):
        answers = {answer_of(outputs[name][i].text) for name in singles}
        some_wrong = not all(right[name][i] for name in singles)
        if len(answers) > 1 and some_wrong and right[label][i]:
            return i
    return None
