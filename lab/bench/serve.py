"""The server under load (`python -m lab bench --serve 1,8,32`) and an HTTP soak
(`python -m lab soak --serve`), both with real HTTP clients on the loopback.

Load: for every method, a server process (`llm-ensembling serve`, its own copy of the models)
and the same method in this process on the same requests. At each level of c concurrent clients
the requests run once over HTTP (a pool of c streaming clients) and once in process (c threads
streaming `Ensemble.stream`), the two blocks interleaved, the first of them alternating from
level to level, so machine noise hits both alike. Reported per block: output tokens/s, p50/p95
latency and time to the first text; and whether every HTTP answer equals the in-process one.

Soak: servers in this process (one per method, `on_member_failure="drop"`, over one set of
loaded members), so faults can be injected into the members' forward passes
(`lab.bench.soak.FaultHooks`), and a pool of HTTP clients sending a seeded mix: whole answers,
streams, streams abandoned after a few chunks, connections dropped before the answer, requests
with a member fault, malformed requests. Every answer is checked against a fresh ensemble (of
the members left, after a fault); no answer may be a 5xx; no request slot may be held at the end;
resident memory is recorded per window of requests.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import json
import os
import random
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx

from core.config import GenerationConfig
from core.ensemble import Ensemble
from core.sources import public_sources

from .report import write_results
from .setups import Setup, ensemble_for
from .soak import FaultHooks, References, rss_kib

GOAL_RATIO = 0.9  # HTTP tokens/s, times the same concurrency in process


def _percentile(values: Sequence[float], q: int) -> float | None:
    if not values:
        return None
    if len(values) == 1:
        return values[0]
    return statistics.quantiles(sorted(values), n=100, method="inclusive")[q - 1]


def chat_body(messages: list[dict], max_tokens: int, stream: bool = True) -> dict[str, Any]:
    body: dict[str, Any] = {"model": "ensemble", "messages": messages, "max_tokens": max_tokens}
    if stream:
        body.update(stream=True, stream_options={"include_usage": True})
    return body


async def read_stream(response: httpx.Response, started: float, chunks: int | None = None):
    """Text, output tokens, first-text seconds, `ensemble` details and finish reason of an SSE
    answer; stops after `chunks` chunks when given (an abandoned stream)."""
    text, tokens, first, details, finish, seen = [], 0, None, None, None, 0
    async for line in response.aiter_lines():
        if not line.startswith("data: ") or line == "data: [DONE]":
            continue
        chunk = json.loads(line[6:])
        if "error" in chunk:
            raise RuntimeError(f"error in stream: {chunk['error']}")
        if chunk.get("usage"):
            tokens = chunk["usage"]["completion_tokens"]
        for choice in chunk.get("choices", []):
            piece = choice["delta"].get("content") or ""
            if piece and first is None:
                first = time.perf_counter() - started
            text.append(piece)
            if choice.get("finish_reason"):
                finish, details = choice["finish_reason"], chunk.get("ensemble")
        seen += 1
        if chunks is not None and seen >= chunks:
            break
    return "".join(text), tokens, first, details, finish


# --------------------------------------------------------------------------- load


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def cpu_seconds(pid: int | None = None) -> float:
    """CPU time (user + system) of this process, or of process `pid` (Linux)."""
    if pid is None:
        return time.process_time()  # user + system CPU of this process, on every platform
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@contextlib.contextmanager
def server_process(
    models: Sequence[Any],
    setup: Setup,
    max_concurrency: int,
    threads: int | None,
    log: Path,
    stream_interval: int = 1,
    device: str = "cpu",
    dtype: str = "auto",
) -> Iterator[tuple[str, int]]:
    """`llm-ensembling serve` for one setup, in its own process (yields its URL and pid), loading
    the same members as the run in process (paths, or `Local` specs with their own template and
    stop strings); stopped with SIGTERM (which must end it with exit status 0)."""
    port = _free_port()
    config = {
        "members": public_sources([models[i] for i in setup.chosen(len(models))]),
        "method": setup.method,
        "max_concurrency": max_concurrency,
        "prefix_reuse": False,
        "device": device,
        "dtype": dtype,
    }
    lines = [f"{key} = {toml_value(value)}" for key, value in config.items()]
    lines += ["[options]"] + [f"{k} = {toml_value(v)}" for k, v in setup.options.items()]
    with tempfile.NamedTemporaryFile("w", suffix=".toml", delete=False) as file:
        file.write("\n".join(lines) + "\n")
    command = [sys.executable, "-m", "core.cli", "serve", "--config", file.name,
               "--port", str(port), "--log-level", "warning",
               "--stream-interval", str(stream_interval)]  # fmt: skip
    if threads:
        command += ["--threads", str(threads)]
    root = Path(__file__).resolve().parents[2]
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")]),
    }
    with log.open("a") as out:
        process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env=env)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 300
        while True:
            if process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the server for {setup.label} did not start; see {log}")
            with contextlib.suppress(httpx.TransportError):
                if httpx.get(url + "/health", timeout=5).status_code == 200:
                    break
            time.sleep(0.1)
        yield url, process.pid
    finally:
        process.send_signal(signal.SIGTERM)
        code = process.wait(120)
        os.unlink(file.name)
        if code != 0:
            raise RuntimeError(f"the server for {setup.label} exited with {code}; see {log}")


def toml_value(value: Any) -> str:
    """A plain value as TOML: a dict as an inline table, a list as an array, anything else as
    its JSON (JSON's strings, numbers and booleans read the same in TOML)."""
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k} = {toml_value(v)}" for k, v in value.items()) + "}"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    return json.dumps(value)


