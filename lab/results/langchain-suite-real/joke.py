"""The default on the real pair, asked the standard suite's structured-output question: its text
and where each token came from (skips and ensemble points), then its text with
`frequency_penalty=0.5`.

    python lab/results/langchain-suite-real/joke.py
"""

from collections import Counter

import torch

from core import Ensemble
from core.testbed.real_models import real_members

JOKE = {  # the suite's Joke model as `with_structured_output` sends its schema
    "title": "Joke",
    "description": "Joke to tell user.",
    "type": "object",
    "properties": {
        "setup": {"description": "question to set up a joke", "type": "string"},
        "punchline": {"description": "answer to resolve the joke", "type": "string"},
    },
    "required": ["setup", "punchline"],
}

torch.set_num_threads(1)
ensemble = Ensemble.from_pretrained(real_members(), method="safe")
events = []
question = [{"role": "user", "content": "Tell me a joke about cats."}]
out = ensemble.generate(question, max_new_tokens=64, response_format=JOKE, on_event=events.append)
print(repr(out.text), out.finish_reason, out.stats.tokens, "tokens")
print(Counter(event.name for event in events))
for event in events:
    if event.name == "ensemble_point":
        print(event)
# the same request with OpenAI's frequency penalty (../langchain-suite-real-penalty/)
shaped = ensemble.generate(question, max_new_tokens=64, response_format=JOKE, frequency_penalty=0.5)
print("frequency_penalty=0.5:", repr(shaped.text), shaped.finish_reason)
