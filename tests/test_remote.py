"""Remote members against an in-process stand-in for vLLM (tests/fake_server.py): the same
numbers as in-process members, one request per operation, the same greedy text for every method,
mixing with local members, and clear errors when a server is wrong, slow or down.

The real-vLLM versions of these checks are in test_remote_vllm.py (marked `remote`)."""

from __future__ import annotations

import re
import shutil
import socket
import threading
import time

import pytest
import torch
from conftest import needs_trained
from fake_server import FakeServer

from core import (
    Ensemble,
    GenerationConfig,
    InvalidConfigError,
    Remote,
    ServerError,
    TokenizerMismatchError,
)
from core.parallel import each, places
from core.remote import connect
from core.sampling import Sampler
from core.testbed import make_problems, model_paths

pytestmark = needs_trained
QUESTION = "Tom has 7 apples. He buys 5 more. How many?"
PROMPT = [{"role": "user", "content": QUESTION}]


@pytest.fixture(scope="module")
def servers():
    """The first two shipped models (bpe, spm), each behind a fake vLLM server."""
    paths = model_paths()[:2]
    fakes = [FakeServer(path, name=path.name) for path in paths]
    yield fakes
    for fake in fakes:
        fake.stop()


def _specs(fakes, **kwargs) -> list[Remote]:
    return [Remote(f.url, model=f.name, tokenizer=f.root, **kwargs) for f in fakes]


@pytest.fixture(scope="module")
def remotes(servers):
    members = [connect(spec) for spec in _specs(servers)]
    yield members
    for member in members:
        member.close()


# --- one member: same numbers, one request per operation ---------------------------------------


def test_member_operations_match_in_process(servers, remotes, shipped_members):
    fake, remote, local = servers[1], remotes[1], shipped_members[1]
    try:
        _operations_match(fake, remote, local)
    finally:
        local.release()  # the shared member's key/value row goes back to its store


def _operations_match(fake, remote, local) -> None:
    assert remote.full_vocab and remote.vocab.size == local.vocab.size
    assert remote.stop_ids == local.stop_ids and remote.name == local.name
    for member in (remote, local):
        member.start(PROMPT)
    greedy = Sampler(GenerationConfig())
    calls = fake.counts["/v1/completions"]
    d_remote, d_local = remote.draft(6, greedy), local.draft(6, greedy)
    assert fake.counts["/v1/completions"] == calls + 1  # the draft: one request, rows not read
    assert d_remote.ids == d_local.ids and remote.text == local.text
    torch.testing.assert_close(d_remote.logprobs, d_local.logprobs, atol=1e-4, rtol=0)
    assert fake.counts["/v1/completions"] == calls + 2  # the rows: one more, on first read
    rows = remote.logprobs([0, 2, remote.n_tokens])
    torch.testing.assert_close(rows, local.logprobs([0, 2, local.n_tokens]), atol=1e-4, rtol=0)
    assert fake.counts["/v1/completions"] == calls + 3
    base = remote.text[:4]
    conts = [remote.text[4:], " 12 apples", ""]
    got = remote.score(conts, base=base, ends=[True, False, True])
    want = local.score(conts, base=base, ends=[True, False, True])
    assert fake.counts["/v1/completions"] == calls + 4
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w, atol=1e-4, rtol=0)
    branches = [[local.ids[0]], [5, 6, 7]]
    torch.testing.assert_close(
        remote.branch_logprobs(1, branches), local.branch_logprobs(1, branches), atol=1e-4, rtol=0
    )
    assert remote.text == local.text  # scoring and branches leave the text alone
    with pytest.raises(InvalidConfigError, match="score='logprob'"):
        remote.score(["x"], raw=True)


# --- every method: the same greedy text as in-process ------------------------------------------

METHODS = [
    ("single", {}),
    ("token", {}),
    ("token", {"aggregator": "gac", "gate": None}),  # every token: the verifiers are read
    ("safe", {}),
    ("safe", {"heal": True}),  # heal reads spellings through branch_logprobs
    ("specem", {}),
]


