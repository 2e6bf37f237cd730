"""The key/value store, through the public API: requests whose rows hold different lengths share
a pass and write what they write alone (every method, every shipped model); a fault inside a
batched pass leaves every request in it as it was, with no copy of any cache made; rows go back
on finish, failure, cancel and drop; growth past the first chunk keeps texts identical; pooled
prefixes are copied in once; and a request that would not fit the free memory is refused
before it starts."""

from __future__ import annotations

import asyncio
import gc
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch
from conftest import cancel_midway, needs_trained

import core.kv
from core import Ensemble, GenerationConfig, HFMember
from core.batching import RequestThreads
from core.errors import EnsembleBusyError, MemberError
from core.kv import CHUNK
from core.sampling import Sampler
from core.testbed import make_problems, model_paths

pytestmark = needs_trained
CONFIG = GenerationConfig(max_new_tokens=24)
METHODS = ["single", "token", "safe", "specem"]
# prompts of very different lengths: plain questions and retrieval prompts
PROBLEMS = make_problems(4, seed=31) + make_problems(4, seed=32, form="rag")


def _fresh(index: int) -> HFMember:
    """A freshly loaded shipped model: its own, empty store."""
    return HFMember.load(model_paths()[index], device="cpu")


class RowLengths:
    """Records, per forward pass of a model, how many positions each row of the batch sees
    (from the attention mask the pass is given)."""

    def __init__(self, model) -> None:
        self.passes: list[list[int]] = []
        self.handle = model.register_forward_pre_hook(self._record, with_kwargs=True)

    def _record(self, _model, _args, kwargs) -> None:
        mask = kwargs.get("attention_mask")
        if mask is not None and mask.dim() == 4:
            seen = (mask[:, 0, 0] == 0).sum(-1)  # the first new id of each row
            self.passes.append(seen.tolist())

    def mixed(self) -> bool:
        """Whether some pass served rows of different lengths."""
        return any(len(set(lengths)) > 1 for lengths in self.passes)

    def remove(self) -> None:
        self.handle.remove()


def _texts(ens: Ensemble, concurrent: int) -> list[str]:
    with ThreadPoolExecutor(concurrent) as pool:
        return [o.text for o in pool.map(lambda p: ens.generate(p.messages, CONFIG), PROBLEMS)]


def _together_as_alone(ens: Ensemble, model) -> RowLengths:
    """Every problem at once gives the texts each gives alone; the lengths `model`'s batched
    passes held, for the caller to check."""
    alone = _texts(ens, 1)
    lengths = RowLengths(model)
    try:
        together = _texts(ens, len(PROBLEMS))
    finally:
        lengths.remove()
    assert together == alone
    return lengths


@pytest.mark.parametrize("index", [0, 1, 2], ids=["gpt2-bpe", "qwen2-spm", "llama-word"])
def test_rows_of_different_lengths_in_one_pass_write_what_they_write_alone(shipped_members, index):
    member = shipped_members[index]
    ens = Ensemble([member], "single", prefix_reuse=False)
    assert _together_as_alone(ens, member.model).mixed()
    assert member.store.held == 0


@pytest.mark.parametrize("method", METHODS[1:])
def test_every_method_shares_passes_across_lengths(shipped_members, method):
    ens = Ensemble(list(shipped_members), method, prefix_reuse=False)
    assert _together_as_alone(ens, shipped_members[0].model).mixed()
    assert all(m.store.held == 0 for m in shipped_members)


# --- a fault inside a batched pass ----------------------------------------------------------------


def _decoder_layers(model):
    base = getattr(model, "model", None) or getattr(model, "transformer", None)
    return getattr(base, "layers", None) or base.h


class Gate:
    """Holds the first pass of a model until released, and, while armed, fails every pass
    inside its second decoder layer (after the first one wrote its keys and values)."""

    def __init__(self, model) -> None:
        self.holding = threading.Event()
        self.open = threading.Event()
        self.armed = False
        self.failed_rows: list[int] = []
        self._first = True
        self.handles = [
            model.register_forward_pre_hook(self._hold, with_kwargs=True),
            _decoder_layers(model)[1].register_forward_pre_hook(self._fail),
        ]

    def _hold(self, _model, _args, kwargs) -> None:
        self._rows = kwargs["input_ids"].shape[0]
        if self._first:
            self._first = False
            self.holding.set()
            self.open.wait()

    def _fail(self, *_) -> None:
        if self.armed:
            self.failed_rows.append(self._rows)
            raise RuntimeError("injected fault inside a batched pass")

    def remove(self) -> None:
        for handle in self.handles:
            handle.remove()


