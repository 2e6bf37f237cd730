"""Each member's own answer to tuning-seed problems, and every member's token scores of every
answer (`Member.score`, the stop included for an answer that ends the turn), for `rules.py`.

    PYTHONPATH=. python lab/results/tuning-rerank-vote/answers_and_scores.py real rag 60 48

A fifth argument reads problems of another seed (`../self-preference/` reports seed 1 with it,
never for choosing a rule) and names the file after it.
"""

import json
import sys

import torch

from core import Ensemble, GenerationConfig
from core.testbed import model_paths
from lab.bench.setups import default_models, load_members, load_task


def main(task_name: str, form: str, n: int, tokens: int, seed: int = 2) -> None:
    torch.set_num_threads(1)
    task = load_task(task_name, n, seed, form)  # seed 2: never the reported seed 1
    models = default_models("real") if task_name == "real" else model_paths(weak=True)
    members = load_members(list(models), "cpu")
    config = GenerationConfig(max_new_tokens=tokens)
    out = []
    for messages, check in task.items:
        answers = []
        for member in members:
            reply = Ensemble([member], "single").generate(messages, config)
            cut = reply.finish_reason == "length"
            answers.append(
                (reply.text, reply.finish_reason == "stop", bool(check(reply.text, cut=cut)))
            )
        scores = []
        for member in members:
            view = member.spawn()
            view.start(messages)
            values = view.score([a[0] for a in answers], base="", ends=[a[1] for a in answers])
            scores.append([v.tolist() for v in values])
            view.release()
        out.append({"answers": answers, "scores": scores})
        print(len(out), [a[2] for a in answers], flush=True)
    name = f"votes-{task_name}-{form}" + (f"-seed{seed}" if seed != 2 else "")
    with open(f"{name}.json", "w") as file:
        json.dump(out, file)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), *map(int, sys.argv[5:6]))
