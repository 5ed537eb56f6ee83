"""Periodic exports: durable schedules with one job per slot and an explicit catch-up policy.

One module per job:

- :mod:`~exportcore.schedules.rules`: when a schedule fires (cron in an IANA zone, or an
  interval), which due slots a tick runs under the catch-up policy, the preview of upcoming
  slots. Pure logic, no I/O.
- :mod:`~exportcore.schedules.ticker`: the tick (run by a worker, emitted by beat) that turns
  due slots into jobs, one job per slot (docs/architecture.md INV-12 one-job-per-slot).
- :mod:`~exportcore.schedules.management`: creating, changing and running a schedule by hand
  (the API, the console and the CLI through the API).
"""
