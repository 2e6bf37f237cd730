"""Deterministic members for exact expectations: real testbed tokenizers whose "model" spells
fixed texts."""

from __future__ import annotations

import torch

from core import HFMember


class Scripted(HFMember):
    """A real testbed tokenizer whose "model" spells fixed texts in its canonical tokenization:
    the next token is a mixture of the next tokens of the scripts the ids so far are a prefix
    of (weighted; the stop after a script's end); off every script it is uniform. Deterministic
    members for exact expectations."""

    def __init__(self, base: HFMember, scripts, name: str) -> None:
        super().__init__(name, base.model, base.tokenizer)
        scripts = [(s, 1.0) if isinstance(s, str) else s for s in scripts]
        self.scripts = [(self.canonical_ids(s), w) for s, w in scripts]
        self.stop = base.tokenizer.eos_token_id

    def _row(self, seq: list[int]) -> torch.Tensor:
        probs = torch.zeros(self.vocab.size, dtype=torch.float64)
        for script, weight in self.scripts:
            if seq == script[: len(seq)]:
                probs[script[len(seq)] if len(seq) < len(script) else self.stop] += weight
        if not probs.sum():
            return torch.log_softmax(torch.zeros(self.vocab.size), -1)
        return torch.log((probs / probs.sum()).clamp_min(1e-13)).float()

    def _model_logprobs(self, boundaries):
        self.calls += 1
        return torch.stack([self._row(self.ids[:b]) for b in boundaries])

    def branch_logprobs(self, boundary, branches):
        return torch.stack([self._row(self.ids[:boundary] + list(b)) for b in branches])
