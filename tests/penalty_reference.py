"""OpenAI's frequency and presence penalties as transformers would apply them to one model's
logits: the reference a member's penalised greedy text is checked against."""

from __future__ import annotations

import torch
from transformers import LogitsProcessor, LogitsProcessorList


class OpenAIPenalty(LogitsProcessor):
    """OpenAI's definition on one model's logits, over the tokens generated after the prompt."""

    def __init__(self, prompt_len: int, frequency: float, presence: float) -> None:
        self.prompt_len, self.frequency, self.presence = prompt_len, frequency, presence

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        written = input_ids[0, self.prompt_len :]
        counts = torch.bincount(written, minlength=scores.shape[-1])[: scores.shape[-1]]
        return scores - counts * self.frequency - (counts > 0) * self.presence


def penalised_greedy(
    member, messages, n: int, frequency_penalty: float = 0.0, presence_penalty: float = 0.0
) -> str:
    """transformers' greedy continuation of the member's own prompt for `messages`, with the
    penalties on its logits, up to its first stop id or stop string."""
    ids = torch.tensor([member.render(messages)])
    penalty = OpenAIPenalty(ids.shape[1], frequency_penalty, presence_penalty)
    with torch.no_grad():
        out = member.model.generate(
            ids,
            max_new_tokens=n,
            do_sample=False,
            logits_processor=LogitsProcessorList([penalty]),
            pad_token_id=member.tokenizer.eos_token_id,
        )
    new = out[0, ids.shape[1] :].tolist()
    stop = next((i for i, t in enumerate(new) if t in member.stop_ids), len(new))
    text = member.vocab.decode_bytes(new[:stop]).decode("utf-8", errors="ignore")
    for written in member.stop_texts:
        text = text.split(written)[0]
    return text
