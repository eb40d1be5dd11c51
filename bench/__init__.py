"""Benchmarks of the Stepwise engine: they print figures and assert nothing.

Not part of the test suite. `python bench/run.py --help` is the entry point; the method and the
latest figures are in docs/benchmark.md.
"""
