"""Forward passes of SpecEM's and rerank's members with `every-earlier-draft.diff` applied:
each member reading only the first member's draft as its guess (the engine as it is) against
reading every earlier member's draft (the diff), and whether the texts are the same.

    git apply lab/results/draft-guesses-more/every-earlier-draft.diff
    PYTHONPATH=. python lab/results/draft-guesses-more/count_passes.py 30 7 specem rerank
"""

import sys

import torch

from core import Ensemble
from core.config import GenerationConfig
from core.hf_member import HFMember
from core.member import Member
from core.testbed import make_problems
from core.testbed.models import model_paths

torch.set_num_threads(1)
members = [HFMember.load(p, device="cpu") for p in model_paths()]
every = Member.draft


def first_only(self, k, sampler, guesses=()):
    return every(self, k, sampler, guesses=guesses[:1])


def run(draft, method: str, n: int, seed: int) -> tuple[list[str], list[int]]:
    Member.draft = draft
    ens = Ensemble(members, method)
    texts, calls = [], [0] * len(members)
    for problem in make_problems(n, seed=seed):
        stream = ens.stream(problem.messages, GenerationConfig(max_new_tokens=128))
        texts.append("".join(d.text for d in stream))
        for i, member in enumerate(stream.members):
            calls[i] += member.calls
    return texts, calls


n, seed = int(sys.argv[1]), int(sys.argv[2])
for method in sys.argv[3:]:
    a, first = run(first_only, method, n, seed)
    b, all_ = run(every, method, n, seed)
    same = sum(x == y for x, y in zip(a, b, strict=True))
    print(f"{method}: same texts {same}/{n}; passes by member, first draft only {first} "
          f"({sum(first)}), every earlier draft {all_} ({sum(all_)})")  # fmt: skip