@pytest.mark.parametrize(("method", "options"), METHODS, ids=lambda v: str(v))
def test_methods_match_in_process(method, options, remotes, shipped_members):
    remote = Ensemble(remotes, method, **options)
    local = Ensemble(shipped_members[:2], method, **options)
    config = GenerationConfig(max_new_tokens=40)
    consulted, healed = 0, 0
    for problem in make_problems(3, seed=6):
        want = local.generate(problem.messages, config)
        got = remote.generate(problem.messages, config)
        assert got.text == want.text
        assert got.finish_reason == want.finish_reason
        assert got.stats.tokens == want.stats.tokens
        assert got.stats.ensembled_tokens == want.stats.ensembled_tokens
        consulted += got.stats.ensembled_tokens + got.stats.counts.get("skip_consensus", 0)
        healed += got.stats.counts.get("healed_positions", 0)
    assert consulted > 0 or method == "single"  # the remote verifiers were really read
    assert healed > 0 or not options.get("heal")


def test_mixed_local_and_remote_from_pretrained(servers, shipped_members):
    spec = _specs(servers[:1])[0]
    mixed = Ensemble.from_pretrained([spec, model_paths()[1]], "specem", device="cpu")
    assert [type(m).__name__ for m in mixed.members] == ["RemoteMember", "HFMember"]
    local = Ensemble(shipped_members[:2], "specem")
    config = GenerationConfig(max_new_tokens=40)
    for problem in make_problems(2, seed=7):
        assert mixed.generate(problem.messages, config).text == (
            local.generate(problem.messages, config).text
        )
    assert len(places(mixed.members)) == 2  # the remote member overlaps with the local one


def test_seeded_sampling_is_reproducible(remotes):
    ens = Ensemble(remotes, "specem")
    config = GenerationConfig(max_new_tokens=30, temperature=1.0, seed=11)
    first = ens.generate(PROMPT, config).text
    assert ens.generate(PROMPT, config).text == first
    assert ens.generate(PROMPT, GenerationConfig(30, temperature=1.0, seed=12)).text != first


def test_logit_scores_fail_at_the_boundary(remotes):
    with pytest.raises(InvalidConfigError, match="raw logits"):
        Ensemble(remotes, "specem", score="logit")


# --- what the server allows ------------------------------------------------------------------


def test_top_k_server_falls_back_and_stays_exact_for_argmax(shipped_members):
    path = model_paths()[0]
    with FakeServer(path, name="bpe", max_logprobs=5) as fake:
        member = connect(Remote(fake.url, tokenizer=str(path)))
        assert (member.top_k, member.full_vocab) == (5, False)
        member.start(PROMPT)
        row = member.logprobs([0])[0]
        assert torch.isclose(row.exp().sum(), torch.tensor(1.0), atol=1e-4)  # rest spread out
        config = GenerationConfig(max_new_tokens=40)
        got = Ensemble([member], "single").generate(PROMPT, config).text
        assert got == Ensemble(shipped_members[:1], "single").generate(PROMPT, config).text
        with pytest.raises(InvalidConfigError, match="--max-logprobs -1"):
            connect(Remote(fake.url, tokenizer=str(path), top_logprobs=10))


def test_tokenizer_mismatch_is_caught_at_connection():
    bpe, spm = model_paths()[:2]
    with FakeServer(bpe, name="bpe", tokenizer_dir=spm) as fake:
        with pytest.raises(TokenizerMismatchError, match="--tokenizer"):
            connect(Remote(fake.url, tokenizer=str(bpe)))
        connect(Remote(fake.url, tokenizer=str(bpe), check_tokenizer=False)).close()