def _full_logprobs(member, ids: list[int]) -> torch.Tensor:
    with torch.no_grad():
        logits = member.model(torch.tensor([ids])).logits[0, -1].float()
    return torch.log_softmax(logits, -1)


def test_a_fault_inside_a_batched_pass_leaves_every_request_as_it_was():
    """Four request views on one model, each with a cached prefix of its own length. The first
    one's pass is held inside the model while the three others queue behind it, so they run
    as one batched pass; every pass fails inside the model (each of the three again when
    retried alone). Each view is left with its ids, text and cache as they were (its next
    distribution is what it was), no cache was copied to make that so, and each goes on as
    if nothing happened."""
    member = _fresh(0)
    request_threads = RequestThreads()
    member.serve(request_threads)
    views = [member.spawn(reuse=False) for _ in range(4)]
    for view, problem in zip(views, PROBLEMS[::2], strict=True):
        view.start(problem.messages)
        view.sync("Tom has")
        view.logprobs([view.n_tokens])
    before = [(v.prompt_ids + v.ids, v.text, v.logprobs([v.n_tokens])[0]) for v in views]
    copies, growths = member.store.copies, member.store.growths
    gate = Gate(member.model)
    errors: list[BaseException] = []
    entered = threading.Semaphore(0)

    greedy = Sampler(GenerationConfig())

    def step(view):
        with request_threads.running():
            entered.release()
            try:
                view.draft(4, greedy)  # its first token from the cached row, then passes
            except MemberError as error:
                errors.append(error)

    threads = [threading.Thread(target=step, args=(v,)) for v in views]
    try:
        threads[0].start()
        gate.holding.wait()
        gate.armed = True
        for thread in threads[1:]:
            thread.start()
        for _ in threads[1:]:
            entered.acquire()
        entered.acquire()
        while request_threads.computing:  # all three are waiting behind the held pass
            threading.Event().wait(0.001)
        gate.open.set()
        for thread in threads:
            thread.join()
    finally:
        gate.open.set()
        gate.remove()
    assert len(errors) == 4 and max(gate.failed_rows) >= 3  # one pass served all three
    for view, (ids, text, row) in zip(views, before, strict=True):
        assert view.prompt_ids + view.ids == ids and view.text == text
        assert torch.allclose(view.logprobs([view.n_tokens])[0], row, atol=1e-5)
    assert (member.store.copies, member.store.growths) == (copies, growths)
    for view in views:
        view.sync(view.text + " 3 apples")
        expected = _full_logprobs(member, view.prompt_ids + view.ids)
        assert torch.allclose(view.logprobs([view.n_tokens])[0], expected, atol=1e-4)


# --- rows go back ---------------------------------------------------------------------------------


def _held(ens: Ensemble) -> int:
    gc.collect()
    return sum(m.store.held for m in ens.members)


def test_rows_go_back_on_finish_failure_cancel_and_drop(shipped_members):
    ens = Ensemble(list(shipped_members), "specem")
    messages = PROBLEMS[0].messages
    idle = _held(ens)  # (rows other tests' member views may still hold)
    ens.generate(messages, CONFIG)
    assert _held(ens) == idle  # finished

    stream = ens.stream(messages, CONFIG)
    next(stream)
    assert _held(ens) == idle + 3  # a row per member while it runs
    stream.close()
    assert _held(ens) == idle  # closed

    stream = ens.stream(messages, CONFIG)
    next(stream)
    del stream
    assert _held(ens) == idle  # dropped without closing

    stream = ens.stream(PROBLEMS[1].messages, CONFIG)  # never iterated
    del stream
    assert _held(ens) == idle

    gate = Gate(shipped_members[1].model)
    gate.open.set()
    gate.armed = True
    try:
        with pytest.raises(MemberError):
            ens.generate(messages, CONFIG)
    finally:
        gate.remove()
    assert _held(ens) == idle  # failed

    asyncio.run(cancel_midway(ens, messages))
    assert _held(ens) == idle  # cancelled
    assert ens.generate(messages, CONFIG).text == Ensemble(list(shipped_members), "specem")\
        .generate(messages, CONFIG).text  # fmt: skip