async def _http_block(url: str, items: Sequence[list[dict]], level: int, max_tokens: int):
    limits = httpx.Limits(max_connections=level, max_keepalive_connections=level)
    slots = asyncio.Semaphore(level)
    async with httpx.AsyncClient(base_url=url, limits=limits, timeout=600) as client:

        async def one(messages: list[dict]) -> dict:
            async with slots:
                started = time.perf_counter()
                body = chat_body(messages, max_tokens)
                async with client.stream("POST", "/v1/chat/completions", json=body) as response:
                    if response.status_code != 200:
                        raise RuntimeError(f"HTTP {response.status_code}: {await response.aread()}")
                    text, tokens, first, _, _ = await read_stream(response, started)
                return {"text": text, "tokens": tokens, "first": first,
                        "seconds": time.perf_counter() - started}  # fmt: skip

        started = time.perf_counter()
        samples = await asyncio.gather(*(one(m) for m in items))
        return time.perf_counter() - started, samples


def _process_block(ensemble: Ensemble, items, level: int, max_tokens: int):
    config = GenerationConfig(max_new_tokens=max_tokens)

    def one(messages: list[dict]) -> dict:
        started = time.perf_counter()
        parts, first, last = [], None, None
        for delta in ensemble.stream(messages, config):
            if delta.text and first is None:
                first = time.perf_counter() - started
            parts.append(delta.text)
            last = delta
        return {"text": "".join(parts), "tokens": last.stats.tokens, "first": first,
                "seconds": time.perf_counter() - started}  # fmt: skip

    started = time.perf_counter()
    with ThreadPoolExecutor(level, thread_name_prefix="bench-request") as pool:
        samples = list(pool.map(one, items))
    return time.perf_counter() - started, samples


def _row(label, level, mode, wall, samples, cpu: float, client_cpu: float | None) -> dict:
    seconds = [s["seconds"] for s in samples]
    firsts = [s["first"] for s in samples if s["first"] is not None]
    tokens = sum(s["tokens"] for s in samples)
    return {
        "label": label, "level": level, "mode": mode, "requests": len(samples),
        "tokens": tokens, "wall_s": wall, "tokens_per_s": tokens / wall,
        "cpu_s": cpu, "client_cpu_s": client_cpu, "cpu_ms_per_token": 1000 * cpu / tokens,
        "p50_ms": 1000 * _percentile(seconds, 50), "p95_ms": 1000 * _percentile(seconds, 95),
        "ttft_p50_ms": 1000 * _percentile(firsts, 50) if firsts else None,
        "ttft_p95_ms": 1000 * _percentile(firsts, 95) if firsts else None,
    }  # fmt: skip


