"""Fault drills and a chaos soak on the real processes (see README "Fault drills and chaos
soak")."""
