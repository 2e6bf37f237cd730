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

It reads the core from the outside only (the engine imports nothing from the lab).
"""

from __future__ import annotations

import argparse
import collections
import sys
import threading
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CORE = str(ROOT / "core") + "/"


class Visits:
    """The core files one thread's execution moves through, in order (repeats collapsed)."""

    def __init__(self) -> None:
        self.visits: list[str] = []
        self.calls: collections.Counter[str] = collections.Counter()


class Tracer:
    """A profile hook for every thread, counting only while `active`."""

    def __init__(self) -> None:
        self.active = False
        self.paths: dict[int, Visits] = collections.defaultdict(Visits)

    def __call__(self, frame, event: str, arg) -> None:
        if not self.active or event not in ("call", "return"):
            return
        path = self.paths[threading.get_ident()]
        if event == "call":
            name = frame.f_code.co_filename
            if name.startswith(CORE):
                path.calls[name] += 1
                self._at(path, name)
            return
        caller = frame.f_back  # back in the innermost core frame below this one
        while caller is not None and not caller.f_code.co_filename.startswith(CORE):
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
    short = {name.removeprefix(CORE): count for name, count in files.items()}
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
    parser.add_argument("--tokens", type=int, default=12)
    parser.add_argument("--files", action="store_true", help="list every file with its calls")
    args = parser.parse_args()
    result = measure(args.method, args.tokens)
    print(f"method={args.method} tokens={args.tokens} text={result['text']!r}")
    print(
        f"core files entered: {len(result['files'])}  switches: {result['switches']}  "
        f"returns to a file already left: {result['returns']}  distinct edges: "
        f"{result['edges']}  threads: {result['threads']}"
    )
    if args.files:
        for name, count in result["files"].items():
            print(f"  {count:8d}  {name}")


if __name__ == "__main__":
    main()
