"""preset="authors": each rule of the SAFE authors' released code, checked against a small
reference written from reading that code (`authors_safe.py`), and the whole loop on the shipped
models in both drafter orders."""

from __future__ import annotations

import pytest
import torch
from authors_safe import ensemble, generate
from conftest import needs_trained
from scripted import Scripted

from core import Ensemble, GenerationConfig
from core.aggregate import sharpen
from core.alignment import Aligner
from core.events import Drafted, EnsemblePoint
from core.testbed import make_problems

PROMPT = [{"role": "user", "content": "Sara has 6 buttons. She donates 1. How many?"}]
TEXT = "Sara starts with 6 buttons. 6 - 1 = 5. The answer is 13."


def _row(member, seed: int, favourites: int, stop: bool) -> torch.Tensor:
    """Random logits over the ids that spell text (and the stops), a few of them favoured.
    Only a string's own id (not a byte-fallback twin that spells it too: the code would read
    the twin's value, the library the string's; trained models never rank a twin high)."""
    gen = torch.Generator().manual_seed(seed)
    logits = torch.randn(member.vocab.size, generator=gen)
    vocab = member.vocab
    spelled = [
        i for i, s in enumerate(vocab.strings) if s and s.isascii() and vocab.string_to_id[s] == i
    ]
    dead = torch.ones(member.vocab.size, dtype=torch.bool)
    dead[spelled] = False
    dead[sorted(member.stop_ids)] = False
    logits[dead] = -30.0
    picks = torch.tensor(spelled)[torch.randperm(len(spelled), generator=gen)[:favourites]]
    logits[picks] += 4 * torch.rand(favourites, generator=gen) + 2
    if stop:
        logits[member.tokenizer.eos_token_id] += 6.0
    return logits


@pytest.mark.parametrize(
    "pair", [(0, 1), (1, 0), (0, 2), (2, 1)], ids=["bpe+spm", "spm+bpe", "bpe+word", "word+spm"]
)
def test_unite_choice_is_the_authors_codes(tiny_members, pair):
    """UniTE as the code aligns it: top-10 strings (a stop is its own text), a string outside a
    member's top-10 read by its first non-blank sub-token, each member softmaxed over the union,
    averaged, heuristic sharpening where the max is below one half; the argmax, and the drafter
    id it appends, agree with the reference on rows of every shape (sure, split, stop-heavy)."""
    drafter, verifier = (tiny_members[i] for i in pair)
    aligner = Aligner("unite", 10, "nonblank", stops_as_text=True)
    sharpened = 0
    for seed in range(40):
        members = (drafter, verifier)
        rows = [_row(m, 2 * seed + k, 1 + seed % 6, seed % 5 == k) for k, m in enumerate(members)]
        d_row, v_row = (torch.log_softmax(r, -1) for r in rows)
        aligned = aligner.align([drafter, verifier], [d_row, v_row])
        top = {s for _, s in aligner.top_strings(drafter, d_row)}
        eligible = torch.tensor([s in top for s in aligned.strings])
        scores, fired = sharpen(aligned.probs, "heuristic", aligned.strings, eligible)
        chosen = aligned.strings[int(torch.argmax(scores))]
        want, d_id, _ = ensemble(rows[0], drafter.tokenizer, rows[1], verifier.tokenizer)
        assert chosen == want, seed
        if chosen not in aligned.stops:
            assert aligner.column_id(drafter, d_row, chosen) == d_id
        sharpened += fired
    assert sharpened > 0  # the sharpening rule was exercised


