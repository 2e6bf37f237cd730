"""Building the shipped testbed (`python -m lab.testbed.build`): the tokenizers' training, the
training data, the training loop and the evaluation that writes `core/testbed/models/REPORT.md`.
What the models are and the task they solve stay in `core.testbed`, which ships."""
