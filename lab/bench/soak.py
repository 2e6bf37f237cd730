"""Soak: many requests of every kind on one set of loaded models, watching memory and latency
stay flat and every answer stay right (`python -m lab soak`).

Requests mix methods and both member-failure policies, and run as they do in applications:
from a pool of threads and from asyncio tasks at once; some streams are abandoned after a few
deltas (closed, or just dropped), some async streams are cancelled mid-way, and some requests
carry a fault: a forward hook on one member's model raises (before the pass, or inside it after
the first decoder layer wrote its keys) on the passes of requests whose prompt bears that
member's marker, so the fault hits exactly those requests, also inside batched passes.

Every 100 requests (a window) the process's resident memory (VmRSS), live threads and the
latency of the window's whole requests are recorded. Afterwards every answer is checked against
a fresh ensemble on freshly loaded models: a whole answer must equal it, an abandoned or
cancelled one must be a prefix of it, a request that lost a member under "drop" must equal the
fresh ensemble of the members left, and a failure under "raise" (or of a request's only member)
must name the member that failed.
"""

from __future__ import annotations

import asyncio
import gc
import json
import os
import random
import statistics
import threading
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from core.config import GenerationConfig
from core.ensemble import Ensemble
from core.errors import MemberError
from core.member import Member

from .report import pyplot, save_figure, write_results
from .setups import Setup, ensemble_for, load_members

KINDS = ("thread", "thread-abandon", "async", "async-cancel")
KIND_SHARES = (0.35, 0.15, 0.35, 0.15)
POLICIES = ("raise", "drop")
FAULT_RATE = 0.1  # share of whole requests (thread, async) that carry a fault
WHERE = ("before", "inside")
_LETTERS = "QXZJKVWYBDFGHMNPRSTL"  # marker initials: one per member, all distinct


def rss_kib() -> int:
    """Resident memory of this process (VmRSS), in KiB."""
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise OSError("no VmRSS line in /proc/self/status (soak needs Linux)")


def _decoder_layers(model):
    base = getattr(model, "model", None) or getattr(model, "transformer", None)
    return getattr(base, "layers", None) or base.h


class FaultHooks:
    """Member k fails on every forward pass whose input holds its marker.

    A marker ends the user's message; markers of different members differ in their first
    letter, so a prompt prefix taken from the prefix cache (which may hold another member's
    marker, never this member's own: its passes on it always fail) always leaves this member's
    whole marker in the ids it feeds."""

    def __init__(self, members: Sequence[Member]) -> None:
        self.members = list(members)
        self.fired: dict[str, int] = {m.name: 0 for m in members}
        self._armed: dict[int, bool] = {}
        self._handles = []
        for k, member in enumerate(self.members):
            model = member.model
            self._handles.append(model.register_forward_pre_hook(self._check(k), with_kwargs=True))
            layer = _decoder_layers(model)[1]
            self._handles.append(layer.register_forward_pre_hook(self._inside(model)))

    @staticmethod
    def marker(k: int, where: str) -> str:
        return f"{_LETTERS[k] * 2}-fault-{where}"

    def poison(self, messages: list[dict], k: int, where: str) -> list[dict]:
        """The messages with member k's marker at the end of the last user message."""
        out = [dict(m) for m in messages]
        last = max(i for i, m in enumerate(out) if m["role"] == "user")
        out[last]["content"] = f"{out[last]['content']} ({self.marker(k, where)})"
        return out

    def _check(self, k: int):
        member = self.members[k]
        markers = {where: self.marker(k, where) for where in WHERE}

        def check(model, args, kwargs):
            ids = kwargs.get("input_ids")
            if ids is None:
                ids = args[0]
            texts = [member.tokenizer.decode(row.tolist()) for row in ids]
            armed = {w for w, marker in markers.items() if any(marker in t for t in texts)}
            self._armed[id(model)] = "inside" in armed
            if "before" in armed:
                self.fired[member.name] += 1
                raise RuntimeError(f"injected fault before the pass of {member.name}")

        return check

    def _inside(self, model):
        name = next(m.name for m in self.members if m.model is model)

        def inside(_layer, _args):
            if self._armed.get(id(model)):
                self._armed[id(model)] = False
                self.fired[name] += 1
                raise RuntimeError(f"injected fault inside the pass of {name}")

        return inside

    def remove(self) -> None:
        for handle in self._handles:
            handle.remove()


