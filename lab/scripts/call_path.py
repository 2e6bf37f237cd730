"""Which files of the core one request passes through, and how often it comes back to one.

Runs `Ensemble.demo(method).generate(...)` on the shipped tiny testbed (greedy, a few tokens;
one untraced request first so lazy imports and warm-up stay out of the count), and follows the
innermost frame from `core/` of every thread with a profile hook:

- files: the distinct core files the request enters, each with how many calls start in it;
- switches: how often the innermost core file changes;
- returns: how often execution enters a file it had already left (a switch to a file seen
  before in that thread);
- edges: the distinct (from, to) pairs of those switches.

    python -m lab.scripts.call_path [--method safe] [--tokens 12] [--files]
    python -m lab.scripts.call_path --serve [--stream]  # a chat request through the server

`--serve` sends one /v1/chat/completions request (a tool offered, so the answer's shaping
runs in full) to `llm-ensembling serve` in a thread of this process and counts the server's
files only (`core/serve/`): the path an answer takes from the ensemble's output to the body.

It reads the core from the outside only (the engine imports nothing from the lab).
"""

from __future__ import annotations

import argparse
import collections
import importlib.util
import sys
import threading
from pathlib import Path

# The core that `import core` finds (run with PYTHONPATH=<another tree> to measure that tree).
CORE = str(Path(importlib.util.find_spec("core").origin).parent) + "/"


class Visits:
    """The core files one thread's execution moves through, in order (repeats collapsed)."""

    def __init__(self) -> None:
        self.visits: list[str] = []
        self.calls: collections.Counter[str] = collections.Counter()


class Tracer:
    """A profile hook for every thread, counting only while `active`, files under `scope`."""

    def __init__(self, scope: str = CORE) -> None:
        self.scope = scope
        self.active = False
        self.paths: dict[int, Visits] = collections.defaultdict(Visits)

    def __call__(self, frame, event: str, arg) -> None:
        if not self.active or event not in ("call", "return"):
            return
        path = self.paths[threading.get_ident()]
        if event == "call":
            name = frame.f_code.co_filename
            if name.startswith(self.scope):
                path.calls[name] += 1
                self._at(path, name)
            return
        caller = frame.f_back  # back in the innermost core frame below this one
        while caller is not None and not caller.f_code.co_filename.startswith(self.scope):
            caller = caller.f_back
        if caller is not None:
            self._at(path, caller.f_code.co_filename)

    @staticmethod
    def _at(path: Visits, name: str) -> None:
        if not path.visits or path.visits[-1] != name:
            path.visits.append(name)


def measure(method: str, tokens: int) -> dict:
    from core import Ensemble

    tracer = Tracer()
    threading.setprofile(tracer)
    sys.setprofile(tracer)
    ensemble = Ensemble.demo(method)
    messages = [{"role": "user", "content": "Name three colours."}]
    first = ensemble.generate(messages, max_new_tokens=tokens, temperature=0).text
    tracer.active = True
    text = ensemble.generate(messages, max_new_tokens=tokens, temperature=0).text
    tracer.active = False
    sys.setprofile(None)
    threading.setprofile(None)
    assert text == first, "the traced request must answer as the untraced one"
    return summary(tracer, text, CORE)


def measure_serve(method: str, tokens: int, stream: bool) -> dict:
    import httpx

    from core import Ensemble
    from core.serve.runner import serve_in_thread
    from core.serve.settings import ServeSettings

    scope = CORE + "serve/"
    tracer = Tracer(scope)
    threading.setprofile(tracer)
    sys.setprofile(tracer)
    body = {
        "model": "ensemble",
        "messages": [{"role": "user", "content": "What is 7 plus 5?"}],
        "tools": [{"type": "function", "function": {"name": "add", "parameters": {
            "type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
            "required": ["a", "b"]}}}],
        "max_tokens": tokens, "temperature": 0, "stream": stream,
    }  # fmt: skip
    settings = ServeSettings(log_level="warning")
    load = lambda: Ensemble.demo(method)  # noqa: E731
    with serve_in_thread(settings, load) as (url, _app), httpx.Client(timeout=300) as client:
        first = client.post(url + "/v1/chat/completions", json=body).text
        tracer.active = True
        text = client.post(url + "/v1/chat/completions", json=body).text
        tracer.active = False
    sys.setprofile(None)
    threading.setprofile(None)
    same = _without_ids(first) == _without_ids(text)
    assert same, f"the traced request must answer as the untraced one:\n{first}\n{text}"
    return summary(tracer, text[:120], scope)


def _without_ids(text: str) -> str:
    """The answer without what differs between any two requests (ids, times)."""
    import re

    return re.sub(r'"(id|created|seconds)": ?("[^"]*"|[\d.]+)', "", text)


def summary(tracer: Tracer, text: str, scope: str) -> dict:
    files: collections.Counter[str] = collections.Counter()
    switches = returns = 0
    edges: set[tuple[str, str]] = set()
    for path in tracer.paths.values():
        files.update(path.calls)
        switches += max(0, len(path.visits) - 1)
        seen: set[str] = set()
        for before, after in zip([None, *path.visits], path.visits, strict=False):
            returns += after in seen
            seen.add(after)
            if before is not None:
                edges.add((before, after))
    short = {name.removeprefix(scope): count for name, count in files.items()}
    return {
        "text": text,
        "files": dict(sorted(short.items(), key=lambda kv: -kv[1])),
        "switches": switches,
        "returns": returns,
        "edges": len(edges),
        "threads": len(tracer.paths),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--method", default="safe")
    parser.add_argument("--tokens", type=int, default=None, help="default: 12, --serve 60")
    parser.add_argument("--files", action="store_true", help="list every file with its calls")
    parser.add_argument("--serve", action="store_true", help="a chat request through the server")
    parser.add_argument("--stream", action="store_true", help="--serve: a streamed request")
    args = parser.parse_args()
    if args.serve:
        result = measure_serve(args.method, args.tokens or 60, args.stream)
    else:
        result = measure(args.method, args.tokens or 12)
    print(f"method={args.method} text={result['text']!r}")
    print(
        f"files entered: {len(result['files'])}  switches: {result['switches']}  "
        f"returns to a file already left: {result['returns']}  distinct edges: "
        f"{result['edges']}  threads: {result['threads']}"
    )
    if args.files:
        for name, count in result["files"].items():
            print(f"  {count:8d}  {name}")


if __name__ == "__main__":
    main()
