"""Periodic exports: durable schedules with one job per slot and an explicit catch-up policy."""