@dataclass
class Plan:
    index: int
    label: str  # the setup
    policy: str
    kind: str
    problem: int
    target: str | None = None  # the member that fails (its marker is in the prompt)
    where: str | None = None
    abandon_after: int = 0  # deltas read before a stream is abandoned or cancelled
    close: bool = True  # an abandoned stream is closed (else just dropped)


@dataclass
class Outcome:
    index: int
    window: int
    label: str
    policy: str
    kind: str
    problem: int
    target: str | None
    where: str | None
    status: str  # done | member-dropped | failed | abandoned | cancelled
    text: str = ""
    seconds: float | None = None  # whole requests only
    failed_member: str | None = None
    dropped: list[str] = field(default_factory=list)
    verdict: str = ""  # ok | mismatch (and why)


def make_plans(
    n: int, setups: Sequence[Setup], active: dict[str, list[str]], problems: int, seed: int
) -> list[Plan]:
    """A seeded mix of requests; `active[label]`: the members each setup's method runs."""
    rng = random.Random(f"soak/{seed}")
    plans = []
    for index in range(n):
        setup = rng.choice(list(setups))
        kind = rng.choices(KINDS, weights=KIND_SHARES)[0]
        plan = Plan(index, setup.label, rng.choice(POLICIES), kind, rng.randrange(problems))
        if kind in ("thread", "async") and rng.random() < FAULT_RATE:
            plan.target = rng.choice(active[setup.label])
            plan.where = rng.choice(WHERE)
        if kind in ("thread-abandon", "async-cancel"):
            plan.abandon_after = rng.randint(1, 4)
            plan.close = rng.random() < 0.5
        plans.append(plan)
    return plans


