"""Benchmark: which of LangChain's standard chat-model integration tests each configuration
passes (`python -m lab.bench.langchain_suite`).

The project's own test suite runs LangChain's standard tests on the shipped tiny models, with the
failures their training explains marked xfail (`tests/test_langchain_standard.py`). This runs the
same suite, unchanged and unmarked, over any members: the real pair (`--real`), or model paths,
so a user can see what a chain or an agent built on `ChatEnsemble` over those members gets,
test by test, against each member alone. Each configuration runs in its own pytest process
(`lab/bench/langchain_suite_cases.py`, greedy), one after the other; the table lists every test
that did not pass everywhere with the first line of each failure.

    python -m lab.bench.langchain_suite --real --max-tokens 64 \
        --config 'smollm2 alone=single:member=0' --config 'gemma alone=single:member=1' \
        --config 'safe, the default=safe' --out lab/results/langchain-suite-real
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ElementTree
from collections.abc import Sequence
from pathlib import Path

import torch

from .langchain_suite_cases import SUITE_ENV
from .report import write_results
from .setups import CONFIG_HELP, Setup, parse_setups

CASES = Path(__file__).with_name("langchain_suite_cases.py")
PASSED, FAILED, SKIPPED = "passed", "failed", "skipped"


def run_suite(setup: Setup, members: dict, max_tokens: int, threads: int) -> dict[str, dict]:
    """Every test of the suite under one configuration: {test: {"outcome", "message"}}."""
    config = {
        **members,
        "method": setup.method,
        "method_options": setup.options,
        **setup.generation,
        "max_tokens": max_tokens,
        "threads": threads,
    }
    with tempfile.TemporaryDirectory() as folder:
        report = Path(folder) / "junit.xml"
        command = [sys.executable, "-m", "pytest", str(CASES), "-p", "no:cacheprovider"]
        command += ["-q", "-o", "junit_family=xunit1", f"--junitxml={report}"]
        env = {**os.environ, SUITE_ENV: json.dumps(config), "HF_HUB_OFFLINE": "1"}
        subprocess.run(command, env=env, check=False, stdout=subprocess.DEVNULL)
        if not report.is_file():  # pytest itself could not start (an import failed, say)
            raise RuntimeError(
                f"pytest wrote no report for {setup.label!r}; run `python -m pytest {CASES}` "
                f"with {SUITE_ENV}='{json.dumps(config)}' to see why."
            )
        return outcomes(report)


def outcomes(report: Path) -> dict[str, dict]:
    """Each test case's outcome and the first line of its failure, from JUnit XML."""
    found = {}
    for case in ElementTree.parse(report).iter("testcase"):
        outcome, message = PASSED, ""
        for tag, kind in (("failure", FAILED), ("error", FAILED), ("skipped", SKIPPED)):
            node = case.find(tag)
            if node is not None:
                outcome, message = kind, first_line(node.get("message") or "")
                break
        found[case.get("name")] = {"outcome": outcome, "message": message}
    return found


def first_line(message: str) -> str:
    """A failure's first line, its exception named without its module."""
    lines = message.strip().splitlines()
    line = re.sub(r"^(?:\w+\.)+(\w+:)", r"\1", lines[0]) if lines else ""
    return line[:160]


def markdown(result: dict) -> str:
    labels = list(result["runs"])
    tests = list(dict.fromkeys(t for run in result["runs"].values() for t in run))
    ran = [t for t in tests if any(result["runs"][lb][t]["outcome"] != SKIPPED for lb in labels)]
    lines = [
        f"{result['members']}; every test max_tokens={result['max_tokens']}, greedy.",
        "",
        "| configuration | passed | failed | skipped |",
        "|---|---|---|---|",
    ]
    for label in labels:
        run = result["runs"][label].values()
        counts = [sum(r["outcome"] == kind for r in run) for kind in (PASSED, FAILED, SKIPPED)]
        lines.append(f"| {label} | {counts[0]} | {counts[1]} | {counts[2]} |")
    uneven = [t for t in ran if any(result["runs"][lb][t]["outcome"] != PASSED for lb in labels)]
    lines += ["", "Tests not passed by every configuration:", ""]
    lines += ["| test | " + " | ".join(labels) + " |", "|---" * (len(labels) + 1) + "|"]
    for test in uneven:
        cells = []
        for label in labels:
            run = result["runs"][label][test]
            cells.append(run["outcome"] + (f": {run['message']}" if run["message"] else ""))
        lines.append(f"| {test} | " + " | ".join(c.replace("|", "/") for c in cells) + " |")
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    p = argparse.ArgumentParser(prog="python -m lab.bench.langchain_suite", description=__doc__)
    p.add_argument("--real", action="store_true", help="the real pair (the `real` extra)")
    p.add_argument("--model", action="append", default=None, help="a member path (repeat)")
    p.add_argument("--config", action="append", required=True, help=CONFIG_HELP)
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--out", required=True)
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)  # each suite process sets its own; this one is recorded
    if args.real == bool(args.model):
        p.error("give --real or --model paths (not both)")
    members = {"real": True} if args.real else {"models": args.model}
    if args.real:
        described = "the real pair (SmolLM2-135M-Instruct, Gemma-3-270M base)"
    else:
        described = "members " + ", ".join(args.model)
    setups = parse_setups([], [], 0, args.config)
    if any(setup.members is not None for setup in setups):
        p.error("members=... is not read here: every configuration runs over --model or --real")
    runs = {}
    for setup in setups:
        runs[setup.label] = run_suite(setup, members, args.max_tokens, args.threads)
        passed = sum(r["outcome"] == PASSED for r in runs[setup.label].values())
        print(f"{setup.label}: {passed} of {len(runs[setup.label])} passed", file=sys.stderr)
    command = "python -m lab.bench.langchain_suite " + shlex.join(argv)
    result = {"command": command, "members": described, "max_tokens": args.max_tokens}
    write_results(args.out, {**result, "runs": runs}, markdown({**result, "runs": runs}))


if __name__ == "__main__":
    main()