def run_load(
    *,
    members,
    models: Sequence[Any],
    setups: Sequence[Setup],
    items: Sequence[list[dict]],
    task: str,
    levels: Sequence[int],
    max_new_tokens: int,
    threads: int | None,
    out: str,
    command: str,
    intervals: Sequence[int] = (1,),
    device: str = "cpu",
    dtype: str = "auto",
) -> dict:
    rows: list[dict] = []
    same: dict[str, dict[int, int]] = {}
    log = Path(out) / "servers.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    load_before = os.getloadavg()
    for setup, interval in [(s, i) for s in setups for i in intervals]:
        ensemble = ensemble_for(members, setup, max_concurrency=max(levels))
        label = setup.label if interval == 1 else f"{setup.label}, stream interval {interval}"
        same[label] = {}
        served = server_process(
            models, setup, max(levels), threads, log, interval, device=device, dtype=dtype
        )
        with served as (url, pid):
            for k, level in enumerate(levels):
                texts = {}
                for mode in ("http", "process") if k % 2 == 0 else ("process", "http"):
                    mine, server = cpu_seconds(), cpu_seconds(pid)
                    if mode == "http":
                        wall, samples = asyncio.run(_http_block(url, items, level, max_new_tokens))
                        cpu, client = cpu_seconds(pid) - server, cpu_seconds() - mine
                    else:
                        wall, samples = _process_block(ensemble, items, level, max_new_tokens)
                        cpu, client = cpu_seconds() - mine, None
                    texts[mode] = [s["text"] for s in samples]
                    rows.append(_row(label, level, mode, wall, samples, cpu, client))
                same[label][level] = sum(
                    a == b for a, b in zip(texts["http"], texts["process"], strict=True)
                )
                speeds = {r["mode"]: r["tokens_per_s"] for r in rows[-2:]}
                print(f"{label} x{level}: HTTP {speeds['http']:.0f}, in process "
                      f"{speeds['process']:.0f} tokens/s", flush=True)  # fmt: skip
    result = {
        "command": command, "task": task, "requests": len(items), "levels": list(levels),
        "max_new_tokens": max_new_tokens, "load_before": list(load_before),
        "load_after": list(os.getloadavg()), "rows": rows, "same_text": same,
    }  # fmt: skip
    return write_results(out, result, load_markdown(result))


def load_markdown(result: dict) -> str:
    lines = [
        f"{result['requests']} requests ({result['task']}), greedy, max_tokens="
        f"{result['max_new_tokens']}, streamed (SSE with usage) over HTTP from a pool of c "
        "clients, and streamed in process from c threads; the server is `llm-ensembling serve` "
        "in its own process on the same machine; load average "
        f"{result['load_before'][0]:.2f} before, {result['load_after'][0]:.2f} after.",
        "",
        "| method | clients | HTTP tokens/s | in process | HTTP / in process | p50 ms HTTP / in "
        "process | p95 ms | first text p50 ms | CPU ms per token: server / in process | same "
        "text |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    by = {(r["label"], r["level"], r["mode"]): r for r in result["rows"]}
    for label, levels in result["same_text"].items():
        for level, same in levels.items():
            h, p = by[label, int(level), "http"], by[label, int(level), "process"]
            ratio = h["tokens_per_s"] / p["tokens_per_s"]
            mark = "" if ratio >= GOAL_RATIO else " (below 0.90)"
            lines.append(
                f"| {label} | {level} | {h['tokens_per_s']:.0f} | {p['tokens_per_s']:.0f} | "
                f"{ratio:.2f}{mark} | {h['p50_ms']:.0f} / {p['p50_ms']:.0f} | "
                f"{h['p95_ms']:.0f} / {p['p95_ms']:.0f} | "
                f"{_ms(h['ttft_p50_ms'])} / {_ms(p['ttft_p50_ms'])} | "
                f"{h['cpu_ms_per_token']:.2f} / {p['cpu_ms_per_token']:.2f} | "
                f"{same}/{h['requests']} |"
            )
    lines += [
        "",
        "CPU ms per token: the server process's CPU time over its output tokens, against this "
        "process's in process (the clients' own CPU time is in results.json): what serving "
        "costs in work, whatever share of the machine the run was given.",
    ]
    return "\n".join(lines) + "\n"


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.0f}"


