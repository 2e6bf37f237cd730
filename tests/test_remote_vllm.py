"""Remote members against REAL vLLM servers (CPU build), started by .ci/remote.sh.

LLM_ENSEMBLING_SERVERS names a JSON file describing the running servers (name, base_url, model,
tokenizer, pid_file, log, argv, env): two shipped testbed models, tb-gpt2-bpe and tb-qwen2-spm,
served with full-vocabulary log-probs (`--max-logprobs -1`). Without it these tests are skipped.

Checked: every method gives the same greedy text with the members on servers as in-process, on
20 testbed problems; local and remote members mix; a server stopped mid-request gives a clear
error (the server gone, not a timeout), and the ensemble works again once the server is back.

The tests run in file order: the second server is stopped early and restarted in the
background (a CPU vLLM server needs ~40 s to start) while the tests that need only the first
server, and the in-process reference texts, run.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from core import (
    Ensemble,
    GenerationConfig,
    MemberError,
    Remote,
    ServerError,
    TokenizerMismatchError,
)
from core.events import MemberFailed
from core.remote import connect, wait_until_healthy
from core.testbed import MODEL_ORDER, make_problems, model_paths

SERVERS = os.environ.get("LLM_ENSEMBLING_SERVERS")
pytestmark = [
    pytest.mark.remote,
    pytest.mark.skipif(
        not SERVERS, reason="no vLLM servers: .ci/remote.sh starts them and names them"
    ),
]
CONFIG = GenerationConfig(max_new_tokens=64)
METHODS = [  # (method, options, problems): every method on 20, two full-vocabulary extras
    ("single", {}, 20),
    ("token", {}, 20),
    ("safe", {}, 20),
    ("specem", {}, 20),
    ("token", {"aggregator": "gac", "gate": None}, 3),  # every token: every probability read
    ("safe", {"heal": True}, 5),  # heal reads other spellings through branch_logprobs
]
_state: dict = {}  # the outage test hands the restarting server to the test that waits for it


@pytest.fixture(scope="module")
def servers() -> list[dict]:
    with open(SERVERS) as f:
        return json.load(f)


def _spec(server: dict, **kwargs) -> Remote:
    return Remote(server["base_url"], server["model"], server["tokenizer"], **kwargs)


@pytest.fixture(scope="module")
def remote_members(servers):
    members = [connect(_spec(s, timeout=30, retries=3)) for s in servers]
    yield members
    for member in members:
        member.close()


@pytest.fixture(scope="module")
def local_members(servers, shipped_members):
    return [shipped_members[MODEL_ORDER.index(s["name"])] for s in servers]


@pytest.fixture(scope="module")
def references(local_members) -> dict:
    """The in-process texts every equality test compares with."""
    texts = {}
    for method, options, n in METHODS:
        ens = Ensemble(local_members, method, **options)
        texts[method, repr(options)] = [
            (out.text, out.stats.ensembled_tokens)
            for out in (ens.generate(p.messages, CONFIG) for p in make_problems(n, seed=1))
        ]
    return texts


def test_members_connect_with_full_vocabulary(remote_members, local_members):
    for remote, local in zip(remote_members, local_members, strict=True):
        assert remote.full_vocab and remote.vocab.size == local.vocab.size
        assert remote.stop_ids == local.stop_ids
        assert remote.context_window == 2047  # --max-model-len 2048, one position kept free


def test_server_stopped_mid_request_is_dropped_or_named(servers, remote_members):
    """With on_member_failure="drop" the requests in flight when a server dies complete with the
    other member (a member_failed event says who); with "raise" the error names the member and
    its URL."""
    server = servers[-1]
    ens = Ensemble(remote_members, "token")
    dropping = Ensemble(remote_members, "token", on_member_failure="drop")
    problem = make_problems(1, seed=3)[0]
    _state["want"] = ens.generate(problem.messages, CONFIG).text
    with open(server["pid_file"]) as f:
        pid = int(f.read())

    def stop() -> None:
        os.killpg(pid, signal.SIGTERM)  # the server's process group: API server and engine

    threading.Timer(0.5, stop).start()  # while requests are in flight
    for _ in range(1000):
        out = dropping.generate(problem.messages, CONFIG)
        if out.stats.failed:
            break
    assert list(out.stats.failed) == [server["name"]] and out.finish_reason in ("stop", "length")
    failed = [e for e in out.events if isinstance(e, MemberFailed)]
    assert [e.member for e in failed] == [server["name"]] and server["base_url"] in failed[0].error
    with pytest.raises(MemberError, match=rf"'{server['name']}'.*{server['base_url']}") as error:
        ens.generate(problem.messages, CONFIG)
    assert isinstance(error.value, ServerError) and error.value.member == server["name"]
    assert "no answer" not in str(error.value)  # the server's going, not the 30 s timeout
    _state["ensemble"], _state["problem"] = ens, problem
    env = {**os.environ, **server["env"]}
    with open(server["log"], "a") as log:  # back again, in the background
        process = subprocess.Popen(
            server["argv"], env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
    with open(server["pid_file"], "w") as f:  # .ci/remote.sh stops whatever PID is here
        f.write(str(process.pid))


# --- while the second server restarts: tests that need only the first ---------------------------


def test_a_different_tokenizer_is_refused(servers):
    other = model_paths()[MODEL_ORDER.index(servers[1]["name"])]
    with pytest.raises(TokenizerMismatchError, match="--tokenizer"):
        connect(Remote(servers[0]["base_url"], model=servers[0]["model"], tokenizer=str(other)))


def test_local_and_remote_members_mix(servers, local_members):
    # the first server's model on its server, the second in-process
    mixed = Ensemble.from_pretrained(
        [_spec(servers[0]), model_paths()[MODEL_ORDER.index(servers[1]["name"])]],
        "specem",
        device="cpu",
    )
    assert [type(m).__name__ for m in mixed.members] == ["RemoteMember", "HFMember"]
    local = Ensemble(local_members, "specem")
    for problem in make_problems(5, seed=2):
        assert mixed.generate(problem.messages, CONFIG).text == (
            local.generate(problem.messages, CONFIG).text
        )


def test_the_ensemble_works_once_the_server_is_back(servers, references):
    back = wait_until_healthy(servers[-1]["base_url"], timeout=240)
    assert back, f"the server did not come back; see {servers[-1]['log']}"
    ens, problem = _state["ensemble"], _state["problem"]
    assert ens.generate(problem.messages, CONFIG).text == _state["want"]


# --- both servers: every method gives the in-process text ----------------------------------------


@pytest.mark.parametrize(("method", "options", "n"), METHODS, ids=lambda v: str(v))
def test_same_greedy_text_as_in_process(method, options, n, remote_members, references):
    remote = Ensemble(remote_members, method, **options)
    want = references[method, repr(options)]
    got = [(o.text, o.stats.ensembled_tokens) for o in (
        remote.generate(p.messages, CONFIG) for p in make_problems(n, seed=1)
    )]  # fmt: skip
    differ = [(i, w, g) for i, (w, g) in enumerate(zip(want, got, strict=True)) if w != g]
    assert not differ, differ


def test_concurrent_requests_reach_the_servers_together(remote_members, references):
    """Eight requests at once send their operations to the servers concurrently (the servers
    batch them): the same texts as one at a time, the requests overlap, and the throughput
    ratio is printed for the CI log (a benchmark number, not asserted here)."""
    ens = Ensemble(remote_members, "specem")
    problems = make_problems(8, seed=1)
    start = time.perf_counter()
    alone = [ens.generate(p.messages, CONFIG) for p in problems]
    sequential = time.perf_counter() - start
    spans: list[tuple[float, float]] = []

    def timed(problem):
        began = time.perf_counter()
        out = ens.generate(problem.messages, CONFIG)
        spans.append((began, time.perf_counter()))
        return out

    start = time.perf_counter()
    with ThreadPoolExecutor(8) as pool:
        together = list(pool.map(timed, problems))
    concurrent = time.perf_counter() - start
    assert [o.text for o in together] == [o.text for o in alone]
    assert max(b for b, _ in spans) < min(e for _, e in spans)  # all eight were in flight at once
    tokens = sum(o.stats.tokens for o in alone)
    print(
        f"\nremote specem, 8 requests: {tokens / sequential:.1f} tok/s one at a time, "
        f"{tokens / concurrent:.1f} tok/s concurrently ({sequential / concurrent:.2f}x)"
    )
