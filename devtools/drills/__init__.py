"""Fault drills and a chaos soak on the real processes (see docs/drills.md)."""
