"""`python -m lab` with `self_preference="builtin"` reading the margins given on the command
line instead of measuring them over whole answers (the experiment's only change):

    python lab/results/self-preference-segments/run_with_margins.py '{"member": margin, ...}' \
        bench --headroom ... --config 'label=specem:self_preference=builtin'
"""

import json
import sys

import core.ensemble
from core.trust import SelfPreference
from lab.cli import main

MARGINS = json.loads(sys.argv.pop(1))


def given_margins(_key, names):
    """In place of `core.preference_store.stored`: "found", these margins."""
    return True, SelfPreference("logprob", {name: MARGINS[name] for name in names})


if __name__ == "__main__":
    core.ensemble.stored = given_margins
    sys.exit(main())
