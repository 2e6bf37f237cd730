"""Many requests at once on one loaded ensemble, through the public API: concurrent greedy
requests give exactly what sequential ones give (texts, events, stats) for every method, from
threads and from asyncio; a paused stream or a request started from a callback blocks nobody; a
cancelled request frees its slot; a full queue says so; a conversation's next turn reuses the
cached prefix of the previous one."""

from __future__ import annotations

import asyncio
import gc
import sys
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest
from conftest import cancel_midway, needs_trained

from core import Ensemble, GenerationConfig, HFMember
from core.errors import EnsembleBusyError
from core.testbed import make_problems, model_paths

CONFIG = GenerationConfig(max_new_tokens=32)
PROBLEMS = make_problems(16, seed=11)
METHODS = ["single", "token", "safe", "specem"]


def _same(a, b) -> bool:
    """Equal, but scores within 1e-4 (batched passes add rows to a matmul, which may move the
    last bits of a float: never enough to change a text, as the texts show)."""
    if isinstance(a, float) and isinstance(b, float):
        return abs(a - b) <= 1e-4
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    return a == b


def _fingerprint(out) -> tuple:
    s = out.stats
    return (
        out.text,
        out.finish_reason,
        s.tokens,
        s.ensembled_tokens,
        dict(s.counts),
        dict(s.prompt_tokens),
        [e.to_dict() for e in out.events],
    )


@pytest.fixture(scope="module")
def sequential(shipped_members):
    """What each method gives for each problem, one request at a time."""
    results = {}
    for method in METHODS:
        ens = Ensemble(list(shipped_members), method)
        results[method] = [_fingerprint(ens.generate(p.messages, CONFIG)) for p in PROBLEMS]
    return results


@needs_trained
@pytest.mark.parametrize("method", METHODS)
def test_sixteen_threads_give_what_sequential_requests_give(shipped_members, sequential, method):
    ens = Ensemble(list(shipped_members), method)
    with ThreadPoolExecutor(16) as pool:
        outs = list(pool.map(lambda p: ens.generate(p.messages, CONFIG), PROBLEMS))
    assert _same([_fingerprint(o) for o in outs], sequential[method])
    assert ens.admission.running == 0


@needs_trained
@pytest.mark.parametrize("method", ["specem", "rerank"])
def test_votes_read_after_an_empty_turn_depend_on_their_request_alone(shipped_members, method):
    """score="pmi" reads every candidate again in a view of each member that starts from an
    empty turn: concurrent requests' views share passes, and give what one at a time gives."""
    ens = Ensemble(list(shipped_members), method, score="pmi")
    problems = PROBLEMS[:8]
    alone = [_fingerprint(ens.generate(p.messages, CONFIG)) for p in problems]
    with ThreadPoolExecutor(8) as pool:
        outs = list(pool.map(lambda p: ens.generate(p.messages, CONFIG), problems))
    assert _same([_fingerprint(o) for o in outs], alone)
    assert ens.admission.running == 0


@needs_trained
@pytest.mark.parametrize("method", METHODS)
async def test_sixteen_tasks_give_what_sequential_requests_give(
    shipped_members, sequential, method
):
    ens = Ensemble(list(shipped_members), method)
    outs = await asyncio.gather(*(ens.agenerate(p.messages, CONFIG) for p in PROBLEMS))
    assert _same([_fingerprint(o) for o in outs], sequential[method])


@needs_trained
def test_concurrent_passes_are_batched(shipped_members):
    """The forward passes of concurrent requests run together: fewer passes than rows."""
    ens = Ensemble(list(shipped_members[:1]), "single")
    batcher = ens.members[0].batcher
    before_passes, before_rows = batcher.batches, batcher.rows
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda p: ens.generate(p.messages, CONFIG), PROBLEMS[:8]))
    passes, rows = batcher.batches - before_passes, batcher.rows - before_rows
    assert rows >= 8 * 2 and passes < rows


@needs_trained
def test_concurrent_requests_change_no_process_wide_setting(shipped_members):
    """The library never touches the interpreter's thread switch interval: the host
    application and a second ensemble in the process see it as they set it."""
    ens = Ensemble(list(shipped_members), "safe")
    before = sys.getswitchinterval()
    seen = set()

    def on_event(_event) -> None:
        seen.add(sys.getswitchinterval())

    with ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda p: ens.generate(p.messages, CONFIG, on_event=on_event), PROBLEMS))
    assert seen == {before} and sys.getswitchinterval() == before


@needs_trained
@pytest.mark.parametrize("method", METHODS)
def test_a_paused_stream_blocks_nobody(shipped_members, sequential, method):
    ens = Ensemble(list(shipped_members), method)
    paused = ens.stream(PROBLEMS[0].messages, CONFIG)
    first = next(paused)
    out = ens.generate(PROBLEMS[1].messages, CONFIG)  # would hang if the paused one held a lock
    assert _same(_fingerprint(out), sequential[method][1])
    rest = "".join(d.text for d in paused)  # the paused one finishes as if alone
    assert first.text + rest == sequential[method][0][0]