def test_wrong_model_name_lists_what_is_served(servers):
    with pytest.raises(InvalidConfigError, match="tb-gpt2-bpe"):
        connect(Remote(servers[0].url, model="nope", tokenizer=servers[0].root))


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"base_url": "localhost:8000"}, "http"),
        ({"base_url": "http://h:1/v1", "top_logprobs": 0}, "top_logprobs"),
        ({"base_url": "http://h:1/v1", "timeout": 0}, "timeout"),
        ({"base_url": "http://h:1/v1", "retries": -1}, "retries"),
        ({"base_url": "http://h:1/v1", "max_answer_bytes": 0}, "max_answer_bytes"),
        ({"base_url": "http://h:1/v1", "api_key": 123}, "credential must be a string"),
        ({"base_url": "http://h:1/v1", "api_key": "k", "basic_auth": "u:p"}, "not both"),
        ({"base_url": "http://u:p@h:1/v1", "basic_auth": "u:p"}, "one way"),
        ({"base_url": "http://h:1/v1", "verify": "/no/such/ca.pem"}, "no such file"),
        ({"base_url": "http://h:1/v1", "verify": 1.5}, "verify=1.5"),
        ({"base_url": "http://h:1/v1", "verify": "NOT_PEM"}, "not a CA bundle"),
        ({"base_url": "http://h:1/v1", "cert": "/no/such/cert.pem"}, "not a file"),
        ({"base_url": "http://h:1/v1", "cert": ("a", "b", "c")}, "cert="),
        ({"base_url": "http://h:1/v1", "cert": "NOT_PEM"}, "not a client certificate"),
    ],
)
def test_bad_specs_fail_at_construction(kwargs, match, tmp_path):
    not_pem = tmp_path / "not.pem"
    not_pem.write_text("hello")
    kwargs = {k: str(not_pem) if v == "NOT_PEM" else v for k, v in kwargs.items()}
    with pytest.raises(InvalidConfigError, match=match):
        Remote(**kwargs)


def test_base_url_without_path_gets_v1():
    assert Remote("http://127.0.0.1:8000").base_url == "http://127.0.0.1:8000/v1"
    assert Remote("http://127.0.0.1:8000/v1/").base_url == "http://127.0.0.1:8000/v1"


# --- failures: retries, timeouts, a server that goes away and comes back -----------------------


def test_dropped_connections_and_503_are_retried(servers, remotes):
    fake = servers[0]
    fake.faults = ["drop", "503"]
    out = Ensemble(remotes, "token").generate(PROMPT, GenerationConfig(max_new_tokens=4))
    assert out.stats.tokens > 0 and not fake.faults


def test_slow_server_times_out_with_a_clear_error():
    path = model_paths()[0]
    with FakeServer(path, name="bpe") as fake:
        member = connect(Remote(fake.url, tokenizer=str(path), timeout=0.5))
        ens = Ensemble([member], "single")
        fake.gate.clear()  # the server takes the request and never answers while closed
        opener = threading.Timer(60, fake.gate.set)  # a client that never gives up fails, late
        opener.start()
        before = fake.counts["/v1/completions"]
        timed_out = r"'bpe'.*no answer from http://127\.0\.0\.1.*0\.5 s"
        try:
            with pytest.raises(ServerError, match=timed_out):
                ens.generate(PROMPT, GenerationConfig(max_new_tokens=4))
            assert fake.held.is_set() and not fake.gate.is_set()  # raised while still held back
            assert fake.counts["/v1/completions"] == before + 1  # a timeout is not retried
        finally:
            opener.cancel()
            fake.gate.set()


def test_server_down_mid_request_then_back(shipped_members):
    path = model_paths()[1]
    with FakeServer(path, name="spm") as fake:
        spec = Remote(fake.url, tokenizer=str(path), timeout=5, retries=2)
        ens = Ensemble.from_pretrained([model_paths()[0], spec], "token", device="cpu")
        config = GenerationConfig(max_new_tokens=24)
        want = ens.generate(PROMPT, config).text
        fake.held.clear()
        fake.gate.clear()

        def stop_while_a_request_is_held() -> None:
            if fake.held.wait(60):
                fake.stop()  # cuts the open connection, as a dying server does

        threading.Thread(target=stop_while_a_request_is_held, daemon=True).start()
        # "down or unreachable" is the retries' verdict, not the 5 s timeout's ("no answer")
        with pytest.raises(ServerError, match=rf"'spm'.*{fake.url}.*down or unreachable"):
            ens.generate(PROMPT, config)
        assert fake.held.is_set()  # the request was in flight when the server went
        fake.gate.set()
        fake.start()  # back, on the same port
        assert ens.generate(PROMPT, config).text == want


# --- concurrency --------------------------------------------------------------------------------


