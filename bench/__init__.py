"""The notes-exports benchmark harness (``make bench``, ``python -m bench``).

Benchmarks report; they never fail on speed. See docs/performance.md.
"""
