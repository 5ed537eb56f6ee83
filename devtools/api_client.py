"""The HTTP client of one tenant of a running api, for the e2e tests and the drills: its
bearer headers, a submit, the job's status as the api shows it.

A submit's verdict (202 or a problem+json) and the status document are the api's side of a
job; what happened to the job the callers read back from the database
(:class:`devtools.probe.DatabaseProbe`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import httpx

from devtools import waiting
from exportcore.domain import TERMINAL_STATES

EXPORTS = "/v1/exports"


def bearer(key: str) -> dict[str, str]:
    """The ``Authorization`` header that presents ``key`` (RFC 6750 §2.1 bearer token)."""
    return {"Authorization": f"Bearer {key}"}


@dataclass(frozen=True)
class ApiClient:
    """One tenant's keys on the api at ``base_url`` (``http://host:port``, no path).

    ``api_key`` is the tenant's key (``/v1/exports``, ``/v1/schedules``…), ``admin_key`` an
    operator key (``/v1/admin``), ``timeout`` the seconds a request may take by default.
    """

    base_url: str
    api_key: str
    admin_key: str | None = None
    timeout: float = 20.0

    @property
    def auth(self) -> dict[str, str]:
        """The tenant's bearer header."""
        return bearer(self.api_key)

    @property
    def admin(self) -> dict[str, str]:
        """The operator key's bearer header (``/v1/admin``); ``LookupError`` without one."""
        if self.admin_key is None:
            raise LookupError("this client holds no operator key")
        return bearer(self.admin_key)

    def http(self, timeout: float | None = None) -> httpx.Client:
        """A new ``httpx.Client`` on the api that sends the tenant's bearer header unless a
        request names its own (close it: ``with api.http() as c``)."""
        return httpx.Client(
            base_url=self.base_url, headers=self.auth, timeout=timeout or self.timeout
        )

    def submit(
        self,
        body: dict[str, Any],
        key: str | None = None,
        client: httpx.Client | None = None,
    ) -> httpx.Response:
        """``POST /v1/exports`` with ``body`` as the tenant, with ``Idempotency-Key: key``
        when given; on ``client`` (any ``httpx.Client`` whose base URL is the api's) or on a
        client of its own. Returns the answer whatever its status; raises
        ``httpx.HTTPError`` on a transport error."""
        headers = dict(self.auth)
        if key is not None:
            headers["Idempotency-Key"] = key
        if client is not None:
            return client.post(EXPORTS, json=body, headers=headers)
        with self.http() as c:
            return c.post(EXPORTS, json=body, headers=headers)

    def submit_ok(
        self, body: dict[str, Any], key: str | None = None, client: httpx.Client | None = None
    ) -> str:
        """:meth:`submit` and the new job's id; ``AssertionError`` (with the answer's start)
        unless the api answered 202 Accepted."""
        r = self.submit(body, key, client)
        if r.status_code != 202:
            raise AssertionError(f"submit answered {r.status_code}: {r.text[:500]}")
        return str(r.json()["id"])

    def status(self, job_id: Any, client: httpx.Client | None = None) -> dict[str, Any]:
        """``GET /v1/exports/{job_id}``: the status document; ``AssertionError`` unless 200."""
        if client is not None:
            r = client.get(f"{EXPORTS}/{job_id}", headers=self.auth)
        else:
            with self.http() as c:
                r = c.get(f"{EXPORTS}/{job_id}")
        if r.status_code != 200:
            raise AssertionError(f"GET export {job_id} answered {r.status_code}: {r.text[:500]}")
        doc: dict[str, Any] = r.json()
        return doc

    def wait_terminal(
        self, job_id: Any, timeout: float = 60.0, client: httpx.Client | None = None
    ) -> dict[str, Any]:
        """The status document once the api shows the job succeeded, failed or cancelled
        (polled every 0.1 s); :class:`devtools.waiting.WaitTimeout` after ``timeout`` s."""
        doc: dict[str, Any] = waiting.wait_for(
            lambda: (d := self.status(job_id, client))["status"] in TERMINAL_STATES and d,
            timeout,
            f"export {job_id} terminal in the api",
            interval=0.1,
        )
        return doc
