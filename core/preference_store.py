"""Built-in self-preference measurements kept on disk (`self_preference="builtin"`).

The measurement answers the built-in prompts with every member and scores every answer with
every member: 45-72 seconds for a 135M and a 270M model on a CPU. What it measures depends
only on the members and on the measurement itself, so an ensemble built again over the same
member files (a new process, a restarted server, a notebook run again) reads the margins it
measured before. A member that cannot say what it was loaded from (`Member.fingerprint` is
None: a model built in memory, a server) is measured every time.

Kept in `core.user_cache.cache_folder()` / "self-preference", one JSON file per member set,
named by a hash of the members' fingerprints (files with their sizes and modification times,
chat template, stops, dtype, device), the vote score, the prompts, the answer length and this
library's version; a file that cannot be read is measured again and replaced. Delete the folder
to measure everything again.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NoReturn

from .member import Member
from .trust import SelfPreference, read_self_preference
from .user_cache import cache_folder
from .version import __version__

FOLDER = "self-preference"


def measurement_key(
    members: Sequence[Member], score: str, prompts: Sequence[Any], max_new_tokens: int
) -> str | None:
    """The name a measurement over these members is kept under; None when a member has no
    fingerprint."""
    fingerprints = [member.fingerprint for member in members]
    if any(f is None for f in fingerprints):
        return None
    described = {
        "library": __version__,
        "score": score,
        "prompts": list(prompts),
        "max_new_tokens": max_new_tokens,
        "members": fingerprints,
    }
    text = json.dumps(described, sort_keys=True, ensure_ascii=True)
    return hashlib.sha256(text.encode()).hexdigest()


def stored(key: str | None, names: Sequence[str]) -> tuple[bool, SelfPreference | None]:
    """(found, what was measured: None where the members always agreed)."""
    if key is None:
        return False, None

    def fail(problem: str) -> NoReturn:
        raise ValueError(problem)

    try:
        data = json.loads(_path(key).read_text(encoding="utf-8"))
        return True, read_self_preference(data["self_preference"], list(names), fail)
    except (OSError, ValueError, KeyError, TypeError):  # absent, or not what `store` writes
        return False, None


def store(key: str | None, preference: SelfPreference | None) -> None:
    """Keep a measurement (written whole or not at all). A folder that cannot be written to
    costs the next build a measurement, nothing else."""
    if key is None:
        return
    path = _path(key)
    data = {"self_preference": preference.to_json() if preference else None}
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        handle, scratch = tempfile.mkstemp(dir=path.parent, prefix=".writing-", suffix=".json")
        try:
            with os.fdopen(handle, "w", encoding="utf-8") as out:
                json.dump(data, out)
            os.replace(scratch, path)
        finally:
            if os.path.exists(scratch):
                os.unlink(scratch)
    except OSError:
        return


def _path(key: str) -> Path:
    return cache_folder() / FOLDER / f"{key}.json"