# --- growth ---------------------------------------------------------------------------------------


def test_growth_past_the_first_chunk_keeps_the_text():
    """A draft that runs past the store's first chunk of positions grows the store (copying
    it once, with another request's row in it) and drafts what a store already large enough
    drafts."""
    member = _fresh(0)
    other = member.spawn(reuse=False)
    other.start(PROBLEMS[1].messages)
    other.logprobs([0])  # another request holds a row
    greedy = Sampler(GenerationConfig())
    grown = member.spawn(reuse=False)
    grown.stop_ids = frozenset()  # it drafts past the chunk, whatever it writes
    grown.start(PROBLEMS[0].messages)
    growths, copies = member.store.growths, member.store.copies
    length = CHUNK + 40 - len(grown.prompt_ids)
    draft = grown.draft(length, greedy)
    assert member.store.growths > growths and member.store.copies > copies
    assert member.store.capacity > CHUNK
    again = member.spawn(reuse=False)  # the store is large enough now
    again.stop_ids = frozenset()
    again.start(PROBLEMS[0].messages)
    growths = member.store.growths
    assert again.draft(length, greedy).ids == draft.ids
    assert member.store.growths == growths
    other.sync("Tom")  # the other request's cache came through the copy
    expected = _full_logprobs(member, other.prompt_ids + other.ids)
    assert torch.allclose(other.logprobs([other.n_tokens])[0], expected, atol=1e-4)


def test_growth_while_others_run_keeps_every_text():
    """Long prompts arriving while short requests are mid-way grow the store under them."""
    members = [_fresh(i) for i in range(3)]
    ens = Ensemble(members, "safe", prefix_reuse=False)
    long = [p.messages for p in make_problems(3, seed=33, form="rag")]
    long = [
        [m if m["role"] != "user" else {**m, "content": m["content"] * 3} for m in messages]
        for messages in long
    ]
    requests = [p.messages for p in PROBLEMS[:4]] + long
    alone = [Ensemble(members, "safe", prefix_reuse=False).generate(m, CONFIG).text
             for m in requests]  # fmt: skip
    fresh = [_fresh(i) for i in range(3)]  # a store that starts small
    ens = Ensemble(fresh, "safe", prefix_reuse=False)
    with ThreadPoolExecutor(len(requests)) as pool:
        together = [o.text for o in pool.map(lambda m: ens.generate(m, CONFIG), requests)]
    assert together == alone
    assert fresh[0].store.capacity > CHUNK and fresh[0].store.growths >= 2


# --- prefixes and memory --------------------------------------------------------------------------


def test_a_pooled_prefix_is_copied_in_once_per_request():
    """Requests sharing a prompt take the first one's cached prefix: each copies it into its
    row once and computes only the prompt's last position."""
    members = [_fresh(0)]
    ens = Ensemble(members, "single")
    store = members[0].store
    messages = PROBLEMS[4].messages
    first = ens.generate(messages, CONFIG)
    assert first.stats.prefilled[members[0].name] == first.stats.prompt_tokens[members[0].name]
    copies = store.copies
    with ThreadPoolExecutor(4) as pool:
        outs = list(pool.map(lambda _: ens.generate(messages, CONFIG), range(4)))
    assert all(o.text == first.text for o in outs)
    assert all(o.stats.prefilled[members[0].name] == 1 for o in outs)
    # each: one copy in at its start, one copy out to the pool at its end
    assert store.copies - copies == 2 * len(outs)


def test_a_request_that_would_not_fit_is_refused_before_it_starts(monkeypatch):
    member = _fresh(0)
    ens = Ensemble([member], "single", prefix_reuse=False)
    ens.generate(PROBLEMS[0].messages, CONFIG)  # the store now holds short requests
    capacity = member.store.capacity
    monkeypatch.setattr(core.kv, "free_bytes", lambda device: 1 << 20)  # 1 MiB free
    long = GenerationConfig(max_new_tokens=capacity + 100)
    stream = ens.stream(PROBLEMS[0].messages, long)
    with pytest.raises(EnsembleBusyError, match="free"):
        next(stream)  # before any text
    assert ens.admission.running == 0 and member.store.held == 0
    assert ens.generate(PROBLEMS[0].messages, CONFIG).text  # what fits still runs


