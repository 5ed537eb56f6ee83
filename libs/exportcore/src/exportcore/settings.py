"""One settings chain for every process (api, publisher, scanner, beat, workers, Alembic, CLI).

Values come from the environment (and an optional ``.env`` file), validated by
pydantic-settings. Durations are in seconds unless the name says otherwise.
"""

from __future__ import annotations

from functools import lru_cache
from ipaddress import IPv4Address
from pathlib import Path
from typing import Literal

from pydantic import (
    Field,
    IPvAnyAddress,
    PostgresDsn,
    SecretStr,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic_settings import BaseSettings, SettingsConfigDict

from exportcore.artifacts.location import ArtifactLocation, parse_artifact_url
from exportcore.manifests import Signer
from exportcore.retry import RetryPolicy
from exportcore.webhooks.encryption import SecretBox

MiB = 1024 * 1024


_UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}


def parse_waits(text: str) -> tuple[float, ...]:
    """A retry schedule (``"5s,5m,30m,2h"``: numbers with an optional unit s, m, h or d;
    seconds without) as seconds. Raises ValueError for an empty schedule, more than 100
    waits, or a wait that is not a positive duration."""
    waits = []
    for part in (p.strip() for p in text.split(",")):
        unit = _UNITS.get(part[-1:].lower()) if part else None
        number = part[:-1] if unit is not None else part
        try:
            value = float(number) * (unit or 1.0)
        except ValueError:
            raise ValueError(
                f"WEBHOOK_RETRY_SCHEDULE: {part!r} is not a duration such as 30s, 5m or 2h"
            ) from None
        if value <= 0:
            raise ValueError(f"WEBHOOK_RETRY_SCHEDULE: {part!r} is not a positive wait")
        waits.append(value)
    if not 1 <= len(waits) <= 100:
        raise ValueError("WEBHOOK_RETRY_SCHEDULE holds 1 to 100 waits")
    return tuple(waits)