def test_remote_members_overlap_and_local_ones_do_not(shipped_members):
    paths = model_paths()[:2]
    fakes = [FakeServer(p, name=p.name, delay=0.3) for p in paths]
    try:
        members = [connect(Remote(f.url, tokenizer=f.root)) for f in fakes]
        for m in members:
            m.start(PROMPT)
        each(members, lambda m: m.logprobs([0]))
        (a_in, a_out), (b_in, b_out) = (f.spans[-1] for f in fakes)
        assert a_in < b_out and b_in < a_out  # each arrived before the other was answered
    finally:
        for f in fakes:
            f.stop()
    threads = each(shipped_members, lambda m: threading.get_ident())
    assert set(threads) == {threading.get_ident()}  # CPU members: in order, in this thread
    assert places(shipped_members) == [[0, 1, 2]]


def test_errors_surface_after_every_lane_finished(remotes):
    log, raised = [], threading.Event()

    def work(member):
        if member is remotes[0]:
            raise RuntimeError("boom")
        raised.wait(0.5)  # an `each` that raised at once would wake this place before it logs
        log.append("other place finished")

    with pytest.raises(RuntimeError, match="boom"):
        each(remotes, work)
    log.append("each raised")
    raised.set()
    assert log == ["other place finished", "each raised"]


# --- adapters -------------------------------------------------------------------------------------


def test_langchain_accepts_remote_specs(servers, shipped_members):
    from langchain_ensemble import ChatEnsemble

    spec = _specs(servers[:1])[0]
    chat = ChatEnsemble(models=[spec, str(model_paths()[1])], method="token", max_tokens=8)
    assert chat.model_name == "ensemble-token:tb-gpt2-bpe+tb-qwen2-spm"
    local = ChatEnsemble.from_ensemble(Ensemble(shipped_members[:2], "token"), max_tokens=8)
    got = chat.invoke(QUESTION).content
    assert got and got == local.invoke(QUESTION).content  # greedy: the in-process answer
    as_dict = {"base_url": spec.base_url, "tokenizer": spec.tokenizer}
    as_dict = ChatEnsemble(models=[as_dict, str(model_paths()[1])], method="token")
    assert as_dict.models[0] == Remote(spec.base_url, tokenizer=spec.tokenizer)


def test_llamaindex_accepts_remote_specs(servers, shipped_members):
    from llamaindex_ensemble import EnsembleLLM

    spec = _specs(servers[1:])[0]
    llm = EnsembleLLM(models=[str(model_paths()[0]), spec], method="safe", max_new_tokens=8)
    assert llm.metadata.model_name == "ensemble-safe:tb-gpt2-bpe+tb-qwen2-spm"
    local = EnsembleLLM(ensemble=Ensemble(shipped_members[:2], "safe"), max_new_tokens=8)
    got = llm.complete(QUESTION).text
    assert got and got == local.complete(QUESTION).text  # greedy: the in-process answer


# --- bench --------------------------------------------------------------------------------------


def test_bench_remote_mode_twins_every_configuration(servers, tmp_path):
    import json

    from lab.cli import main

    out = tmp_path / "bench"
    args = ["bench", "--methods", "single,specem", "--n", "2", "--max-new-tokens", "10"]
    args += ["--threads", "1", "--out", str(out)]
    for path, fake in zip(model_paths()[:2], servers, strict=True):
        args += ["--model", str(path), "--remote", fake.url]
    assert main(args) == 0
    data = json.loads((out / "results.json").read_text())
    rows = {row["label"]: row for row in data["rows"]}
    local = ["single tb-gpt2-bpe", "single tb-qwen2-spm", "specem"]
    assert set(rows) == {*local, *(f"{label} (served)" for label in local)}
    for label in local:
        here, there = rows[label], rows[f"{label} (served)"]
        assert there["members"] == [2 + i for i in (here["members"] or [0, 1])]
        assert there["accuracy"] == here["accuracy"]  # greedy: the same answers
        assert there["ratio_to_in_process"] == pytest.approx(
            there["ms_per_token"] / here["ms_per_token"]
        )
    # a served single is its own drafter reference, not the in-process one
    assert rows["single tb-qwen2-spm (served)"]["ratio_to_drafter"] == pytest.approx(1.0)
    assert "× in-process" in (out / "results.md").read_text()


def test_bench_remote_needs_one_url_per_model(servers, tmp_path, capsys):
    from lab.cli import main

    args = ["bench", "--methods", "single", "--n", "1", "--out", str(tmp_path)]
    args += ["--model", str(model_paths()[0]), "--model", str(model_paths()[1])]
    assert main([*args, "--remote", servers[0].url]) != 0
    assert "one server URL per model" in capsys.readouterr().err


