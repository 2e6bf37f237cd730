"""`python -m lab bench | soak`: the benchmarks' command line (arguments in `lab.bench.commands`),
parsed and run the way `llm-ensembling` runs its own commands."""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from core.cli import run

from .bench.commands import add_commands


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m lab", description="Measure the ensembling methods side by side."
    )
    add_commands(parser.add_subparsers(dest="command", required=True))
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    return run(build_parser(), argv)
