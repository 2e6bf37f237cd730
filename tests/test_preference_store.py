"""The built-in self-preference is measured once per member set and kept on disk: an ensemble
built again over the same member files (in this process or a new one) reads it and runs no
forward pass; a changed file, a member built in memory, another vote score, or a kept file that
cannot be read measure again; a cache folder that cannot be written costs only the
measurement."""

from __future__ import annotations

import json
import os
import shutil
from contextlib import contextmanager

import pytest

from core import Ensemble, HFMember
from core.user_cache import CACHE_ENV

NAMES = ("tb-gpt2-bpe", "tb-qwen2-spm")


@pytest.fixture
def cache(tmp_path, monkeypatch):
    folder = tmp_path / "cache"
    monkeypatch.setenv(CACHE_ENV, str(folder))
    return folder


@pytest.fixture
def dirs(tiny_dirs, tmp_path):
    """Copies of two tiny models' directories, so a test may touch their files."""
    return [shutil.copytree(tiny_dirs[name], tmp_path / name) for name in NAMES]


def load(dirs) -> list[HFMember]:
    return [HFMember.load(d, device="cpu") for d in dirs]


@contextmanager
def counted(members):
    """The forward passes the members' models run inside the block."""
    calls = [0]

    def count(*_):
        calls[0] += 1

    handles = [m.model.register_forward_hook(count) for m in members]
    try:
        yield calls
    finally:
        for handle in handles:
            handle.remove()


def built(members, method="rerank", **options):
    with counted(members) as calls:
        ens = Ensemble(members, method, self_preference="builtin", **options)
    return ens.summary()["self_preference"], calls[0]


def kept_files(cache) -> list:
    return sorted((cache / "self-preference").glob("*.json"))


def test_a_second_build_over_the_same_files_reads_what_the_first_measured(cache, dirs):
    members = load(dirs)
    measured, passes = built(members)
    assert passes > 0 and set(measured["margins"]) == set(NAMES)
    assert len(kept_files(cache)) == 1
    assert built(members) == (measured, 0)
    assert built(load(dirs)) == (measured, 0)  # loaded again, as a new process loads them
    # the same members voting in SpecEM, with the same score: the same measurement
    assert built(members, "specem") == (measured, 0)


def test_another_score_or_changed_file_is_measured_again(cache, dirs):
    members = load(dirs)
    measured, _ = built(members)
    least, passes = built(members, score="min")
    assert passes > 0 and least["score"] == "min"
    config = dirs[1] / "config.json"
    stat = config.stat()
    os.utime(config, ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))  # as a new download would
    again, passes = built(load(dirs))
    assert passes > 0 and again["margins"] == pytest.approx(measured["margins"])
    assert len(kept_files(cache)) == 3


def test_a_member_built_in_memory_is_measured_every_time(cache, dirs):
    loaded = load(dirs)
    in_memory = [HFMember(m.name, m.model, m.tokenizer) for m in loaded]
    first, passes = built(in_memory)
    assert passes > 0
    assert built(in_memory)[1] > 0
    assert kept_files(cache) == []
    assert built(loaded)[0]["margins"] == pytest.approx(first["margins"])


def test_a_kept_file_that_cannot_be_read_is_measured_again_and_replaced(cache, dirs):
    members = load(dirs)
    measured, _ = built(members)
    [kept] = kept_files(cache)
    kept.write_text('{"self_preference": {"score": "logprob", "margins": {}}}')
    again, passes = built(members)
    assert passes > 0 and again["margins"] == pytest.approx(measured["margins"])
    assert json.loads(kept.read_text())["self_preference"] == again
    assert built(members) == (again, 0)


def test_a_cache_folder_that_cannot_be_written_costs_only_the_measurement(
    tmp_path, monkeypatch, dirs
):
    blocked = tmp_path / "a-file"
    blocked.write_text("not a folder")
    monkeypatch.setenv(CACHE_ENV, str(blocked))
    members = load(dirs)
    measured, passes = built(members)
    assert passes > 0 and set(measured["margins"]) == set(NAMES)
    assert built(members)[1] > 0
    assert blocked.read_text() == "not a folder"


def test_members_loaded_by_hub_id_are_kept_by_their_snapshot(
    cache, tiny_dirs, tmp_path, monkeypatch
):
    """Two members named by hub id, found in a hub cache (offline, as after a download): the
    second build, and a build over the same ids loaded again, read the measurement; a new
    snapshot of one of them (another revision) is measured again."""
    from huggingface_hub import constants

    hub = tmp_path / "hub"
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(hub))

    def publish(name: str, commit: str) -> str:
        repo = hub / f"models--tiny--{name}"
        shutil.copytree(tiny_dirs[name], repo / "snapshots" / commit, dirs_exist_ok=True)
        (repo / "refs").mkdir(exist_ok=True)
        (repo / "refs" / "main").write_text(commit)
        return f"tiny/{name}"

    ids = [publish(name, "a" * 40) for name in NAMES]
    members = [HFMember.load(i, device="cpu", name=n) for i, n in zip(ids, NAMES, strict=True)]
    measured, passes = built(members)
    assert passes > 0
    again = [HFMember.load(i, device="cpu", name=n) for i, n in zip(ids, NAMES, strict=True)]
    assert built(again) == (measured, 0)
    publish(NAMES[1], "b" * 40)  # a new revision of the second member
    newer = [HFMember.load(i, device="cpu", name=n) for i, n in zip(ids, NAMES, strict=True)]
    assert built(newer)[1] > 0


def test_rerank_measures_by_default_and_says_so_once_per_member_set(cache, dirs, caplog):
    members = load(dirs)
    with caplog.at_level("INFO", logger="llm_ensembling"):
        with counted(members) as calls:
            measured = Ensemble(members, "rerank").summary()["self_preference"]
        said = [r.getMessage() for r in caplog.records if r.name == "llm_ensembling"]
        assert calls[0] > 0 and set(measured["margins"]) == set(NAMES)
        assert len(said) == 1 and "kept for later builds" in said[0]
        caplog.clear()
        assert Ensemble(load(dirs), "rerank").summary()["self_preference"] == measured
        assert not [r for r in caplog.records if r.name == "llm_ensembling"]  # read, not measured