def test_wait_until_healthy(servers):
    from core.remote import wait_until_healthy

    assert wait_until_healthy(servers[0].url, timeout=5)
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    assert not wait_until_healthy(f"http://127.0.0.1:{port}/v1", timeout=1.5)  # gives up


@pytest.mark.parametrize("method", ["single", "safe", "specem"])
def test_remote_members_keep_to_the_grammar(method, remotes, shipped_members):
    """A served draft is cut at its first token the grammar rejects (the server drafts without
    it), so served members give the same valid answer as in-process ones."""
    import json

    schema = {"type": "object", "properties": {"answer": {"type": "integer", "minimum": 0,
              "maximum": 99}}, "required": ["answer"]}  # fmt: skip
    config = GenerationConfig(max_new_tokens=40, response_format=schema)
    local = Ensemble(shipped_members[:2], method).generate(PROMPT, config)
    remote = Ensemble(remotes, method).generate(PROMPT, config)
    assert remote.text == local.text and remote.finish_reason == "stop"
    assert 0 <= json.loads(remote.text)["answer"] <= 99


# --- credentials: never shared, never shown ----------------------------------------------------

KEY = "sk-test-KEY-never-shown"
PASSWORD = "pw-never-shown"


@pytest.fixture(scope="module")
def locked():
    """A served member that refuses requests without the key KEY (vLLM's --api-key)."""
    path = model_paths()[0]
    with FakeServer(path, name=path.name, api_key=KEY) as fake:
        yield fake


@pytest.mark.parametrize("adapter", ["langchain", "llamaindex"])
def test_a_wrong_key_never_borrows_a_right_keys_engine(adapter, locked):
    from langchain_ensemble import ChatEnsemble
    from llamaindex_ensemble import EnsembleLLM

    def ask(api_key: str | None) -> str:
        spec = Remote(locked.url, tokenizer=locked.root, api_key=api_key, retries=0)
        if adapter == "langchain":
            return ChatEnsemble(models=[spec], method="single", max_tokens=4).invoke(QUESTION).text
        return EnsembleLLM(models=[spec], method="single", max_new_tokens=4).complete(QUESTION).text

    assert ask(KEY)  # loads an engine authenticated with the key
    for wrong in ("sk-test-wrong", None):
        with pytest.raises(ServerError, match="answered 401"):
            ask(wrong)  # a configuration equal but for the key gets an engine of its own


def test_keys_never_show_in_reprs_dumps_or_pickles(locked):
    import dataclasses
    import pickle

    from pydantic import SecretStr

    from langchain_ensemble import ChatEnsemble
    from llamaindex_ensemble import EnsembleLLM

    port = locked.port
    specs = [
        Remote(locked.url, tokenizer=locked.root, api_key=KEY),
        Remote(locked.url, tokenizer=locked.root, api_key=SecretStr(KEY)),
        Remote(f"http://alice:{PASSWORD}@127.0.0.1:{port}/v1", tokenizer=locked.root),
    ]
    chat = ChatEnsemble(models=specs, method="token")
    chat_from_dicts = ChatEnsemble(
        models=[{"base_url": locked.url, "api_key": KEY}], method="single"
    )
    llm = EnsembleLLM(models=specs, method="token")
    shown = [
        *(repr(s) for s in specs),
        *(str(dataclasses.asdict(s)) for s in specs),
        str(chat.model_dump()),
        chat.model_dump_json(),
        repr(chat),
        chat.model_name,
        chat_from_dicts.model_dump_json(),
        str(llm.to_dict()),
        llm.to_json(),
        repr(llm),
    ]
    pickles = [pickle.dumps(x) for x in (*specs, chat, llm)]
    for secret in (KEY, PASSWORD):
        assert not any(secret in text for text in shown)
        assert not any(secret.encode() in data for data in pickles)
    assert specs[0] == specs[1] != Remote(locked.url, tokenizer=locked.root, api_key="other")
    assert specs[2].base_url == f"http://127.0.0.1:{port}/v1"
    assert ChatEnsemble(**chat.model_dump()).models[0] == Remote(locked.url, tokenizer=locked.root)
    # a pickle is a file: the key was never in it, and the unpickled spec says so when used
    with pytest.raises(InvalidConfigError, match="pickled"):
        connect(pickle.loads(pickles[0]))


