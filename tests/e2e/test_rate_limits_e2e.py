"""The submit rate limit holds across api replicas (docs/limits.md): two gunicorn masters
(two workers each) on one database and one Redis share each tenant's token bucket."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import httpx
import pytest

from devtools.stack import Stack
from tests.e2e.conftest import E2E, running_stack

pytestmark = pytest.mark.e2e

BURST = 20


@pytest.fixture(scope="module")
def two_replicas(servers, template_db, notes_dir, tmp_path_factory) -> Iterator[tuple[E2E, Stack]]:
    base = tmp_path_factory.mktemp("ratelimit")
    env = {
        "TENANT_SUBMIT_RATE": "0.001",  # no refill to speak of while the test runs
        "TENANT_SUBMIT_BURST": str(BURST),
        # a per-process limiter would let every one of the 4 processes take the whole burst
        "RATE_LIMIT_LOCAL_SHARE": "1",
        "API_WORKERS": "2",
    }
    with running_stack(servers, template_db, notes_dir, base, env, names=("api",)) as e:
        second = Stack.build(
            database_url=e.database_url,
            broker_url=e.broker_url,
            artifact_dir=e.artifact_dir,
            log_dir=base / "replica-2",
            names=("api",),
            extra_env=env,
        ).start()
        try:
            yield e, second
        finally:
            codes = second.stop()
            assert all(c == 0 for c in codes.values()), codes


def test_two_replicas_share_one_bucket_per_tenant(two_replicas) -> None:
    e, second = two_replicas
    urls = [e.stack.api_url, second.api_url]
    barrier, answers = threading.Barrier(8), []

    def client(url: str) -> None:
        with httpx.Client(base_url=url, headers=e.api.auth, timeout=20) as c:
            barrier.wait()
            for _ in range(8):
                r = c.post("/v1/exports", json={"all": True})
                answers.append((r.status_code, r.headers.get("retry-after"), r.text))

    threads = [threading.Thread(target=client, args=(urls[i % 2],)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    codes = sorted(code for code, _, _ in answers)
    assert codes == [202] * BURST + [429] * (64 - BURST), codes
    limited = [a for a in answers if a[0] == 429]
    assert all(int(ra) >= 900 for _, ra, _ in limited)  # one token per 1000 s
    assert all('"rate_limited"' in text or "/rate_limited" in text for _, _, text in limited)
    with e.db.connect() as conn:
        assert conn.execute("SELECT count(*) AS n FROM export_jobs").fetchone()["n"] == BURST
    for stack in (e.stack, second):
        metrics = httpx.get(stack.metrics_url("api"), timeout=10).text
        # multiprocess exposition (gunicorn): labels in name order
        assert (
            'exports_rate_limit_decisions_total{backend="redis",limit="submit",outcome="limited"}'
            in metrics
        )
        assert 'backend="local",limit="submit",outcome="limited"} 0.0' in metrics
