"""The facade through the public API: streaming, events, stats, stop strings, sampling, threads
and async — on tiny random-weight members (structure, not quality)."""

from __future__ import annotations

import asyncio
import threading

import pytest
from conftest import LoopProbe

from core import Ensemble, GenerationConfig
from core.events import TokenEnsembled

PROMPT = [{"role": "user", "content": "Tom has 7 apples. He buys 5 more. How many?"}]


@pytest.mark.parametrize("aggregator", ["unite", "gac"])
@pytest.mark.parametrize("members", [[0, 1], [0, 1, 2]], ids=["2", "3"])
def test_token_method_runs_and_reports_every_position(tiny_members, aggregator, members):
    ens = Ensemble([tiny_members[i] for i in members], "token", aggregator=aggregator)
    seen = []
    out = ens.generate(PROMPT, max_new_tokens=12, on_event=seen.append)
    points = [e for e in seen if isinstance(e, TokenEnsembled)]
    assert out.finish_reason in ("stop", "length")
    assert len(points) == out.stats.ensembled_tokens
    assert out.stats.tokens == out.stats.ensembled_tokens  # a stop decision is a token too
    assert "".join(e.chosen for e in points if e.chosen != "<EOS>") == out.text
    assert out.stats.ensemble_rate == 1.0
    assert set(out.stats.member_calls) == {tiny_members[i].name for i in members}
    for i in members:  # every member followed the shared text in its own tokenization
        member = tiny_members[i]
        member.sync(out.text)
        assert member.ids == member.canonical_ids(out.text)
    assert [e.to_dict()["name"] for e in points[:1]] == ["token_ensembled"]


def test_geometric_mean_differs_from_arithmetic_somewhere(tiny_members):
    arithmetic = Ensemble(tiny_members, "token", aggregator="gac")
    geometric = Ensemble(tiny_members, "token", aggregator="gac", mean="geometric")
    a = arithmetic.generate(PROMPT, max_new_tokens=16)
    g = geometric.generate(PROMPT, max_new_tokens=16)
    assert a.stats.tokens and g.stats.tokens
    assert geometric.summary()["mean"] == "geometric"
    # the first position combines the same three distributions, only the mean differs
    assert a.events[0].top and a.events[0].top != g.events[0].top


def test_stream_concatenates_to_generate_and_carries_events(tiny_members):
    ens = Ensemble(tiny_members[:2], "token")
    out = ens.generate(PROMPT, max_new_tokens=10)
    deltas = list(ens.stream(PROMPT, GenerationConfig(max_new_tokens=10)))
    assert "".join(d.text for d in deltas) == out.text
    assert deltas[-1].finish_reason == out.finish_reason and deltas[-1].stats is not None
    assert all(d.finish_reason is None for d in deltas[:-1])
    assert sum(len(d.events) for d in deltas) == len(out.events)


def test_single_member_is_reproducible_and_counts_tokens(tiny_members):
    ens = Ensemble(tiny_members, "single", member="tb-qwen2-spm")
    a = ens.generate(PROMPT, max_new_tokens=8)
    b = ens.generate(PROMPT, max_new_tokens=8)
    assert a.text == b.text and a.stats.tokens == 8 and a.finish_reason == "length"
    assert list(a.stats.member_calls) == ["tb-qwen2-spm"]


def test_seeded_sampling_is_reproducible(tiny_members):
    ens = Ensemble(tiny_members[:2], "token", aggregator="gac")
    config = GenerationConfig(max_new_tokens=12, temperature=1.0, top_p=0.9, seed=7)
    first = ens.generate(PROMPT, config).text
    assert ens.generate(PROMPT, config).text == first
    others = {ens.generate(PROMPT, config, seed=s).text for s in range(1, 5)}
    assert len(others | {first}) > 1


def test_stop_string_trims_and_ends(tiny_members):
    ens = Ensemble(tiny_members[:1], "single")
    full = ens.generate(PROMPT, max_new_tokens=20).text
    assert len(full) > 3
    stop = full[2:4]
    out = ens.generate(PROMPT, max_new_tokens=20, stop=[stop])
    assert out.text == full[: full.find(stop)] and out.finish_reason == "stop"
    streamed = "".join(d.text for d in ens.stream(PROMPT, max_new_tokens=20, stop=[stop]))
    assert streamed == out.text


def test_one_instance_shared_between_threads(tiny_members):
    ens = Ensemble(tiny_members[:2], "token")
    expected = ens.generate(PROMPT, max_new_tokens=8).text
    results: list[str] = []

    def work() -> None:
        results.append(ens.generate(PROMPT, max_new_tokens=8).text)

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results == [expected] * 4


async def test_async_stream_does_not_block_the_loop(tiny_members):
    ens = Ensemble(tiny_members, "token", aggregator="gac", gate=None)  # every member, every step
    probe = LoopProbe()
    parts = [d.text async for d in ens.astream(PROMPT, max_new_tokens=24, on_event=probe)]
    assert probe.proven, probe.ran  # the loop ran while the models were mid-computation
    assert "".join(parts) == (await ens.agenerate(PROMPT, max_new_tokens=24)).text


async def test_cancelled_async_stream_leaves_the_ensemble_usable(tiny_members):
    ens = Ensemble(tiny_members[:2], "token")
    stream = ens.astream(PROMPT, max_new_tokens=50)
    async for _ in stream:
        break
    await stream.aclose()
    out = await asyncio.wait_for(ens.agenerate(PROMPT, max_new_tokens=4), timeout=30)
    assert out.stats.tokens <= 4


async def test_async_errors_reach_the_caller(tiny_members):
    from core import InvalidMessagesError

    ens = Ensemble(tiny_members[:1], "single")
    with pytest.raises(InvalidMessagesError):
        await ens.agenerate([])