# --------------------------------------------------------------------------- soak

KINDS = ("whole", "stream", "abandon", "disconnect", "malformed")
KIND_SHARES = (0.3, 0.3, 0.15, 0.1, 0.15)
FAULT_RATE = 0.15  # of whole and streamed requests, on methods with more than one member
MALFORMED = (
    b'{"model": "ensemble", "messages": [',
    json.dumps({"model": "nope", "messages": [{"role": "user", "content": "hi"}]}).encode(),
    json.dumps(
        {"model": "ensemble", "messages": [{"role": "user", "content": "hi"}], "n": 2}
    ).encode(),  # fmt: skip
    json.dumps({"model": "ensemble", "messages": "hi"}).encode(),
    json.dumps(
        {"model": "ensemble", "messages": [{"role": "user", "content": "hi"}], "temperature": "hot"}
    ).encode(),  # fmt: skip
    b'{"model": "\xff"}',
)


def _plans(n: int, labels: Sequence[str], active: dict[str, list[str]], problems: int, seed: int):
    rng = random.Random(f"serve-soak/{seed}")
    plans = []
    for index in range(n):
        label = rng.choice(list(labels))
        kind = rng.choices(KINDS, weights=KIND_SHARES)[0]
        plan = {"index": index, "label": label, "kind": kind, "problem": rng.randrange(problems),
                "target": None, "where": None, "chunks": rng.randint(1, 4),
                "wait": rng.uniform(0, 0.05), "bad": rng.randrange(len(MALFORMED))}  # fmt: skip
        if kind in ("whole", "stream") and len(active[label]) > 1 and rng.random() < FAULT_RATE:
            plan["target"] = rng.choice(active[label])
            plan["where"] = rng.choice(("before", "inside"))
        plans.append(plan)
    return plans


async def _disconnect(url: str, body: bytes, wait: float) -> None:
    """Send a whole request, then close the connection before the answer."""
    host, port = url.removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    head = (f"POST /v1/chat/completions HTTP/1.1\r\nHost: {host}:{port}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n")  # fmt: skip
    writer.write(head.encode() + body)
    await writer.drain()
    await asyncio.sleep(wait)
    writer.close()
    with contextlib.suppress(ConnectionError):
        await writer.wait_closed()


async def _soak_one(client: httpx.AsyncClient, urls: dict, plan: dict, messages, max_tokens):
    url = urls[plan["label"]]
    kind = plan["kind"]
    outcome = {**plan, "status": None, "text": "", "failed": {}, "seconds": None}
    started = time.perf_counter()
    if kind == "malformed":
        response = await client.post(url + "/v1/chat/completions", content=MALFORMED[plan["bad"]],
                                     headers={"content-type": "application/json"})  # fmt: skip
        outcome["status"] = response.status_code
        outcome["error_body"] = "error" in response.json()
        return outcome
    if kind == "disconnect":
        await _disconnect(url, json.dumps(chat_body(messages, max_tokens, False)).encode(),
                          plan["wait"])  # fmt: skip
        outcome["status"] = "disconnected"
        return outcome
    if kind == "whole":
        response = await client.post(url + "/v1/chat/completions",
                                     json=chat_body(messages, max_tokens, False))  # fmt: skip
        outcome["status"] = response.status_code
        if response.status_code == 200:
            answer = response.json()
            outcome["text"] = answer["choices"][0]["message"]["content"] or ""
            outcome["failed"] = answer["ensemble"]["failed"]
        outcome["seconds"] = time.perf_counter() - started
        return outcome
    chunks = plan["chunks"] if kind == "abandon" else None
    body = chat_body(messages, max_tokens)
    async with client.stream("POST", url + "/v1/chat/completions", json=body) as response:
        outcome["status"] = response.status_code
        if response.status_code == 200:
            text, _, _, details, finish = await read_stream(response, started, chunks)
            outcome["text"] = text
            outcome["failed"] = (details or {}).get("failed", {})
            outcome["finished"] = finish is not None
    if kind == "stream":
        outcome["seconds"] = time.perf_counter() - started
    return outcome


