"""Benchmarks, the soak and the answer checker: what measures the engine, kept apart from it.

The engine (`core`) never imports the lab. Every benchmark shares `setups`
(the problems, the configurations, the loaded members) and `report` (results files stamped with
the command, date, machine and version); `commands` holds their command-line entry points.
"""