class Soak:
    def __init__(
        self,
        members: Sequence[Member],
        setups: Sequence[Setup],
        problems: Sequence[list[dict]],
        config: GenerationConfig,
    ) -> None:
        self.members = list(members)
        self.setups = {s.label: s for s in setups}
        self.problems = list(problems)
        self.config = config
        self.ensembles: dict[tuple[str, str], Ensemble] = {
            (s.label, policy): ensemble_for(members, s, on_member_failure=policy, prefix_reuse=True)
            for s in setups
            for policy in POLICIES
        }
        self.faults = FaultHooks(members)
        self.index = {m.name: k for k, m in enumerate(members)}

    def active(self) -> dict[str, list[str]]:
        return {
            label: [m.name for m in self.ensembles[label, "raise"].active_members]
            for label in self.setups
        }

    def messages(self, problem: int, target: str | None, where: str | None) -> list[dict]:
        """The problem's messages, with the target member's fault marker if it has one."""
        messages = self.problems[problem]
        if target is None:
            return messages
        return self.faults.poison(messages, self.index[target], where)

    # --- one request of each kind -------------------------------------------------------------

    def run_thread(self, plan: Plan, window: int) -> Outcome:
        ensemble = self.ensembles[plan.label, plan.policy]
        outcome = Outcome(plan.index, window, plan.label, plan.policy, plan.kind, plan.problem,
                          plan.target, plan.where, "done")  # fmt: skip
        messages = self.messages(plan.problem, plan.target, plan.where)
        start = time.perf_counter()
        if plan.kind == "thread":
            try:
                out = ensemble.generate(messages, self.config)
            except MemberError as error:
                outcome.status, outcome.failed_member = "failed", error.member
                return outcome
            return self._whole(outcome, out.text, list(out.stats.failed), start)
        stream = ensemble.stream(messages, self.config)
        parts, finished = [], True
        for delta in stream:
            parts.append(delta.text)
            if len(parts) >= plan.abandon_after:
                finished = delta.finish_reason is not None
                break
        if plan.close:
            stream.close()
        del stream  # dropped: the request ends when the stream is collected
        if finished:
            return self._whole(outcome, "".join(parts), [], start)
        outcome.status, outcome.text = "abandoned", "".join(parts)
        return outcome

    async def run_task(self, plan: Plan, window: int) -> Outcome:
        ensemble = self.ensembles[plan.label, plan.policy]
        outcome = Outcome(plan.index, window, plan.label, plan.policy, plan.kind, plan.problem,
                          plan.target, plan.where, "done")  # fmt: skip
        messages = self.messages(plan.problem, plan.target, plan.where)
        start = time.perf_counter()
        if plan.kind == "async":
            try:
                out = await ensemble.agenerate(messages, self.config)
            except MemberError as error:
                outcome.status, outcome.failed_member = "failed", error.member
                return outcome
            return self._whole(outcome, out.text, list(out.stats.failed), start)
        parts: list[str] = []
        reached = asyncio.Event()

        async def consume() -> None:
            async for delta in ensemble.astream(messages, self.config):
                parts.append(delta.text)
                if len(parts) >= plan.abandon_after:
                    reached.set()

        task = asyncio.create_task(consume())
        waiter = asyncio.create_task(reached.wait())
        await asyncio.wait({task, waiter}, return_when=asyncio.FIRST_COMPLETED)
        waiter.cancel()
        task.cancel()
        try:
            await task
        except asyncio.CancelledError:
            outcome.status, outcome.text = "cancelled", "".join(parts)
            return outcome
        return self._whole(outcome, "".join(parts), [], start)

    @staticmethod
    def _whole(outcome: Outcome, text: str, dropped: list[str], start: float) -> Outcome:
        outcome.text, outcome.dropped = text, dropped
        outcome.seconds = time.perf_counter() - start
        outcome.status = "member-dropped" if dropped else "done"
        return outcome

    # --- the run ------------------------------------------------------------------------------

    async def run(
        self, plans: Sequence[Plan], threads: int, tasks: int, window: int, progress: bool
    ) -> tuple[list[Outcome], list[dict]]:
        loop = asyncio.get_running_loop()
        outcomes: list[Outcome] = []
        windows: list[dict] = []
        slots = asyncio.Semaphore(tasks)
        bar = None
        if progress:
            from tqdm.auto import tqdm

            bar = tqdm(total=len(plans), desc="requests", unit="request")

        async def as_task(plan: Plan, number: int) -> Outcome:
            async with slots:
                return await self.run_task(plan, number)

        with ThreadPoolExecutor(threads, thread_name_prefix="soak-request") as pool:
            for number, at in enumerate(range(0, len(plans), window)):
                part = plans[at : at + window]
                start = time.perf_counter()
                jobs = [
                    loop.run_in_executor(pool, self.run_thread, plan, number)
                    if plan.kind.startswith("thread")
                    else as_task(plan, number)
                    for plan in part
                ]
                done = await asyncio.gather(*jobs)
                wall = time.perf_counter() - start
                outcomes.extend(done)
                rss = rss_kib() / 1024
                gc.collect()  # between windows: live objects, not garbage awaiting a collection
                whole = [o.seconds for o in done if o.seconds is not None]
                windows.append(
                    {
                        "window": number,
                        "requests_done": at + len(part),
                        "wall_s": wall,
                        "rss_mib": rss,
                        "kv_store_mib": self.store_bytes() / 2**20,
                        "threads": threading.active_count(),
                        # live objects (the soak's own records of requests add a few each)
                        "python_objects": len(gc.get_objects()),
                        "p50_ms": 1000 * statistics.median(whole) if whole else None,
                        "p95_ms": 1000 * _p95(whole) if whole else None,
                        "statuses": _count(o.status for o in done),
                    }
                )
                if bar is not None:
                    bar.update(len(part))
        if bar is not None:
            bar.close()
        return outcomes, windows

    def held_slots(self, wait: float = 10.0) -> int:
        """Request slots still held (cancelled requests stop at their next forward pass)."""
        deadline = time.monotonic() + wait
        while True:
            held = sum(e.admission.running for e in self.ensembles.values())
            if held == 0 or time.monotonic() > deadline:
                return held
            time.sleep(0.05)

    def store_bytes(self) -> int:
        """What the models' key/value stores have allocated (part of the RSS)."""
        stores = {id(m.store): m.store for m in self.members if getattr(m, "store", None)}
        return sum(store.nbytes for store in stores.values())

    def held_rows(self) -> int:
        """Rows of the models' key/value stores still held by a request (after a collection:
        a dropped stream gives its rows back when it is collected)."""
        gc.collect()
        return sum(m.store.held for m in self.members if getattr(m, "store", None) is not None)