def test_default_concurrency_comes_from_the_measured_cache_size(shipped_members, monkeypatch):
    """A member's bytes per cached position are what its model's own cache holds for one
    position; the default concurrency is half the free memory over a request's caches at
    full context windows."""
    from transformers import DynamicCache

    import core.admission
    from core.admission import default_concurrency

    for member in shipped_members:
        cache = DynamicCache(config=member.model.config)
        with torch.no_grad():
            member.model(input_ids=torch.tensor([[5]]), cache=cache, use_cache=True)
        held = sum(t.numel() * t.element_size() for layer in cache.layers
                   for t in (layer.keys, layer.values))  # fmt: skip
        assert member.kv_bytes_per_token == held
    per_request = sum(m.kv_bytes_per_token * m.context_window for m in shipped_members)
    monkeypatch.setattr(core.admission, "free_bytes", lambda device: 20 * per_request + 1)
    assert default_concurrency(shipped_members) == 10


def _windowed_qwen2(served: HFMember, window: int) -> HFMember:
    """The shipped Qwen2 model with sliding-window layers between full-attention ones."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(
        model_paths()[1], layer_types=["sliding_attention", "full_attention"] * 2,
        use_sliding_window=True, sliding_window=window,
    )  # fmt: skip
    return HFMember(served.name, model.eval(), served.tokenizer)


def test_sliding_window_layers_are_served_by_the_store(shipped_members):
    """A window of 8 positions, shorter than every prompt: the store serves the model, a request
    alone writes what transformers' own `generate` writes, and concurrent requests share passes
    and write what they write alone (SpecEM's scoring passes too)."""
    windowed = _windowed_qwen2(shipped_members[1], window=8)
    assert windowed.store is not None and windowed.batcher.unsupported is None
    tokenizer = windowed.tokenizer
    for method in ("single", "specem"):
        members = [shipped_members[0], windowed] if method == "specem" else [windowed]
        ens = Ensemble(members, method, prefix_reuse=False)
        alone = _texts(ens, 1)
        passes, rows = windowed.batcher.batches, windowed.batcher.rows
        assert _texts(ens, len(PROBLEMS)) == alone
        assert windowed.batcher.batches - passes < windowed.batcher.rows - rows  # shared
    single = Ensemble([windowed], "single", prefix_reuse=False)
    for problem in PROBLEMS[:4]:
        ids = tokenizer.apply_chat_template(
            problem.messages, add_generation_prompt=True, return_tensors="pt", return_dict=True
        )
        assert ids["input_ids"].shape[1] > 8  # the window cuts every prompt
        out = windowed.model.generate(**ids, max_new_tokens=CONFIG.max_new_tokens, do_sample=False)
        reference = tokenizer.decode(out[0, ids["input_ids"].shape[1] :], skip_special_tokens=True)
        assert reference.startswith(single.generate(problem.messages, CONFIG).text)


def test_a_model_the_store_cannot_serve_runs_each_pass_alone_with_the_same_texts(
    shipped_members, monkeypatch
):
    """A model the store refuses keeps each request's own cache and runs every pass alone,
    writing what the store-served model writes, alone and concurrently, for every method that
    scores and branches."""
    import core.batching

    def refused(model):
        layout, _ = core.kv.probe_layout(model)
        return layout, "a refusal for this test"

    served = shipped_members[1]
    monkeypatch.setattr(core.batching, "probe_layout", refused)
    alone = _windowed_qwen2(served, window=4096)  # any model: loaded while the store refuses
    monkeypatch.undo()
    assert alone.store is None and alone.batcher.unsupported == "a refusal for this test"
    for method in ("single", "specem"):
        members = [shipped_members[0], alone] if method == "specem" else [alone]
        reference = [shipped_members[0], served] if method == "specem" else [served]
        want = _texts(Ensemble(reference, method, prefix_reuse=False), 1)
        ens = Ensemble(members, method, prefix_reuse=False)
        passes, rows = alone.batcher.batches, alone.batcher.rows
        assert _texts(ens, 1) == want
        assert _texts(ens, len(PROBLEMS)) == want
        assert alone.batcher.batches - passes == alone.batcher.rows - rows  # alone