@needs_trained
def test_a_request_from_inside_a_callback_completes(shipped_members, sequential):
    ens = Ensemble(list(shipped_members), "safe", max_concurrency=1)
    nested = []

    def on_event(event):
        if not nested:
            nested.append(ens.generate(PROBLEMS[1].messages, CONFIG))

    out = ens.generate(PROBLEMS[0].messages, CONFIG, on_event=on_event)
    assert _same(_fingerprint(out), sequential["safe"][0])
    assert _same(_fingerprint(nested[0]), sequential["safe"][1])


@needs_trained
def test_adapters_paused_streams_block_nobody(shipped_members):
    from llama_index.core.llms import ChatMessage

    from langchain_ensemble import ChatEnsemble
    from llamaindex_ensemble import EnsembleLLM

    ens = Ensemble(list(shipped_members), "safe")
    question = PROBLEMS[0].question
    chat = ChatEnsemble.from_ensemble(ens, max_tokens=24)
    paused = chat.stream(question)
    next(paused)
    assert chat.invoke(question).content
    llm = EnsembleLLM(ensemble=ens, max_new_tokens=24)
    paused_chat = llm.stream_chat([ChatMessage(role="user", content=question)])
    next(paused_chat)
    assert llm.complete(question).text
    paused.close()
    paused_chat.close()


@needs_trained
def test_a_closed_stream_frees_its_slot(shipped_members):
    ens = Ensemble(list(shipped_members), "specem", max_concurrency=2, max_queue=0)
    streams = [ens.stream(p.messages, CONFIG) for p in PROBLEMS[:2]]
    for stream in streams:
        next(stream)
    with pytest.raises(EnsembleBusyError, match="max_concurrency"):
        ens.generate(PROBLEMS[2].messages, CONFIG)
    for stream in streams:
        stream.close()
    assert ens.admission.running == 0
    with ThreadPoolExecutor(2) as pool:  # the next 16 run, two at a time
        outs = list(pool.map(lambda p: ens.generate(p.messages, CONFIG), PROBLEMS))
    assert all(o.text for o in outs)


class _Holder:
    """An object in a reference cycle with a stream: collected only by a garbage collection."""

    def __init__(self, stream) -> None:
        self.stream, self.me = stream, self


@needs_trained
def test_a_stream_dropped_in_a_reference_cycle_frees_its_slot(shipped_members):
    """Automatic collection off, so only the admission's own collection can free the slot: a
    request that finds every slot held by garbage runs after a short wait in the queue."""
    ens = Ensemble(list(shipped_members), "single", max_concurrency=1, max_queue=1,
                   queue_timeout=30.0)  # fmt: skip
    gc.disable()
    try:
        stream = ens.stream(PROBLEMS[0].messages, CONFIG)
        next(stream)
        _Holder(stream)
        del stream
        assert ens.admission.running == 1  # nothing but a cycle refers to the stream now
        assert ens.generate(PROBLEMS[1].messages, CONFIG).text
        assert ens.admission.running == 0
    finally:
        gc.enable()


@needs_trained
async def test_a_cancelled_task_frees_its_slot(shipped_members):
    ens = Ensemble(list(shipped_members), "specem", max_concurrency=1, max_queue=0)
    assert await cancel_midway(ens, PROBLEMS[0].messages)
    outs = [await ens.agenerate(p.messages, CONFIG) for p in PROBLEMS]
    assert all(o.text for o in outs)


@needs_trained
def test_a_full_queue_and_a_queue_timeout_are_errors(shipped_members):
    ens = Ensemble(list(shipped_members), "single", max_concurrency=1, max_queue=1,
                   queue_timeout=0.05)  # fmt: skip
    holder = ens.stream(PROBLEMS[0].messages, CONFIG)
    next(holder)
    with pytest.raises(EnsembleBusyError, match="queue_timeout"):
        ens.generate(PROBLEMS[1].messages, CONFIG)  # waits in the queue, then gives up
    holder.close()
    # a full queue: one request holds the only slot, one waits (no timeout), a third is refused
    ens = Ensemble(list(shipped_members), "single", max_concurrency=1, max_queue=1)
    holder = ens.stream(PROBLEMS[0].messages, CONFIG)
    next(holder)
    outs = []
    queued = threading.Thread(
        target=lambda: outs.append(ens.generate(PROBLEMS[1].messages, CONFIG))
    )
    queued.start()
    assert ens.admission.wait_until(lambda: ens.admission.waiting == 1, 60)
    with pytest.raises(EnsembleBusyError, match="max_queue"):
        ens.generate(PROBLEMS[2].messages, CONFIG)
    holder.close()  # the queued request gets the slot and runs
    queued.join()
    assert outs[0].text and ens.admission.running == ens.admission.waiting == 0