def test_stops_are_candidates_of_their_own(tiny_members):
    """stop_check="text": each member's stop is its own candidate, spelled as its text. Both
    members end the turn with probability 0.6 and go on with " Done." otherwise: read as one
    stop event the ensemble stops; read as text the two stops split their mass (0.3 each) and
    the continuation (0.4) wins, as in the reference."""
    drafter = Scripted(tiny_members[0], [(TEXT, 0.6), (TEXT + " Done.", 0.4)], "bpe-script")
    verifier = Scripted(tiny_members[1], [(TEXT, 0.6), (TEXT + " Done.", 0.4)], "spm-script")
    texts = {}
    for rule in ("mass", "text"):
        ens = Ensemble([drafter, verifier], "safe", preset="paper", stop_check=rule)
        out = ens.generate(PROMPT, max_new_tokens=64)
        texts[rule] = out.text
        points = [e for e in out.events if isinstance(e, EnsemblePoint)]
        if rule == "text":
            assert [(p.drafted, p.chosen) for p in points] == [("<EOS>", " ")]
            assert {"<|end|>", "<|im_end|>"} <= {s for s, _ in points[0].top}
    assert texts == {"mass": TEXT, "text": TEXT + " Done."}
    rows = []
    for member in (drafter, verifier):
        member.start(PROMPT)
        member.sync(TEXT)
        rows.append(member.logprobs([member.n_tokens])[0])
    assert ensemble(rows[0], drafter.tokenizer, rows[1], verifier.tokenizer)[0] == " "


def test_as_aligned_redrafts_at_every_ensemble_point(tiny_members):
    """remap="as-aligned": the drafter continues from the aligned id and redrafts, even where
    that id is the drafted token. spm drafts " 13" as "▁" "1" "3"; two bpe verifiers want
    " 12", which wins at "▁"; by subtoken="first" its aligned id is "▁" itself: the text does
    not change, but the draft ends there and the next draft starts right after the point."""
    wrong, right = "The answer is 13.", "The answer is 12."
    drafter = Scripted(tiny_members[1], [(wrong, 0.9), (right, 0.1)], "spm-draft")
    verifiers = [Scripted(tiny_members[0], [right], f"bpe-{i}") for i in range(2)]
    for remap in ("likeliest", "as-aligned"):
        ens = Ensemble([drafter, *verifiers], "safe", preset="paper", remap=remap, subtoken="first")
        out = ens.generate(PROMPT, max_new_tokens=32)
        point = next(e for e in out.events if isinstance(e, EnsemblePoint))
        assert (point.drafted, point.chosen) == (" ", " 12")
        starts = [e.position for e in out.events if isinstance(e, Drafted)]
        assert (point.position + 1 in starts) == (remap == "as-aligned")
        assert out.text == (right if remap == "likeliest" else wrong)


@needs_trained
def test_as_aligned_keeps_the_drafters_own_ids(make_ensemble):
    """The code appends the ensembled id to the drafter's ids and never re-reads them: after a
    cycle the drafter's ids spell the committed text, and where an ensembled piece joins a
    word they are not its tokenizer's own spelling of it (the library's rule re-reads them)."""
    kept = {}
    for preset in ("paper", "authors"):
        ens = make_ensemble("safe", members=[1, 0], preset=preset)
        kept[preset] = 0
        for problem in make_problems(6, seed=1):
            text, stream = "", ens.stream(problem.messages, GenerationConfig(max_new_tokens=64))
            for delta in stream:
                text += delta.text
                drafter = next(m for m in stream.members if m.name == ens.summary()["drafter"])
                assert drafter.text == text
                kept[preset] += drafter.ids != drafter.canonical_ids(text)
    assert kept["paper"] == 0 and kept["authors"] > 0


@needs_trained
@pytest.mark.parametrize("order", [[0, 1], [1, 0]], ids=["bpe-drafts", "spm-drafts"])
def test_authors_preset_writes_what_the_authors_code_writes(shipped_members, order):
    """The whole loop, greedy, against the reference: the same text on every problem, in both
    drafter orders (the finer spm drafter is where the rules change texts)."""
    drafter, verifier = (shipped_members[i] for i in order)
    ens = Ensemble([drafter, verifier], "safe", preset="authors")
    for problem in make_problems(8, seed=1):
        out = ens.generate(problem.messages, max_new_tokens=128)
        want, _ = generate(drafter, verifier, problem.messages, max_new=128)
        assert out.text == want, problem.question
