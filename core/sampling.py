"""Choosing the next token (or candidate string): greedy, or temperature/top-p with a seed."""

from __future__ import annotations

import torch

from .config import GenerationConfig


class Sampler:
    """One per request, so a seeded request is reproducible whatever ran before it."""

    def __init__(self, config: GenerationConfig) -> None:
        self.temperature = config.temperature
        self.top_p = config.top_p
        self.generator: torch.Generator | None = None
        if not config.greedy:
            self.generator = torch.Generator()
            if config.seed is None:
                self.generator.seed()
            else:
                self.generator.manual_seed(config.seed)

    @property
    def greedy(self) -> bool:
        return self.generator is None

    def distribution(self, logprobs: torch.Tensor) -> torch.Tensor:
        """The distribution actually sampled from (temperature and top-p applied), on CPU."""
        logprobs = logprobs.float().cpu()
        if self.greedy:
            out = torch.zeros_like(logprobs)
            out[int(torch.argmax(logprobs))] = 1.0
            return out
        # The likeliest shifted to 0 and the divisor kept a float32 number: a tiny temperature
        # then sends the rest to -inf (greedy in effect), never every entry, nor 0/0, to NaN.
        divisor = max(self.temperature, torch.finfo(torch.float32).tiny)
        probs = torch.softmax((logprobs - logprobs.max()) / divisor, dim=-1)
        if self.top_p < 1.0:
            sorted_probs, order = torch.sort(probs, descending=True)
            keep = torch.cumsum(sorted_probs, dim=-1) - sorted_probs < self.top_p
            keep[0] = True  # the likeliest always: a top_p below float32's range keeps it alone
            mask = torch.zeros_like(probs, dtype=torch.bool)
            mask[order[keep]] = True
            probs = torch.where(mask, probs, torch.zeros_like(probs))
            probs = probs / probs.sum()
        return probs

    def pick(self, logprobs: torch.Tensor) -> int:
        """Next id from log-probabilities (any device)."""
        if self.greedy:
            return int(torch.argmax(logprobs))
        return int(torch.multinomial(self.distribution(logprobs), 1, generator=self.generator))

    def pick_probs(self, probs: torch.Tensor) -> int:
        """Next index from (possibly unnormalised) probabilities over candidates."""
        return self.pick(torch.log(probs.float().clamp_min(1e-30)))

    def uniform(self) -> float:
        """A uniform draw from the request's generator (speculative acceptance tests)."""
        if self.generator is None:
            return 0.0
        return float(torch.rand(1, generator=self.generator))
