"""Offline: each real member's answer on tuning-seed problems and each member's token scores of
every answer, to compare answer-vote rules (seed 2 only)."""
import json, sys
import torch
from core import Ensemble, GenerationConfig
from core.sampling import Sampler
from lab.bench.setups import default_models, load_members, load_task

task_name, form, n, tokens = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
torch.set_num_threads(1)
task = load_task(task_name, n, 2, form)
from core.testbed import model_paths
models = default_models("real") if task_name == "real" else model_paths(weak=True)
members = load_members(list(models), "cpu")
config = GenerationConfig(max_new_tokens=tokens)
out = []
for messages, check in task.items:
    answers = []
    for m in members:
        r = Ensemble([m], "single").generate(messages, config)
        answers.append((r.text, r.finish_reason == "stop", bool(check(r.text, cut=r.finish_reason == "length"))))
    scores = []
    for m in members:
        v = m.spawn(); v.start(messages)
        s = v.score([a[0] for a in answers], base="", ends=[a[1] for a in answers])
        scores.append([x.tolist() for x in s])
        v.release()
    out.append({"answers": answers, "scores": scores})
    print(len(out), [a[2] for a in answers], flush=True)
json.dump(out, open(f"votes-{task_name}-{form}.json", "w"))
