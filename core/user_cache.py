"""The folder where the library keeps what it computed once and may use again across processes
(the real testbed's joined GGUF file, built-in self-preference measurements):
$LLM_ENSEMBLING_CACHE, or ~/.cache/llm-ensembling."""

from __future__ import annotations

import os
from pathlib import Path

CACHE_ENV = "LLM_ENSEMBLING_CACHE"


def cache_folder() -> Path:
    return Path(os.environ.get(CACHE_ENV) or Path.home() / ".cache/llm-ensembling").expanduser()
