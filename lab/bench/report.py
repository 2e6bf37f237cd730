"""Where every benchmark's results go, and what each results file records about its run.

Every benchmark writes `results.json` (everything measured) and `results.md` (the README table)
through `write_results`, which stamps both with the run's provenance: the command, the date,
the machine and the package version, so a table can always be traced to the run that made it.
"""

from __future__ import annotations

import datetime
import json
import os
import platform
from pathlib import Path
from typing import Any

import torch


def provenance(command: str) -> dict[str, Any]:
    """The run's command, date, machine and versions (recorded in every results file)."""
    from core import __version__

    try:
        load = list(os.getloadavg())
    except (AttributeError, OSError):  # not every platform has a load average
        load = None
    return {
        "command": command,
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "machine": {
            "platform": platform.platform(),
            "processor": platform.processor() or platform.machine(),
            "cpus": os.cpu_count(),
            "cuda": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
            "load_average": load,
        },
        "versions": {
            "llm-ensembling": __version__,
            "python": platform.python_version(),
            "torch": torch.__version__,
            "transformers": _version("transformers"),
        },
        "torch_threads": torch.get_num_threads(),
    }


def header(result: dict[str, Any]) -> str:
    """The lines that head a results.md: how to rerun it, when, where, with what."""
    machine, versions = result["machine"], result["versions"]
    where = f"{machine['platform']}, {machine['cpus']} CPUs"
    if machine.get("cuda"):
        where += f", {machine['cuda']}"
    lines = [f"Command: `{result['command']}`", ""] if result.get("command") else []
    lines += [
        f"Run {result['date']} on {where}; llm-ensembling {versions['llm-ensembling']}, "
        f"torch {versions['torch']}, transformers {versions['transformers']}, "
        f"{result['torch_threads']} torch thread(s).",
        "",
    ]
    return "\n".join(lines)


def write_results(out: str | Path, result: dict[str, Any], table: str) -> dict[str, Any]:
    """Write results.json and results.md (the provenance header, then `table`) into `out`;
    returns the result with its provenance."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    result = {**provenance(result.get("command", "")), **result}
    (out / "results.json").write_text(json.dumps(result, indent=1, ensure_ascii=False))
    (out / "results.md").write_text(header(result) + table)
    return result


def pyplot():
    """matplotlib's pyplot on a file backend (benchmarks draw PNGs, never windows)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save_figure(fig, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    fig.clear()
    pyplot().close(fig)
    return path


def _version(package: str) -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(package)
    except PackageNotFoundError:
        return None