def _p95(values: Sequence[float]) -> float:
    if len(values) < 2:
        return values[0]
    return statistics.quantiles(sorted(values), n=20, method="inclusive")[-1]


def _count(items) -> dict[str, int]:
    counts: dict[str, int] = {}
    for item in items:
        counts[item] = counts.get(item, 0) + 1
    return counts


def check(outcomes: Sequence[Outcome], soak: Soak, reference) -> None:
    """Each outcome's verdict against `reference(label, messages, members_left) -> text`."""
    active = soak.active()
    for o in outcomes:
        members = active[o.label]
        if o.status == "failed":
            expected = o.target is not None and (o.policy == "raise" or len(members) == 1)
            right = expected and o.failed_member == o.target
            o.verdict = "ok" if right else f"mismatch: failed on {o.failed_member!r}"
            continue
        survived = o.target is not None and o.status in ("done", "member-dropped")
        if survived and (o.policy == "raise" or len(members) == 1 or o.dropped != [o.target]):
            o.verdict = f"mismatch: the fault on {o.target!r} did not end or drop it"
            continue
        left = tuple(n for n in members if n not in o.dropped)
        want = reference(o.label, soak.messages(o.problem, o.target, o.where), left)
        if o.status in ("abandoned", "cancelled"):
            o.verdict = "ok" if want.startswith(o.text) else "mismatch: not a prefix"
        else:
            o.verdict = "ok" if o.text == want else "mismatch: text differs"


class References:
    """What a fresh ensemble on freshly loaded models answers (computed once per prompt)."""

    def __init__(self, models, device: str, dtype: str, setups: dict[str, Setup], config) -> None:
        self.members = load_members(models, device, dtype)
        self.by_name = {m.name: m for m in self.members}
        self.setups = setups
        self.config = config
        self._texts: dict[tuple, str] = {}

    def __call__(self, label: str, messages: list[dict], left: tuple[str, ...]) -> str:
        key = (label, json.dumps(messages), left)
        if key not in self._texts:
            setup = self.setups[label]
            options = dict(setup.options)
            if setup.method == "single":  # the single member, wherever it was in the list
                options.pop("member", None)
            chosen = [self.by_name[name] for name in left]
            ensemble = Ensemble(chosen, setup.method, **options)
            self._texts[key] = ensemble.generate(messages, self.config).text
        return self._texts[key]


