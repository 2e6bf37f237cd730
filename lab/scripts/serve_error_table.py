"""Send every bad request of `tests/serve_bad_requests.py` to a real server on the shipped
models and write the answers into README.md, between the serve-errors markers (the test
`tests/test_serve_errors.py` checks that the README shows exactly this).

    python -m lab.scripts.serve_error_table
"""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT / "tests")]  # the request rows are the test suite's
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from serve_bad_requests import ROWS, Servers, markdown  # noqa: E402

from core import Ensemble  # noqa: E402

START, END = "<!-- serve-errors:start -->", "<!-- serve-errors:end -->"


def main() -> None:
    servers = Servers(Ensemble.demo("safe", max_concurrency=1, max_queue=0))
    try:
        table = markdown(ROWS, [servers.answer(row)[:2] for row in ROWS])
    finally:
        servers.close()
    readme = ROOT / "README.md"
    text = readme.read_text(encoding="utf-8")
    pattern = re.compile(re.escape(START) + r"\n.*?\n" + re.escape(END), re.S)
    if not pattern.search(text):
        sys.exit(f"README.md has no {START} ... {END} section to fill.")
    readme.write_text(pattern.sub(lambda _: f"{START}\n{table}\n{END}", text), encoding="utf-8")
    print(f"wrote {len(ROWS)} rows into README.md")


if __name__ == "__main__":
    main()