class Settings(BaseSettings):
    """Process configuration read from environment variables of the same (upper-case) name.

    Raises ``pydantic.ValidationError`` at construction when a value is malformed, naming
    the variable, so a process fails at start rather than at first use.
    """

    # hide_input_in_errors: a validation error must never echo a password or a secret key.
    model_config = SettingsConfigDict(
        env_file=".env", extra="ignore", frozen=True, hide_input_in_errors=True
    )

    # --- connections -------------------------------------------------------------------
    database_url: PostgresDsn = Field(
        default=PostgresDsn("postgresql://postgres@127.0.0.1:55432/exports"),
        description="libpq URL of the PostgreSQL database that holds all job state; several "
        "hosts (postgresql://u:p@host1:5432,host2:5432/db?target_session_attrs=read-write) "
        "reach whichever is the primary after a failover (docs/operations.md)",
    )
    database_pooler: Literal["none", "transaction"] = Field(
        default="none",
        description="transaction: DATABASE_URL is a transaction pooler (PgBouncer "
        "pool_mode=transaction): no prepared statements, no session options (the session "
        "defaults are checked instead), LISTEN and migrations over DATABASE_DIRECT_URL",
    )
    database_direct_url: PostgresDsn | None = Field(
        default=None,
        description="libpq URL of the same database WITHOUT the pooler, for what needs a "
        "session of its own: LISTEN (publisher, webhook-delivery) and migrations; required "
        "with DATABASE_POOLER=transaction; empty = DATABASE_URL",
    )
    celery_broker_url: str = Field(
        default="redis://127.0.0.1:56379/0",
        description="Redis URL used only as the Celery transport: redis://[user:password@]"
        "host:port/db, rediss://… (TLS), or one sentinel://[user:password@]host:port/db per "
        "Sentinel joined by ';' (BROKER_SENTINEL_MASTER names the master)",
    )
    broker_sentinel_master: str = Field(
        default="",
        description="the master name the Sentinels of a sentinel:// CELERY_BROKER_URL (and "
        "RATE_LIMIT_REDIS_URL) monitor",
    )
    broker_sentinel_password: SecretStr | None = Field(
        default=None,
        description="password of the Sentinels themselves (their requirepass); the "
        "credentials in the sentinel:// URL are the Redis master's; empty = none",
    )
    broker_tls_ca_file: Path | None = Field(
        default=None,
        description="CA bundle that verifies the certificate of a rediss:// broker and "
        "rate-limit Redis; empty = the system's CAs",
    )
    broker_eviction_check: Literal["refuse", "warn"] = Field(
        default="refuse",
        description="what the publisher does when the broker's Redis reports a "
        "maxmemory-policy other than noeviction (queued messages could be evicted): refuse "
        "to start, or only log an error",
    )
    db_pool_min_size: int = Field(default=1, ge=0, description="connections kept open per process")
    db_pool_max_size: int = Field(default=8, ge=1, description="connections per process, at most")
    db_connect_timeout: int = Field(default=5, ge=1, description="seconds")
    db_statement_timeout_ms: int = Field(default=15_000, ge=0, description="0 disables")
    db_lock_timeout_ms: int = Field(default=5_000, ge=0, description="0 disables")
    db_idle_in_transaction_timeout_ms: int = Field(
        default=60_000, ge=0, description="server ends sessions idle in a transaction"
    )

    # --- jobs ---------------------------------------------------------------------------
    lease_seconds: float = Field(default=30.0, gt=0, description="lease length per claim")
    max_attempts: int = Field(default=3, ge=1, description="execution attempts per job")
    job_deadline_seconds: float = Field(
        default=3600.0, gt=0, description="time from submit after which a job fails"
    )
    fast_queue_max_notes: int = Field(
        default=30, ge=1, description="exports of up to this many notes go to exports.fast"
    )
    max_selection: int = Field(default=100_000, ge=1, description="notes per export, at most")
    max_request_bytes: int = Field(
        default=4 * 1024 * 1024,
        ge=64 * 1024,
        description="largest API request body (bytes; a full selection of note ids fits); "
        "a larger one is refused with 413",
    )

    # --- admission control ------------------------------------------------------------------
    admission_capacity: int = Field(
        default=10_000, ge=0, description="active (queued + running) jobs, at most, in all"
    )
    tenant_active_quota: int = Field(
        default=1_000, ge=0, description="active jobs per tenant unless the tenant overrides it"
    )
    admission_retry_after_seconds: int = Field(
        default=5, ge=1, description="Retry-After sent with 429 / 503 refusals"
    )
    idempotency_retention_hours: float = Field(
        default=24.0, gt=0, description="an Idempotency-Key is remembered this long"
    )

    # --- submit rate limits (docs/limits.md) ---------------------------------------------------
    tenant_submit_rate: float = Field(
        default=10.0,
        gt=0,
        description="submits per second a tenant may sustain (token bucket refill rate) "
        "unless the tenant overrides it (`exportctl tenant set-rate`)",
    )
    tenant_submit_burst: int = Field(
        default=50,
        ge=1,
        description="submits a tenant may make at once (token bucket size) unless overridden",
    )
    # --- fair dispatch (docs/limits.md, docs/architecture.md INV-16) -----------------------------
    tenant_bulk_in_flight: int = Field(
        default=1,
        ge=1,
        description="jobs of one tenant in flight on exports.bulk (dispatched to the broker "
        "or running) at most, unless the tenant overrides it (`exportctl tenant "
        "set-in-flight`); the outbox claim holds the rest back. Keep it below the number of "
        "bulk worker processes (the chart runs 1) so that another tenant's export waits at "
        "most one bulk export's run time",
    )
    tenant_fast_in_flight: int = Field(
        default=8,
        ge=1,
        description="jobs of one tenant in flight on exports.fast at most, unless the tenant "
        "overrides it: one full claim of WORKER_CLAIM_JOBS, so a tenant's burst still runs in "
        "batches while another tenant's exports find the other worker processes",
    )
    rate_limit_redis_url: str = Field(
        default="",
        description="Redis holding the shared token buckets of every api process; "
        "empty = CELERY_BROKER_URL",
    )
    rate_limit_local_share: float = Field(
        default=0.25,
        gt=0,
        le=1,
        description="while Redis is unreachable, each api process allows this share of a "
        "tenant's rate and burst (so N processes allow at most N x share x the limit)",
    )
    tenant_read_rate: float = Field(
        default=20.0,
        gt=0,
        description="reads per second a tenant may sustain on the list, history and download "
        "endpoints (its exports' and webhooks' lists, an export's events and file; a single "
        "export's status is not counted): token bucket refill rate",
    )
    tenant_read_burst: int = Field(
        default=100, ge=1, description="such reads a tenant may make at once (bucket size)"
    )
    webhook_action_rate: float = Field(
        default=0.5,
        gt=0,
        description="webhook test messages, redeliveries and recovers per second a tenant may "
        "request (each queues messages; a redelivery or a recover resets attempt budgets)",
    )
    webhook_action_burst: int = Field(
        default=10,
        ge=1,
        description="webhook tests, redeliveries and recovers a tenant may ask at once",
    )
    console_sign_in_rate: float = Field(
        default=0.2,
        gt=0,
        description="console sign-in attempts per second one client address may make "
        "(12 a minute), right or wrong",
    )
    console_sign_in_burst: int = Field(
        default=10, ge=1, description="console sign-in attempts one client address may make at once"
    )
    tenant_limits_cache_seconds: float = Field(
        default=10.0,
        ge=0,
        description="how long an api process keeps a tenant's rate override before reading "
        "it again (0: read on every submit)",
    )

    # --- downstream rate limits (docs/limits.md) -----------------------------------------------
    downstream_storage_rate: float = Field(
        default=500.0,
        ge=0,
        description="calls per second the workers of the deployment make to the object store "
        "(S3 PUT, each part of an upload, completes, deletes), shared by every replica through "
        "Redis; 0: no limit. Beyond it a call waits for its token",
    )
    downstream_storage_burst: int = Field(
        default=1000, ge=1, description="object-store calls the workers may make at once"
    )
    downstream_notes_rate: float = Field(
        default=200.0,
        ge=0,
        description="snapshot chunk reads per second the workers of the deployment make from "
        "the notes source (each up to RENDER_CHUNK_SIZE notes), shared by every replica; 0: "
        "no limit",
    )
    downstream_notes_burst: int = Field(
        default=400, ge=1, description="snapshot chunk reads the workers may make at once"
    )
    downstream_max_wait_seconds: float = Field(
        default=30.0,
        gt=0,
        description="longest wait for one downstream token; beyond it (or the job's deadline) "
        "the attempt fails with the transient error downstream_throttled and is retried",
    )

    # --- schedules ---------------------------------------------------------------------------
    scheduler_tick_seconds: float = Field(
        default=5.0, gt=0, description="how often beat emits the schedule tick"
    )
    schedule_batch_size: int = Field(default=100, ge=1, description="schedules per tick")
    schedule_slots_per_tick: int = Field(
        default=20, ge=1, description="slots (jobs) one schedule may create per tick"
    )
    schedules_per_tenant_max: int = Field(
        default=100, ge=1, description="schedules one tenant may have; creating more is a 422"
    )
    schedule_min_interval_seconds: int = Field(
        default=60,
        ge=1,
        description="shortest time between two slots of a schedule (interval, or the gap "
        "between cron slots); a shorter rule is a 422",
    )
    schedule_retry_base_seconds: float = Field(
        default=5.0,
        gt=0,
        description="a refused slot is retried after a full-jitter backoff: up to base * "
        "2**(refusals-1) seconds",
    )
    schedule_retry_cap_seconds: float = Field(
        default=300.0, gt=0, description="ceiling of a refused schedule's backoff"
    )
    beat_schedule_file: Path = Field(
        default=Path(".dev/celerybeat-schedule"),
        description="Celery beat's own state file (disposable: the cursors live in PostgreSQL)",
    )

    # --- retries -------------------------------------------------------------------------
    retry_base_seconds: float = Field(
        default=2.0, ge=0, description="backoff base: attempt n waits up to base * 2**(n-1)"
    )
    retry_cap_seconds: float = Field(default=10.0, ge=0, description="backoff ceiling")
    retry_deadline_margin_seconds: float = Field(
        default=1.0, ge=0, description="no retry is scheduled later than deadline - margin"
    )

    # --- recovery-scanner -----------------------------------------------------------------
    scanner_interval_seconds: float = Field(default=5.0, gt=0, description="pause between passes")
    scanner_batch_size: int = Field(default=100, ge=1, description="jobs per rule per pass")
    bulk_lease_seconds: float = Field(
        default=60.0,
        gt=0,
        description="how long the recovery-scanner's bulk runner owns a bulk action without "
        "finishing a batch (every batch renews it); a runner that died is replaced after it",
    )
    admission_reconcile_seconds: float = Field(
        default=60.0,
        gt=0,
        description="how often the scanner reconciles the admission counters with the jobs "
        "(one read of the active jobs; corrects drift from writes outside the admission path)",
    )
    dispatch_threshold_seconds: float = Field(
        default=60.0,
        gt=0,
        description="a queued, due job not dispatched for this long gets a new outbox event",
    )
    dispatch_backoff_max_factor: int = Field(
        default=16, ge=1, description="the threshold doubles per dispatch of a job, up to this"
    )
    hygiene_interval_seconds: float = Field(
        default=300.0, gt=0, description="how often orphan cleanup and pruning run"
    )
    orphan_grace_seconds: float = Field(
        default=3600.0, ge=0, description="age before an artifact no job owns is deleted"
    )
    job_retention_days: float = Field(
        default=30.0, gt=0, description="terminal jobs, their history and files are kept this long"
    )
    audit_retention_days: float = Field(
        default=400.0,
        ge=30,
        description="audit trail rows (operator_actions) are kept this long, jobs or not "
        "(at least 30 days: the database refuses to delete a younger row, migration 0021)",
    )
    outbox_retention_hours: float = Field(
        default=24.0, gt=0, description="sent outbox events are kept this long"
    )

    # --- artifacts / rendering ------------------------------------------------------------
    artifact_dir: Path = Field(
        default=Path(".dev/artifacts"),
        description="root folder of the file artifact store when ARTIFACT_URL is empty",
    )
    artifact_url: str = Field(
        default="",
        description="where artifacts live: file:///path or s3://bucket/prefix; "
        "empty means the folder ARTIFACT_DIR (ARTIFACT_URL wins when both are set)",
    )
    s3_endpoint_url: str = Field(
        default="", description="S3 API endpoint (MinIO, moto...); empty = AWS for S3_REGION"
    )
    s3_presign_endpoint_url: str = Field(
        default="",
        description="endpoint written into presigned download URLs, when clients reach the "
        "store under another address than the pods do; empty = S3_ENDPOINT_URL",
    )
    s3_region: str = Field(default="", description="S3 region; empty = the AWS default chain")
    s3_access_key_id: str = Field(
        default="", description="S3 access key id; empty = the default AWS credential chain"
    )
    s3_secret_access_key: SecretStr | None = Field(
        default=None, description="S3 secret access key (with S3_ACCESS_KEY_ID)"
    )
    s3_addressing_style: Literal["auto", "path", "virtual"] = Field(
        default="auto", description="bucket in the path (MinIO, moto) or in the host name"
    )
    s3_multipart_threshold: int = Field(
        default=8 * MiB,
        ge=0,
        le=5 * 1024 * MiB,
        description="bytes; larger artifacts use a multipart upload, smaller one PUT",
    )
    s3_multipart_part_size: int = Field(
        default=8 * MiB,
        ge=5 * MiB,
        le=5 * 1024 * MiB,
        description="bytes per uploaded part (S3: at least 5 MiB); bounds writer memory",
    )
    s3_connect_timeout: float = Field(default=5.0, gt=0, description="seconds to connect")
    s3_read_timeout: float = Field(default=60.0, gt=0, description="seconds per socket read")
    s3_max_attempts: int = Field(
        default=3,
        ge=1,
        description="attempts per S3 request (client retries) before the "
        "job's own retry policy takes over",
    )
    download_mode: Literal["stream", "redirect"] = Field(
        default="stream",
        description="stream downloads through the api, or answer 307 to a presigned URL "
        "(S3 only; the file backend always streams)",
    )
    presign_seconds: int = Field(
        default=300, ge=1, le=604_800, description="lifetime of a presigned download URL"
    )
    render_chunk_size: int = Field(default=500, ge=1, description="notes read per chunk, at most")
    render_chunk_bytes: int = Field(
        default=8 * 1024 * 1024,
        ge=1024,
        description="note text (title + content) read per chunk, at most (bytes)",
    )

    checkpoint_bytes: int = Field(
        default=8 * MiB,
        ge=0,
        description=(
            "bulk exports: bytes written between two checkpoints at least (file backend: "
            "an fsync; S3: at least one part); 0 = bulk exports do not checkpoint"
        ),
    )

    # --- manifests ----------------------------------------------------------------------------
    manifest_signing_key: SecretStr | None = Field(
        default=None,
        description=(
            "the deployment's Ed25519 private key that signs every export manifest: a PKCS#8 "
            "PEM or the base64 of its 32 raw bytes; empty = manifests are unsigned"
        ),
    )
    manifest_previous_public_keys: str = Field(
        default="",
        description=(
            "public keys of earlier signing keys (base64 of 32 raw bytes, comma-separated), "
            "still served at /v1/manifest-keys during a rotation"
        ),
    )

    # --- broker / workers -------------------------------------------------------------------
    broker_visibility_timeout: int = Field(
        default=7200,
        ge=60,
        description="seconds before Redis redelivers an unacknowledged message; "
        "must exceed the longest task (task_time_limit) plus margin",
    )
    task_time_limit: int = Field(default=3000, ge=10, description="hard limit per task, seconds")
    worker_max_tasks_per_child: int = Field(
        default=0, ge=0, description="recycle a prefork child after this many tasks (0: never)"
    )
    fast_worker_concurrency: int = Field(
        default=2, ge=1, description="prefork children of a worker consuming exports.fast"
    )
    worker_batch_flush_seconds: float = Field(
        default=0.05,
        ge=0,
        description="a worker holding a batch commits the jobs rendered so far once this "
        "long has passed since its last commit (a slow job never delays its neighbours' "
        "results by more than about this)",
    )
    worker_claim_jobs: int = Field(
        default=8,
        ge=1,
        le=100,
        description="small (exports.fast) exports one worker claim takes: its message's job "
        "and, beside it, due ones from the outbox in fair order; rendered one by one and "
        "finished together (1: only the message's). Bulk exports always run alone",
    )
    claims_synchronous_commit: bool = Field(
        default=False,
        description="wait for the WAL flush when a publisher's pass (mark + claim of due "
        "events) and a worker's claim commit. false (the default): those two commit with "
        "synchronous_commit = off; a crash may lose their last fraction of a second, which "
        "only sends an event again or runs a claim again (docs/architecture.md, 'Commits a "
        "crash may lose'); every submit, finish and failure still waits for its flush",
    )
    bulk_worker_concurrency: int = Field(
        default=1, ge=1, description="prefork children of a worker consuming exports.bulk"
    )
    broker_publish_timeout: float = Field(
        default=5.0, gt=0, description="socket timeout to Redis, seconds"
    )

    api_submit_batch: int = Field(
        default=16,
        ge=1,
        le=1000,
        description="submits one statement of an api process may write together: requests "
        "that arrive while another submit of the process is being written wait for it and "
        "are then written in one statement and one commit, each admitted or refused on its "
        "own (1: every submit alone). Nothing is held to fill a batch",
    )
    api_key_cache_seconds: float = Field(
        default=1.0,
        ge=0,
        le=1,
        description="how long an api process trusts an API key it looked up (0: look every "
        "request up); a revoked key is refused within this time, so at most 1 s",
    )

    # --- publisher --------------------------------------------------------------------------
    publisher_batch_size: int = Field(default=100, ge=1, description="events per claim")
    publisher_poll_seconds: float = Field(
        default=1.0, gt=0, description="longest wait without a NOTIFY before polling"
    )
    publisher_claim_seconds: float = Field(
        default=30.0, gt=0, description="how long a publisher owns a claimed outbox event"
    )
    publisher_retry_seconds: float = Field(
        default=2.0, gt=0, description="base wait before an unpublished event is retried"
    )
    publisher_messages_ahead: int = Field(
        default=2,
        ge=1,
        le=1000,
        description="one-job messages of exports.fast a publisher keeps sent but not yet "
        "claimed (on their way to a free worker, or waiting in the broker for the next "
        "one). While that many are out, further due small exports stay in the outbox and "
        "the claim of each arriving message takes them (WORKER_CLAIM_JOBS); a message that "
        "no claim reports within PUBLISHER_POLL_SECONDS no longer counts",
    )
    # --- webhooks (docs/webhooks.md) ------------------------------------------------------------
    webhook_allow_http: bool = Field(
        default=False,
        description="accept plain http:// endpoint URLs (local receivers only; make dev sets it)",
    )
    webhook_allow_private_networks: bool = Field(
        default=False,
        description="deliver to loopback, link-local, private, CGNAT, multicast and metadata "
        "addresses (refused by default: server-side request forgery; make dev sets it)",
    )
    webhook_timeout_seconds: float = Field(
        default=10.0,
        gt=0,
        le=60,
        description="wall-clock deadline of one delivery attempt: name resolution, connect, "
        "TLS, sending, the answer's headers and body together (a receiver that trickles its "
        "answer is cut off at it)",
    )
    webhook_retry_schedule: str = Field(
        default="5s,5m,30m,2h,5h,10h,10h",
        description="the waits before a message's 2nd, 3rd… attempt (s, m, h; each ±10 % "
        "jitter): its attempts and their horizon. The default is Svix's: 8 attempts over "
        "about 27.6 hours (at least 24.8 h)",
    )
    webhook_endpoint_concurrency: int = Field(
        default=4, ge=1, le=64, description="attempts in flight per endpoint, over all senders"
    )
    webhook_max_in_flight: int = Field(
        default=32, ge=1, le=512, description="attempts in flight per delivery process"
    )
    webhook_tenant_concurrency: int = Field(
        default=8,
        ge=1,
        le=511,
        description="attempts in flight per tenant over all delivery processes: one tenant's "
        "slow or failing endpoints take at most this share of the senders, the rest stay "
        "free for the other tenants; must be below WEBHOOK_MAX_IN_FLIGHT",
    )
    webhook_claim_seconds: float = Field(
        default=60.0,
        gt=0,
        description="how long a delivery process owns a claimed message (a killed process's "
        "messages are sent again after this); must exceed WEBHOOK_TIMEOUT_SECONDS",
    )
    webhook_batch_size: int = Field(
        default=200, ge=1, description="messages claimed per pass, at most"
    )
    webhook_poll_seconds: float = Field(
        default=1.0, gt=0, description="longest wait without a NOTIFY before looking for work"
    )
    webhook_breaker_threshold: int = Field(
        default=5, ge=1, description="consecutive failures that open an endpoint's circuit"
    )
    webhook_breaker_base_seconds: float = Field(
        default=1.0, gt=0, description="first open-circuit pause; doubles per failed probe"
    )
    webhook_breaker_cap_seconds: float = Field(
        default=5.0,
        gt=0,
        description="longest open-circuit pause before the next probe (a receiver that comes "
        "back is found within about this long)",
    )
    webhook_disable_after_hours: float = Field(
        default=24.0,
        gt=0,
        description="an endpoint failing without a success this long is disabled",
    )
    webhook_secret_overlap_seconds: int = Field(
        default=86_400,
        ge=0,
        le=604_800,
        description="default overlap of a secret rotation: the old secret keeps signing this long",
    )
    webhook_secret_keys: SecretStr | None = Field(
        default=None,
        description="the deployment's keys that encrypt the webhook signing secrets at rest: "
        "Fernet keys (url-safe base64 of 32 bytes; `exportctl webhook new-secret-key`), "
        "comma-separated, the current key first (it encrypts; every key decrypts). Needed "
        "by the api, webhook-delivery and the migrations once an endpoint exists; empty = "
        "no webhook can be created",
    )
    webhook_max_endpoints: int = Field(
        default=20, ge=1, le=1000, description="webhook endpoints per tenant, at most"
    )
    webhook_retention_days: float = Field(
        default=7.0, gt=0, description="delivered and failed messages and their attempts are kept"
    )

    # --- api ----------------------------------------------------------------------------------
    api_public_url: str = Field(
        default="", description="absolute base URL for links; empty = relative links"
    )

    # --- operator console ---------------------------------------------------------------------
    console_enabled: bool = Field(
        default=True,
        description="serve the operator console under /console (sign-in with an operator key)",
    )
    console_session_hours: float = Field(
        default=8.0, gt=0, le=168, description="a console session ends this long after sign-in"
    )
    console_idle_minutes: float = Field(
        default=30.0, gt=0, le=1440, description="a console session ends after this long unused"
    )
    console_cookie_secure: Literal["auto", "always", "never"] = Field(
        default="auto",
        description="the session cookie's Secure attribute: auto = when the browser reached the "
        "api over https (the request, or X-Forwarded-Proto from the ingress), always, or never",
    )
    console_refresh_seconds: float = Field(
        default=5.0, ge=1, le=300, description="how often the console's live panels refresh"
    )
    console_grafana_url: str = Field(
        default="",
        description="base URL of the Grafana that holds the notes-exports dashboards (links from "
        "the console's overview); empty = no links",
    )

    # --- logging ------------------------------------------------------------------------------
    log_level: str = Field(default="INFO", description="DEBUG, INFO, WARNING or ERROR")
    log_format: Literal["auto", "json", "text"] = Field(
        default="auto",
        description="json (one object per line), text (for people), or auto: text when stderr "
        "is a terminal, else json; make dev sets text",
    )

    # --- metrics ------------------------------------------------------------------------------
    metrics_port: int = Field(
        default=0,
        ge=0,
        le=65535,
        description="port of this process's /metrics (0: none), the api's included: metrics "
        "are never served on the public api port",
    )
    metrics_bind_address: IPvAnyAddress = Field(
        default=IPv4Address("127.0.0.1"),
        description="address the /metrics server binds: loopback unless the deployment says "
        "otherwise (the chart binds 0.0.0.0 so Prometheus can scrape the pod)",
    )
    metrics_tenant_top_n: int = Field(
        default=10,
        ge=0,
        description="per-tenant backlog gauges label at most this many tenants (the most "
        'behind first); the rest are summed as tenant="other" (0: only METRICS_TENANTS)',
    )
    metrics_tenants: str = Field(
        default="",
        description="comma-separated tenant ids that always get their own label in the "
        "per-tenant metrics (refusal counters included), or * for every tenant",
    )
    metrics_db_timeout_ms: int = Field(
        default=2000, ge=100, description="statement timeout of the scrape-time gauge queries"
    )
    dispatch_pause_alert_seconds: float = Field(
        default=14400.0,
        gt=0,
        description="a dispatch pause still on after this long fires "
        "NotesExportsDispatchPausedTooLong (the recovery-scanner serves it as the gauge "
        "exports_dispatch_pause_alert_seconds, which the rule compares with)",
    )
    broker_metrics_interval_seconds: float = Field(
        default=15.0,
        ge=0,
        description="how often the recovery-scanner inspects Redis for its exports_broker_* "
        "gauges (a background thread; 0: no broker gauges)",
    )

    # --- liveness -----------------------------------------------------------------------------
    heartbeat_file: Path | None = Field(
        default=None,
        description="file whose mtime a background process advances after each unit of "
        "progress (read by `python -m exportcore.liveness`, the probes); unset = no heartbeat",
    )

    @field_validator("database_direct_url", "broker_tls_ca_file", mode="before")
    @classmethod
    def _empty_is_none(cls, v: object) -> object:
        return None if isinstance(v, str) and not v.strip() else v

    @field_validator("database_url", "database_direct_url")
    @classmethod
    def _psycopg_scheme(cls, v: PostgresDsn | None, info: ValidationInfo) -> PostgresDsn | None:
        # Every process talks to PostgreSQL through psycopg 3 (libpq): other drivers' URL
        # schemes would only fail at the first connection.
        if v is not None and v.scheme not in ("postgresql", "postgres", "postgresql+psycopg"):
            raise ValueError(
                f"{(info.field_name or '').upper()} scheme {v.scheme!r} is not supported; "
                "use postgresql://"
            )
        return v

    @field_validator("celery_broker_url", "rate_limit_redis_url")
    @classmethod
    def _redis_url(cls, v: str, info: ValidationInfo) -> str:
        from exportcore.redis_urls import parse_redis_url

        v = v.strip()
        if v or info.field_name == "celery_broker_url":
            parse_redis_url(v)  # raises ValueError naming what is wrong (never the password)
        return v

    @model_validator(mode="after")
    def _pooler_needs_direct_url(self) -> Settings:
        # Behind a transaction pooler a LISTEN would be lost with its server connection and a
        # migration's session settings would leak to other clients: both need a session.
        if self.database_pooler == "transaction" and self.database_direct_url is None:
            raise ValueError(
                "DATABASE_POOLER=transaction needs DATABASE_DIRECT_URL: the URL of the same "
                "database without the pooler, for LISTEN and migrations"
            )
        return self

    @model_validator(mode="after")
    def _sentinel_needs_master(self) -> Settings:
        from exportcore.redis_urls import parse_redis_url

        for name, url in (
            ("CELERY_BROKER_URL", self.celery_broker_url),
            ("RATE_LIMIT_REDIS_URL", self.rate_limit_redis_url),
        ):
            if url and parse_redis_url(url).sentinels and not self.broker_sentinel_master:
                raise ValueError(f"a sentinel:// {name} needs BROKER_SENTINEL_MASTER")
        return self

    @field_validator("artifact_url")
    @classmethod
    def _artifact_url(cls, v: str) -> str:
        v = v.strip()
        if v:
            parse_artifact_url(v)
        return v

    @field_validator("s3_endpoint_url", "s3_presign_endpoint_url", "console_grafana_url")
    @classmethod
    def _endpoint(cls, v: str, info: ValidationInfo) -> str:
        v = v.strip()
        if v and not (v.startswith(("http://", "https://")) and "@" not in v):
            what = "a Grafana URL" if info.field_name == "console_grafana_url" else "an S3 endpoint"
            raise ValueError(f"{what} is an http:// or https:// URL without credentials")
        return v.rstrip("/")

    @field_validator("s3_secret_access_key", "manifest_signing_key", "webhook_secret_keys")
    @classmethod
    def _empty_secret(cls, v: SecretStr | None) -> SecretStr | None:
        return v if v is not None and v.get_secret_value() else None

    @model_validator(mode="after")
    def _manifest_keys_load(self) -> Settings:
        self.manifest_signer()  # a malformed key fails at start, not at the first export
        return self

    @model_validator(mode="after")
    def _webhook_secret_keys_load(self) -> Settings:
        self.webhook_secret_box()  # a malformed key fails at start, naming its position
        return self

    @model_validator(mode="after")
    def _s3_credentials_pair(self) -> Settings:
        # One without the other would silently fall back to another identity.
        if bool(self.s3_access_key_id) != (self.s3_secret_access_key is not None):
            raise ValueError("set both S3_ACCESS_KEY_ID and S3_SECRET_ACCESS_KEY, or neither")
        return self

    @model_validator(mode="after")
    def _schedule_backoff_bounds(self) -> Settings:
        if self.schedule_retry_cap_seconds < self.schedule_retry_base_seconds:
            raise ValueError(
                "SCHEDULE_RETRY_CAP_SECONDS must be at least SCHEDULE_RETRY_BASE_SECONDS"
            )
        return self

    @model_validator(mode="after")
    def _visibility_exceeds_tasks(self) -> Settings:
        # Redis redelivers unacknowledged messages after the visibility timeout; a task still
        # running at that point would be delivered twice (harmless, but wasted work).
        if self.broker_visibility_timeout < self.task_time_limit + 60:
            raise ValueError(
                "BROKER_VISIBILITY_TIMEOUT must exceed TASK_TIME_LIMIT by at least 60 seconds"
            )
        return self

    @model_validator(mode="after")
    def _webhook_schedule_parses(self) -> Settings:
        parse_waits(self.webhook_retry_schedule)  # raises ValueError naming the bad wait
        return self

    @property
    def webhook_retry_waits(self) -> tuple[float, ...]:
        """``WEBHOOK_RETRY_SCHEDULE`` in seconds: the wait after the n-th failed attempt."""
        return parse_waits(self.webhook_retry_schedule)

    @property
    def webhook_max_attempts(self) -> int:
        """Attempts of a message before it is ``failed``: one more than its waits."""
        return len(self.webhook_retry_waits) + 1

    @model_validator(mode="after")
    def _webhook_claim_exceeds_timeout(self) -> Settings:
        # A claim that expired while its attempt was still running would let another sender
        # start a second attempt of the same message beside it (and past the concurrency bound).
        if self.webhook_claim_seconds < self.webhook_timeout_seconds + 5:
            raise ValueError(
                "WEBHOOK_CLAIM_SECONDS must exceed WEBHOOK_TIMEOUT_SECONDS by at least 5 seconds"
            )
        return self

    @model_validator(mode="after")
    def _webhook_tenant_share(self) -> Settings:
        # A tenant allowed as many attempts as a process has senders could fill a process
        # with its own slow endpoints, and every other tenant's messages would wait.
        if self.webhook_tenant_concurrency >= self.webhook_max_in_flight:
            raise ValueError(
                "WEBHOOK_TENANT_CONCURRENCY must be below WEBHOOK_MAX_IN_FLIGHT, so that "
                "another tenant always finds a free sender"
            )
        return self

    def manifest_signer(self) -> Signer | None:
        """The manifest signer (``MANIFEST_SIGNING_KEY``), None when no key is set. Raises
        ValueError for a malformed key."""
        key = self.manifest_signing_key
        return Signer.from_texts(
            key.get_secret_value() if key is not None else None,
            self.manifest_previous_public_keys,
        )

    def webhook_secret_box(self) -> SecretBox | None:
        """The keys that encrypt webhook signing secrets (``WEBHOOK_SECRET_KEYS``), None when
        none is set. Raises ValueError for a malformed or repeated key (never its value)."""
        keys = self.webhook_secret_keys
        return SecretBox.from_text(keys.get_secret_value() if keys is not None else None)

    def retry_policy(self) -> RetryPolicy:
        """The backoff policy these settings describe."""
        return RetryPolicy(
            base_seconds=self.retry_base_seconds,
            cap_seconds=self.retry_cap_seconds,
            margin_seconds=self.retry_deadline_margin_seconds,
        )

    def artifact_location(self) -> ArtifactLocation:
        """Where artifacts live: ``ARTIFACT_URL`` when set, else the folder ``ARTIFACT_DIR``."""
        if self.artifact_url:
            return parse_artifact_url(self.artifact_url)
        return ArtifactLocation("file", path=self.artifact_dir)

    @property
    def database_dsn(self) -> str:
        """The libpq connection string (``postgresql://…``) for psycopg."""
        url = str(self.database_url)
        return url.replace("postgresql+psycopg://", "postgresql://", 1)

    @property
    def session_dsn(self) -> str:
        """The libpq URL for what needs a session of its own (LISTEN, migrations):
        ``DATABASE_DIRECT_URL`` when set, else :attr:`database_dsn`."""
        if self.database_direct_url is None:
            return self.database_dsn
        return str(self.database_direct_url).replace("postgresql+psycopg://", "postgresql://", 1)

    @property
    def sqlalchemy_url(self) -> str:
        """The same database as a SQLAlchemy URL (``postgresql+psycopg://…``), for Alembic."""
        return "postgresql+psycopg://" + self.database_dsn.split("://", 1)[1]

    @property
    def broker_url(self) -> str:
        """The Celery broker URL as a plain string."""
        return self.celery_broker_url

    @property
    def rate_limit_url(self) -> str:
        """The Redis URL of the shared submit token buckets (``RATE_LIMIT_REDIS_URL``, else
        the broker's)."""
        return self.rate_limit_redis_url or self.broker_url

    def tenant_label(self, tenant_id: str) -> str:
        """The ``tenant`` label of a per-tenant counter: the id when ``METRICS_TENANTS``
        names it (or is ``*``), else ``other`` (bounded label cardinality)."""
        named = self.metric_tenants
        return tenant_id if "*" in named or tenant_id in named else "other"

    @property
    def metric_tenants(self) -> frozenset[str]:
        """``METRICS_TENANTS`` as a set of ids (``*`` stands for every tenant)."""
        return frozenset(t.strip() for t in self.metrics_tenants.split(",") if t.strip())


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    """The process-wide settings, read once from the environment."""
    return Settings()