def markdown(result: dict) -> str:
    lines = []
    totals = result["statuses"]
    lines += [
        f"{result['requests']} requests over {', '.join(result['labels'])} (each under both "
        f"failure policies), {result['threads']} threads and {result['tasks']} asyncio tasks at "
        f"once, max_new_tokens={result['max_new_tokens']}; load average "
        f"{result['load_before'][0]:.2f} before, {result['load_after'][0]:.2f} after.",
        "",
        "Outcomes: "
        + ", ".join(f"{k} {v}" for k, v in sorted(totals.items()))
        + f"; injected faults raised {sum(result['faults_fired'].values())} times (a fault in a "
        "batched pass raises again when the batcher reruns each pass alone).",
        f"Checked against a fresh ensemble: {result['checked_ok']} ok, "
        f"**{result['mismatches']} mismatches**; request slots held at the end: "
        f"{result['held_slots']}; key/value store rows held: {result['held_rows']}.",
        "",
        "| requests | RSS MiB | KV store MiB | Python objects | threads | p50 ms | p95 ms | wall s "
        "| outcomes |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for w in result["windows"]:
        outcomes = ", ".join(f"{k} {v}" for k, v in sorted(w["statuses"].items()))
        p50 = "–" if w["p50_ms"] is None else f"{w['p50_ms']:.0f}"
        p95 = "–" if w["p95_ms"] is None else f"{w['p95_ms']:.0f}"
        lines.append(
            f"| {w['requests_done']} | {w['rss_mib']:.1f} | {w['kv_store_mib']:.1f} | "
            f"{w['python_objects']} | "
            f"{w['threads']} | {p50} | {p95} | "
            f"{w['wall_s']:.1f} | {outcomes} |"
        )
    bad = [o for o in result["outcomes"] if o["verdict"] != "ok"]
    if bad:
        lines += ["", "Mismatches:", ""]
        lines += [
            f"- request {o['index']} ({o['label']}, {o['policy']}, {o['kind']}, problem "
            f"{o['problem']}): {o['verdict']}"
            for o in bad[:20]
        ]
    return "\n".join(lines) + "\n"


def plot(windows: Sequence[dict], out: Path) -> Path:
    plt = pyplot()
    done = [w["requests_done"] for w in windows]
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2))
    left.plot(done, [w["rss_mib"] for w in windows], marker="o")
    left.set_ylim(0, max(w["rss_mib"] for w in windows) * 1.15)
    left.set_ylabel("resident memory (VmRSS, MiB)")
    right.plot(done, [w["p50_ms"] for w in windows], marker="o", label="p50")
    right.plot(done, [w["p95_ms"] for w in windows], marker="o", label="p95")
    right.set_ylim(0, max(w["p95_ms"] or 0 for w in windows) * 1.15)
    right.set_ylabel("latency of whole requests (ms)")
    right.legend()
    for ax in (left, right):
        ax.set_xlabel("requests done")
        ax.grid(alpha=0.3)
    return save_figure(fig, out / "soak.png")


def run(
    *,
    members: Sequence[Member],
    models: Sequence[str] | None,
    setups: Sequence[Setup],
    problems: Sequence[list[dict]],
    requests: int = 1000,
    threads: int = 6,
    tasks: int = 6,
    window: int = 100,
    max_new_tokens: int = 48,
    seed: int = 1,
    device: str = "cpu",
    dtype: str = "auto",
    out: str | Path = "bench-out/soak",
    progress: bool = True,
    command: str = "",
) -> dict[str, Any]:
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    config = GenerationConfig(max_new_tokens=max_new_tokens)
    soak = Soak(members, setups, problems, config)
    plans = make_plans(requests, setups, soak.active(), len(problems), seed)
    load_before = os.getloadavg()
    try:
        outcomes, windows = asyncio.run(soak.run(plans, threads, tasks, window, progress))
    finally:
        soak.faults.remove()
    held = soak.held_slots()
    rows = soak.held_rows()
    load_after = os.getloadavg()
    reference = References(models, device, dtype, soak.setups, config)
    check(outcomes, soak, reference)
    statuses = _count(o.status for o in outcomes)
    result = {
        "command": command,
        "requests": len(outcomes),
        "labels": list(soak.setups),
        "threads": threads,
        "tasks": tasks,
        "window": window,
        "max_new_tokens": max_new_tokens,
        "load_before": list(load_before),
        "load_after": list(load_after),
        "statuses": statuses,
        "faults_fired": dict(soak.faults.fired),
        "checked_ok": sum(o.verdict == "ok" for o in outcomes),
        "mismatches": sum(o.verdict != "ok" for o in outcomes),
        "held_slots": held,
        "held_rows": rows,
        "windows": windows,
        "outcomes": [asdict(o) for o in outcomes],
    }
    result = write_results(out, result, markdown(result))
    result["plots"] = [str(plot(windows, out))]
    return result
