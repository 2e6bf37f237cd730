"""What measures and builds the engine rather than ships with it: the benchmarks and the soak
(`lab.bench`, run as `python -m lab bench | soak`), the tiny testbed's build and training
(`lab.testbed`), the scripts behind the README's tables (`lab.scripts`) and the recorded results
(`lab/results/`). Not in the installed wheel; run from a source checkout. The engine (`core`)
never imports it.
"""