def run_soak(
    *,
    members,
    models: Sequence[str],
    setups: Sequence[Setup],
    problems: Sequence[list[dict]],
    requests: int,
    clients: int,
    window: int,
    max_new_tokens: int,
    seed: int,
    device: str,
    dtype: str,
    out: str,
    command: str,
) -> dict:
    from core.serve.runner import serve_in_thread
    from core.serve.settings import ServeSettings

    ensembles = {s.label: ensemble_for(members, s, on_member_failure="drop", prefix_reuse=True)
                 for s in setups}  # fmt: skip
    active = {label: [m.name for m in e.active_members] for label, e in ensembles.items()}
    faults = FaultHooks(members)
    index = {m.name: k for k, m in enumerate(members)}
    plans = _plans(requests, list(ensembles), active, len(problems), seed)

    def messages_of(plan: dict) -> list[dict]:
        messages = problems[plan["problem"]]
        if plan["target"] is None:
            return messages
        return faults.poison(messages, index[plan["target"]], plan["where"])

    settings = ServeSettings(log_level="error")
    outcomes, windows = [], []
    load_before = os.getloadavg()
    with contextlib.ExitStack() as stack:
        urls = {label: stack.enter_context(serve_in_thread(settings, lambda e=e: e))[0]
                for label, e in ensembles.items()}  # fmt: skip

        async def soak() -> None:
            slots = asyncio.Semaphore(clients)
            limits = httpx.Limits(max_connections=clients)
            async with httpx.AsyncClient(timeout=600, limits=limits) as client:

                async def one(plan):
                    async with slots:
                        return await _soak_one(client, urls, plan, messages_of(plan),
                                               max_new_tokens)  # fmt: skip

                for number, at in enumerate(range(0, len(plans), window)):
                    part = plans[at : at + window]
                    started = time.perf_counter()
                    done = await asyncio.gather(*(one(p) for p in part))
                    outcomes.extend(done)
                    gc.collect()
                    whole = [o["seconds"] for o in done if o["seconds"] is not None]
                    windows.append({
                        "window": number, "requests_done": at + len(part),
                        "wall_s": time.perf_counter() - started, "rss_mib": rss_kib() / 1024,
                        "threads": threading.active_count(),
                        "p50_ms": 1000 * _percentile(whole, 50) if whole else None,
                        "p95_ms": 1000 * _percentile(whole, 95) if whole else None,
                        "statuses": _counts(str(o["status"]) for o in done),
                    })  # fmt: skip
                    print(f"{at + len(part)} requests, RSS {windows[-1]['rss_mib']:.0f} MiB",
                          flush=True)  # fmt: skip

        asyncio.run(soak())
        deadline = time.monotonic() + 30
        while any(e.admission.running for e in ensembles.values()) and time.monotonic() < deadline:
            time.sleep(0.05)
        held = sum(e.admission.running for e in ensembles.values())
    faults.remove()
    reference = References(models, device, dtype, {s.label: s for s in setups},
                           GenerationConfig(max_new_tokens=max_new_tokens))  # fmt: skip
    for o in outcomes:
        o["verdict"] = _verdict(o, active[o["label"]], reference, messages_of(o))
    result = {
        "command": command, "requests": requests, "clients": clients,
        "labels": list(ensembles), "max_new_tokens": max_new_tokens,
        "load_before": list(load_before), "load_after": list(os.getloadavg()),
        "kinds": _counts(o["kind"] for o in outcomes),
        "statuses": _counts(str(o["status"]) for o in outcomes),
        "faulted": sum(o["target"] is not None for o in outcomes),
        "dropped": sum(bool(o["failed"]) for o in outcomes),
        "faults_fired": dict(faults.fired),
        "server_errors": sum(isinstance(o["status"], int) and o["status"] >= 500
                             for o in outcomes),  # fmt: skip
        "mismatches": sum(o["verdict"] != "ok" for o in outcomes),
        "held_slots": held, "windows": windows,
        "outcomes": outcomes,
    }  # fmt: skip
    return write_results(out, result, soak_markdown(result))


