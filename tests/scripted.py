"""Deterministic members for exact expectations: real testbed tokenizers whose "model" spells
fixed texts."""

from __future__ import annotations

import torch

from core import HFMember


class Scripted(HFMember):
    """A real testbed tokenizer whose "model" spells fixed texts in its canonical tokenization:
    the next token is a mixture of the next tokens of the scripts the ids so far are a prefix
    of (weighted; the stop after a script's end); off every script it is uniform, or, given
    `off`, the first token of `off` (a member that always says the same wrong thing). `sure`
    below 1 spreads the rest of each row's mass evenly over the vocabulary (an unsure member,
    whose likeliest token is still the script's). Deterministic members for exact
    expectations."""

    def __init__(
        self, base: HFMember, scripts, name: str, off: str | None = None, sure: float = 1.0
    ) -> None:
        super().__init__(name, base.model, base.tokenizer)
        self.scripts = self._parsed(scripts)
        self.stop = base.tokenizer.eos_token_id
        self.off = None if off is None else self.canonical_ids(off)[0]
        self.sure = sure
        self.after: dict[tuple[int, ...], list] = {}  # other scripts after a given prompt

    def _parsed(self, scripts) -> list:
        scripts = [(s, 1.0) if isinstance(s, str) else s for s in scripts]
        return [(self.canonical_ids(s), w) for s, w in scripts]

    def answer_after(self, messages, scripts) -> None:
        """After the prompt these messages render to, spell `scripts` instead."""
        self.after[tuple(self.render(messages))] = self._parsed(scripts)

    def _row(self, seq: list[int]) -> torch.Tensor:
        probs = torch.zeros(self.vocab.size, dtype=torch.float64)
        sequence = self.state.sequence
        prompt = tuple(sequence.seq[: sequence.prompt_len])
        for script, weight in self.after.get(prompt, self.scripts):
            if seq == script[: len(seq)]:
                probs[script[len(seq)] if len(seq) < len(script) else self.stop] += weight
        if not probs.sum() and self.off is not None:
            probs[self.off] = 1.0
        if not probs.sum():
            return torch.log_softmax(torch.zeros(self.vocab.size), -1)
        probs = self.sure * probs / probs.sum() + (1 - self.sure) / self.vocab.size
        return torch.log(probs.clamp_min(1e-13)).float()

    def _model_logprobs(self, boundaries):
        self.state.calls += 1
        return torch.stack([self._row(self.ids[:b]) for b in boundaries])

    def _continuation_scores(self, blocks, ends, start, raw):
        """Each continuation's token log-probs from the scripts (SpecEM's verification)."""
        self.state.calls += 1
        before, scores = self.state.sequence.seq[self.state.sequence.prompt_len : start], []
        for block, end in zip(blocks, ends, strict=True):
            ids = before + list(block)
            values = [float(self._row(ids[:j])[ids[j]]) for j in range(len(before), len(ids))]
            if end:
                values.append(float(self._row(ids)[self.stop]))
            scores.append(torch.tensor(values))
        return scores

    def _model_branch_logprobs(self, boundary, branches):
        return torch.stack([self._row(self.ids[:boundary] + list(b)) for b in branches])


def fluent_and_reader(base: HFMember) -> list[Scripted]:
    """Two scripted members for votes by what the request makes likely (score="pmi"): "fluent"
    says "The answer is 12." whatever it is asked (0.9, after the request and after an empty
    user turn); "reader" says "The answer is 13." after the request (0.6) and "... 12." after
    an empty turn (0.9)."""
    from core.methods.pmi import EMPTY_REQUEST

    twelve, thirteen = "The answer is 12.", "The answer is 13."
    without = [(twelve, 0.9), (thirteen, 0.1)]
    members = []
    for name, scripts in [("fluent", without), ("reader", [(thirteen, 0.6), (twelve, 0.4)])]:
        member = Scripted(base, scripts, name)
        member.answer_after(EMPTY_REQUEST, without)
        members.append(member)
    return members