def test_url_credentials_authenticate_and_never_show(servers):
    import base64

    fake = servers[0]
    spec = Remote(f"http://alice:{PASSWORD}@127.0.0.1:{fake.port}/v1", tokenizer=fake.root)
    member = connect(spec)
    try:
        token = base64.b64encode(f"alice:{PASSWORD}".encode()).decode()
        assert fake.authorizations[-1] == f"Basic {token}"  # sent as HTTP basic auth
        assert PASSWORD not in member.name and PASSWORD not in spec.label
    finally:
        member.close()
    with pytest.raises(InvalidConfigError) as wrong_model:
        connect(Remote(f"http://alice:{PASSWORD}@127.0.0.1:{fake.port}", model="nope"))
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(ServerError, match="down or unreachable") as down:
        connect(Remote(f"http://alice:{PASSWORD}@127.0.0.1:{port}/v1", retries=0))
    with pytest.raises(InvalidConfigError) as not_http:
        Remote(f"alice:{PASSWORD}@127.0.0.1:{port}/v1")
    for error in (wrong_model, down, not_http):
        assert PASSWORD not in str(error.value)


def test_basic_credentials_echoed_in_base64_never_show(locked):
    import base64

    spec = Remote(
        f"http://alice:{PASSWORD}@127.0.0.1:{locked.port}/v1", tokenizer=locked.root, retries=0
    )
    with pytest.raises(ServerError, match=r"answered 401: Unauthorized") as refused:
        connect(spec)  # the server echoes the Basic header it got
    token = base64.b64encode(f"alice:{PASSWORD}".encode()).decode()
    assert token.rstrip("=") not in str(refused.value) and PASSWORD not in str(refused.value)


def test_server_errors_are_quoted_short_and_without_the_key(locked):
    wrong = "sk-test-wrong-and-secret"
    with pytest.raises(ServerError, match=r"answered 401: Unauthorized") as refused:
        connect(Remote(locked.url, tokenizer=locked.root, api_key=wrong, retries=0))
    message = str(refused.value)
    assert wrong not in message  # the server echoed the header; the error does not
    assert "-" * 400 not in message and len(message) < 600  # 2,000 characters of body, cut


# --- what a server answers is checked ------------------------------------------------------------

BAD_ANSWERS = {  # fault -> what the error says was wrong
    "nan": "log-prob of nan",
    "positive": "log-prob of 0.5",
    "negative_id": "token id -1,",
    "big_id": "token id 9",  # the vocabulary's size + 7, named
    "extra_tokens": "for max_tokens=",
    "not_json": "not JSON",
    "no_choices": "without its 'choices'",
    "huge": r"an answer of [\d,]+ bytes \(cap [\d,]+\)",
    "huge_undeclared": r"an answer over [\d,]+ bytes",
}
FAULTS = [(fault, "token") for fault in BAD_ANSWERS]  # every request reads log-probs
FAULTS += [(fault, "specem") for fault in ("negative_id", "big_id", "extra_tokens")]  # drafts


@pytest.mark.parametrize("policy", ["raise", "drop"])
@pytest.mark.parametrize(("fault", "method"), FAULTS, ids=lambda v: str(v))
def test_invalid_answers_fail_the_member(fault, method, policy, servers, remotes):
    fake = servers[0]
    wrong = rf"member 'tb-gpt2-bpe': {fake.url}/completions .*{BAD_ANSWERS[fault]}"
    ens = Ensemble(remotes, method, on_member_failure=policy)
    events = []
    fake.faults = [fault]
    try:
        if policy == "raise":
            with pytest.raises(ServerError, match=wrong):
                ens.generate(PROMPT, GenerationConfig(max_new_tokens=8), on_event=events.append)
        else:
            out = ens.generate(PROMPT, GenerationConfig(max_new_tokens=8), on_event=events.append)
            assert out.text and out.stats.counts["member_failed"] == 1
            assert re.search(wrong, out.stats.failed["tb-gpt2-bpe"])
    finally:
        fake.faults = []
    assert [e.member for e in events if e.name == "member_failed"] == ["tb-gpt2-bpe"]


