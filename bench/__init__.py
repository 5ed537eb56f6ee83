"""The notes-exports benchmark harness (``make bench``, ``python -m bench``).

Benchmarks report; they never fail on speed. See README.md, section "Benchmarks".
"""