def _verdict(o: dict, members: list[str], reference, messages) -> str:
    status = o["status"]
    if o["kind"] == "disconnect":
        return "ok"
    if o["kind"] == "malformed":
        return "ok" if isinstance(status, int) and 400 <= status < 500 and o["error_body"] else (
            f"mismatch: malformed request answered {status}")  # fmt: skip
    if status != 200:
        return f"mismatch: status {status}"
    dropped = sorted(o["failed"])
    if o["target"] is not None and dropped != [o["target"]]:
        return f"mismatch: the fault on {o['target']} dropped {dropped}"
    if o["target"] is None and dropped:
        return f"mismatch: {dropped} dropped without a fault"
    left = tuple(n for n in members if n not in dropped)
    want = reference(o["label"], messages, left)
    if o["kind"] == "abandon" and not o.get("finished"):
        return "ok" if want.startswith(o["text"]) else "mismatch: not a prefix"
    return "ok" if o["text"] == want else "mismatch: text differs"


def _counts(items) -> dict[str, int]:
    counts: dict[str, int] = {}
    for item in items:
        counts[item] = counts.get(item, 0) + 1
    return dict(sorted(counts.items()))


def soak_markdown(result: dict) -> str:
    windows = result["windows"]
    lines = [
        f"{result['requests']} HTTP requests over {', '.join(result['labels'])} (one server "
        f"each, on_member_failure=\"drop\"), {result['clients']} clients at once, max_tokens="
        f"{result['max_new_tokens']}; load average {result['load_before'][0]:.2f} before, "
        f"{result['load_after'][0]:.2f} after.",
        "",
        "Requests: " + ", ".join(f"{k} {v}" for k, v in result["kinds"].items())
        + f"; {result['faulted']} carried a member fault ({result['dropped']} answered without "
        "that member). Statuses: " + ", ".join(f"{k} {v}" for k, v in result["statuses"].items())
        + ".",
        f"Checked against a fresh ensemble: **{result['mismatches']} wrong answers**, "
        f"**{result['server_errors']} 5xx**, request slots held at the end: "
        f"{result['held_slots']}.",
        "",
        "| requests | RSS MiB | threads | p50 ms | p95 ms | wall s | statuses |",
        "|---|---|---|---|---|---|---|",
    ]  # fmt: skip
    for w in windows:
        statuses = ", ".join(f"{k} {v}" for k, v in w["statuses"].items())
        lines.append(
            f"| {w['requests_done']} | {w['rss_mib']:.1f} | {w['threads']} | {_ms(w['p50_ms'])} "
            f"| {_ms(w['p95_ms'])} | {w['wall_s']:.1f} | {statuses} |"
        )
    if len(windows) > 2:
        warm = windows[1]["rss_mib"]
        lines += ["", f"RSS after warm-up (window 2 → last): {warm:.1f} → "
                  f"{windows[-1]['rss_mib']:.1f} MiB."]  # fmt: skip
    return "\n".join(lines) + "\n"
