"""How much of each remote member's prompt work vLLM's prefix cache saves, per method.

Every request an ensemble sends is the committed text plus a little more; with prefix caching
(on by default in vLLM) the server finds that prefix's KV blocks already computed. This reads
the servers' own counters (`vllm:prefix_cache_queries` / `_hits`, in prompt tokens) around a
few greedy requests per method and prints the share of prompt tokens served from the cache.

    bash .ci/remote.sh serve &      # prints: export LLM_ENSEMBLING_SERVERS=...
    LLM_ENSEMBLING_SERVERS=... python -m lab.bench.prefix_cache --n 10
"""

from __future__ import annotations

import argparse
import json
import os
import re

import httpx

from core import Ensemble, GenerationConfig, Remote
from core.remote import connect
from core.testbed import make_problems

COUNTER = re.compile(r"^vllm:prefix_cache_(queries|hits)_total\{[^}]*\}\s+([0-9.e+]+)$", re.M)


def counters(base_url: str) -> dict[str, float]:
    text = httpx.get(base_url.removesuffix("/v1") + "/metrics", timeout=10).text
    found = {"queries": 0.0, "hits": 0.0}
    for kind, value in COUNTER.findall(text):
        found[kind] += float(value)
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=10)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    args = parser.parse_args()
    with open(os.environ["LLM_ENSEMBLING_SERVERS"]) as f:
        servers = json.load(f)
    members = [connect(Remote(s["base_url"], s["model"], s["tokenizer"])) for s in servers]
    config = GenerationConfig(max_new_tokens=args.max_new_tokens)
    problems = make_problems(args.n, seed=1)
    print("| method | prompt tokens sent to the servers | served from the prefix cache |")
    print("|---|---|---|")
    for method in ("single", "token", "safe", "specem"):
        ensemble = Ensemble(members, method)
        before = [counters(s["base_url"]) for s in servers]
        for problem in problems:
            ensemble.generate(problem.messages, config)
        after = [counters(s["base_url"]) for s in servers]
        queries = sum(a["queries"] - b["queries"] for a, b in zip(after, before, strict=True))
        hits = sum(a["hits"] - b["hits"] for a, b in zip(after, before, strict=True))
        share = f"{100 * hits / queries:.1f} %" if queries else "–"
        print(f"| {method} | {queries:,.0f} | {share} |")


if __name__ == "__main__":
    main()
