"""How many forward passes a greedy draft would save by guessing its next tokens from the
text before it (prompt lookup: the last 3, else 2, ids found earlier in the prompt or the
answer, the 4 ids after them read as a guess in the pass the next step needs anyway), counted
on each shipped member's own greedy answers with no model call beyond writing them.

    PYTHONPATH=. python lab/results/draft-guesses-more/prompt_lookup.py
"""

import torch

from core.config import GenerationConfig
from core.hf_member import HFMember
from core.sampling import Sampler
from core.testbed import make_problems
from core.testbed.models import model_paths


def lookup(context: list[int]) -> list[int]:
    for n in (3, 2):
        key = context[-n:]
        for j in range(len(context) - n - 1, -1, -1):
            if context[j : j + n] == key:
                return context[j + n : j + n + 4]
    return []


torch.set_num_threads(1)
for path in model_paths():
    member = HFMember.load(path, device="cpu")
    tokens = plain = guessed = 0
    for problem in make_problems(60, seed=7):
        view = member.spawn()
        view.start(problem.messages)
        view.draft(128, Sampler(GenerationConfig()))
        seq, prompt = list(view.state.sequence.seq), view.state.sequence.prompt_len
        answer = seq[prompt:]
        i = 1
        while i < len(answer):  # one pass over answer[i - 1] and the guess after it
            guess = lookup(seq[: prompt + i])
            kept = 0
            while kept < len(guess) and i + kept < len(answer) and guess[kept] == answer[i + kept]:
                kept += 1
            guessed += 1
            i += 1 + kept
        tokens += len(answer)
        plain += len(answer) - 1
    print(f"{path.name}: {tokens} tokens, {plain} passes step by step, {guessed} with lookup "
          f"({guessed / plain:.2f})")  # fmt: skip