@pytest.mark.parametrize("fault", ["nan", "positive", "not_json"])
def test_invalid_scores_fail_the_member(fault, servers, remotes):
    fake, member = servers[1], remotes[1]
    member.start(PROMPT)
    fake.faults = [fault]
    with pytest.raises(ServerError, match=rf"'tb-qwen2-spm': {fake.url}.*{BAD_ANSWERS[fault]}"):
        member.score([" 12 apples"], ends=[True])
    assert member.text == ""  # nothing of the failed operation is kept


@pytest.mark.parametrize(
    ("answer", "what"),
    [
        (b"<html>busy</html>", "not JSON"),
        (b'{"data": "tb-gpt2-bpe"}', "without its 'data' list"),
        (b'{"data": [{"name": "tb-gpt2-bpe"}]}', "without a name"),
        (b'{"data": [{"id": "tb-gpt2-bpe", "max_model_len": 0}]}', "max_model_len=0"),
        (b'{"data": [{"id": "tb-gpt2-bpe", "max_model_len": -5}]}', "max_model_len=-5"),
        (b'{"data": [{"id": "tb-gpt2-bpe", "max_model_len": "4k"}]}', "max_model_len='4k'"),
        (b"[" * 60_000 + b"]" * 60_000, "nested deeper than Python can read"),
    ],
)
def test_invalid_model_lists_fail_at_connection(answer, what, servers):
    fake = servers[0]
    fake.models_answer = answer
    try:
        with pytest.raises(ServerError, match=rf"{fake.url}/models .*{re.escape(what)}"):
            connect(Remote(fake.url, tokenizer=fake.root))
    finally:
        fake.models_answer = None


def test_the_answer_cap_is_configurable(servers, remotes):
    fake, usual = servers[0], remotes[0]
    member = connect(Remote(fake.url, tokenizer=fake.root, max_answer_bytes=64 * 2**20))
    try:
        for m in (member, usual):
            m.start(PROMPT)
        fake.faults = ["huge"]  # 16 MiB: over the default cap, under this one
        torch.testing.assert_close(member.logprobs([0]), usual.logprobs([0]))
        assert not fake.faults  # the huge answer was the one read
    finally:
        fake.faults = []
        member.close()


# --- the timeout bounds the whole request ------------------------------------------------------


@pytest.mark.parametrize("fault", ["trickle", "trickle_head"])
def test_timeout_bounds_the_whole_request(fault, servers):
    """A server that sends a byte every 0.4 s never lets a per-read timeout of 1 s fire; the
    request's timeout still ends it, long before the trickle would."""
    fake = servers[0]
    member = connect(Remote(fake.url, tokenizer=fake.root, timeout=1.0, retries=0))
    try:
        member.start(PROMPT)
        fake.faults = [fault]
        began = time.perf_counter()
        with pytest.raises(ServerError, match=r"no answer from .* within 1 s"):
            member.logprobs([0])
        took = time.perf_counter() - began
        assert fake.trickle_total >= 4 * fake.trickle  # the trickle was under way ...
        assert took < fake.trickle_total / 2  # ... and far from over
    finally:
        fake.faults = []
        member.close()


# --- TLS -----------------------------------------------------------------------------------------


@pytest.mark.skipif(shutil.which("openssl") is None, reason="needs the openssl command line")
def test_tls_verify_and_client_certificates(tmp_path):
    import ssl

    from fake_server import make_tls_files

    files = make_tls_files(tmp_path)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(files["server"], files["server_key"])
    context.verify_mode = ssl.CERT_REQUIRED  # the server asks for a client certificate
    context.load_verify_locations(files["ca"])
    path = model_paths()[0]
    client = (str(files["client"]), str(files["client_key"]))
    with FakeServer(path, name=path.name, tls=context) as fake:
        assert fake.url.startswith("https://")
        for verify in (str(files["ca"]), False):
            member = connect(Remote(fake.url, tokenizer=str(path), verify=verify, cert=client))
            member.start(PROMPT)
            assert member.logprobs([0]).shape[0] == 1
            member.close()
        with pytest.raises(ServerError, match="CERTIFICATE_VERIFY_FAILED"):
            connect(Remote(fake.url, tokenizer=str(path), cert=client, retries=0))  # no CA
        with pytest.raises(ServerError):
            connect(Remote(fake.url, tokenizer=str(path), verify=str(files["ca"]), retries=0))
