"""The peers: raw Celery, Procrastinate and PgQueuer running :mod:`bench.workload`.

Every peer module has a worker entry point (``python -m bench.peers.<name> worker``) and a
``Producer`` class with ``enqueue(tenant, note_ids, job_id, t_enqueued)`` and ``close()``.
Configuration comes from ``BENCH_DATABASE_URL``, ``BENCH_BROKER_URL``, ``BENCH_ARTIFACT_DIR``
and ``BENCH_DONE_DIR``.
"""