@needs_trained
@pytest.mark.parametrize("method", ["single", "safe"])
def test_the_next_turn_of_a_conversation_prefills_only_its_new_tokens(method):
    """An agent loop resends the whole history each turn: the prefix computed for the previous
    turn is reused, so only the new part of the prompt is computed (counted), and the text is
    the same as without reuse. A member may not have fed the answer's last tokens (SAFE reads a
    verifier only where the consensus needs it; a drafter that drafts again over text whose
    rows it remembers feeds those ids with its next pass, and the answer may end first), but
    no member computes the previous turn's prompt again."""
    from core.kv import common_prefix

    members = [HFMember.load(path, device="cpu") for path in model_paths()]  # no kept prefix
    reuse = Ensemble(members, method)
    fresh = Ensemble(members, method, prefix_reuse=False)
    messages, previous, asked = list(PROBLEMS[3].messages), None, {}
    for turn in range(5):
        stream = reuse.stream(messages, CONFIG)
        deltas = list(stream)
        stats, text = deltas[-1].stats, "".join(d.text for d in deltas)
        expected = fresh.stream(messages, CONFIG)
        expected_deltas = list(expected)
        assert text == "".join(d.text for d in expected_deltas)
        for member in stream.members:
            if member.name not in stats.prompt_tokens:
                continue
            prompt = member.prompt_ids
            assert expected_deltas[-1].stats.prefilled[member.name] == len(prompt)
            if previous is None:
                continue
            shared = common_prefix(previous[member.name], prompt)
            new = len(prompt) - shared
            assert shared > len(prompt) // 2 and new > 0  # the history is most of the prompt...
            # ...and is not computed again: at most the answer's unfed tail and the new part
            assert stats.prefilled[member.name] <= len(prompt) - asked[member.name] + 1
        previous = {m.name: m.prompt_ids + m.ids for m in stream.members}
        asked = {m.name: len(m.prompt_ids) for m in stream.members}
        messages += [
            {"role": "assistant", "content": text},
            {"role": "user", "content": f"And then? (turn {turn + 2})"},
        ]


def test_a_slot_taken_first_belongs_to_the_stream_it_is_handed_to(tiny_members):
    ens = Ensemble(tiny_members[:1], "single", max_concurrency=1, max_queue=0)
    slot = ens.admission.admit()
    assert ens.admission.running == 1
    ens.stream("hi", admitted=slot, max_new_tokens=2).close()  # closed before its first step
    assert ens.admission.running == 0
    slot = ens.admission.admit()
    deltas = list(ens.stream("hi", admitted=slot, max_new_tokens=2))
    assert deltas[-1].finish_reason and ens.admission.running == 0


def test_a_request_cancelled_while_queued_leaves_the_queue_at_once(tiny_members):
    from core.errors import RequestCancelled

    ens = Ensemble(tiny_members[:1], "single", max_concurrency=1, max_queue=1, queue_timeout=600)
    held = ens.admission.admit()
    stream = ens.stream("hi", max_new_tokens=2)
    raised: list[BaseException] = []

    def wait() -> None:
        try:
            next(stream)
        except BaseException as error:
            raised.append(error)

    waiter = threading.Thread(target=wait)
    waiter.start()
    assert ens.admission.wait_until(lambda: ens.admission.waiting == 1, 30)
    stream.cancel()  # long before queue_timeout
    assert ens.admission.wait_until(lambda: ens.admission.waiting == 0, 30)
    waiter.join(30)
    held.release()
    assert isinstance(raised[0], RequestCancelled) and ens.admission.running == 0


async def test_batches_of_every_n_items_the_first_at_once_and_the_end_with_the_rest():
    """`iterate_in_thread(batched=True, every=N)`: the first item reaches the loop alone while
    the worker waits for it to be read, then lists of at least N items, and the last list ends
    with what came before the iterator's end; nothing is lost, nothing reordered."""
    from core.concurrency import iterate_in_thread

    first_read = threading.Event()

    def items():
        yield 0
        assert first_read.wait(10), "the first item was held back for a batch"
        yield from range(1, 11)

    batches = []
    async for batch in iterate_in_thread(items(), batched=True, every=3):
        batches.append(batch)
        first_read.set()
    assert batches[0] == [0]
    assert [i for batch in batches for i in batch] == list(range(11))
    assert all(len(batch) >= 3 for batch in batches[1:-1])
    assert len(batches) <= 1 + -(-10 // 3)


async def test_an_error_reaches_the_loop_with_the_items_before_it_whatever_the_batch():
    from core.concurrency import iterate_in_thread

    def items():
        yield from range(4)
        raise ValueError("the request failed")

    seen = []
    with pytest.raises(ValueError, match="the request failed"):
        async for batch in iterate_in_thread(items(), batched=True, every=10):
            seen.extend(batch)
    assert seen == [0, 1, 2, 3]
