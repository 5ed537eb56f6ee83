-- Job transitions. Every statement that changes a job is guarded by its current state (and,
-- for a running job, by its lease token), writes one history event in the same statement,
-- and returns the changed row: no row back means the transition was refused.

-- fragment: job_row_columns
-- The columns of store/jobs.py JobRow of a job aliased `j`: what every job_*_many
-- transition returns of the rows it changed.
j.id, j.tenant_id, j.status, j.queue, j.format, j.note_count, j.attempts, j.max_attempts,
j.cancel_requested, j.lease_token, j.lease_expires_at, j.deadline_at, j.error_code,
j.created_at, j.updated_at, j.finished_at, j.recovery_kind, j.recovery_started_at,
j.trace_context, j.result_ref, j.base_job_id, j.base_manifest_sha256, j.selects_all

-- fragment: job_row
-- A whole JobRow of a job aliased `j`: its columns and the seconds left to its deadline by
-- the database clock.
{{job_row_columns}}, extract(epoch FROM j.deadline_at - now())::float8 AS seconds_to_deadline

-- fragment: job_progress
-- `progress` of a job aliased `j`, for its status: the notes its current attempt has
-- rendered, as the worker last reported them at a lease renewal (job_renew_lease records
-- them in the `renewed` event); 0 before the attempt's first renewal, NULL unless running.
-- A read of what renewals wrote: nothing extra is written for it.
CASE WHEN j.status = 'running' THEN coalesce((
    SELECT (e.detail ->> 'progress')::int FROM export_job_events e
    WHERE e.job_id = j.id AND e.kind = 'renewed' AND e.attempt = j.attempts
    ORDER BY e.id DESC
    LIMIT 1), 0) END AS progress

-- fragment: item_note_columns
-- A snapshot item aliased `i` read at the note version it names (INV-18
-- snapshot-by-reference), over `LEFT JOIN LATERAL exports_item_note(i.note_id, i.version,
-- i.deleted) t ON true` (migration 0023: the current note when it is at that version, else
-- the version store's copy). A tombstone has empty text and its deletion time. `missing`:
-- neither holds the version, a violated invariant (the render fails the job with
-- `snapshot_version_missing`, it never renders something else).
i.job_id, i.ordinal, i.note_id, i.version, i.deleted,
coalesce(t.title, '') AS title, coalesce(t.content, '') AS content,
coalesce(t.pinned, false) AS pinned, coalesce(i.deleted_at, t.updated_at) AS updated_at,
NOT i.deleted AND t.title IS NULL AS missing

-- Batch statements take their jobs' row locks in ONE order, by job id, before they change
-- them: the lease transitions (job_*_if_leased_many) in a CTE `locked` over their request
-- rows `r`, written the same in each (FOR NO KEY UPDATE, the lock their UPDATE takes
-- anyway); job_claim_many and job_request_cancel_many lock in id order with their own
-- guards, and so does the publisher's dispatch mark (outbox.sql). Two of them on
-- overlapping jobs — a worker's batch and the publisher marking the same jobs dispatched —
-- then queue behind each other instead of deadlocking (PostgreSQL aborts one of a lock
-- cycle: "deadlock detected"). The lease guard is written the same in each lease
-- transition that may act for the recovery-scanner (requeue, fail, cancel): the job is
-- running under the request row's lease token, and with `expired_only` (the scanner acting
-- for a holder that went silent) its lease has expired; otherwise the caller is the lease
-- holder itself. tests/unit/test_sql_layout.py checks that these copies stay identical.

-- name: job_submit
-- A whole submit in ONE statement (one round trip, one commit): count the selection, pass
-- the cheap admission refusal (counters only, no lock) BEFORE the snapshot is written, insert
-- the queued job, record the selected notes' versions as its immutable snapshot (in note id
-- order; the text stays with the note or its version store, INV-18),
-- write its first outbox event and its `submitted` event, and admit it (exports_admit: the
-- serialised capacity/quota check, which raises XEX01/XEX02 and so rolls everything back).
-- Every read sees one snapshot, so the count and the copy always agree; that snapshot is
-- stored with the job (`snapshot`, pg_current_snapshot()), so a later delta can select
-- exactly what it did not see. Nothing is written when the selection is not acceptable (no
-- notes, over `max_selection`, unknown ids, an unusable base): the row then has a NULL id,
-- `selected`, the number of notes found, and `base_found`.
-- A delta (`since`: a succeeded full-account export of the tenant in the same format, with
-- a published manifest) selects the notes whose last change (`changed_xid`) the base's
-- snapshot did not see, then the tombstones of notes deleted since (and not written
-- again), and may be empty. Its items carry each note's version; tombstones come last.
-- exports_admit runs in the final projection, after the snapshot copy has been read to the
-- end (the FROM item `s`), so the admission lock is held only for the outbox and history
-- inserts and the commit.
-- The hot path: with explicit ids its plan does not depend on the parameters' values (the
-- ids are probed by primary key, the copy is a nested loop on them), so the submit runs it
-- as ONE generic plan (plan_cache_mode = force_generic_plan for its transaction:
-- exportcore.store.jobs); left to choose, PostgreSQL re-planned it on every call, because a
-- custom plan that knows the array's length always looks cheaper. Every note and a delta
-- are planned for their values.
WITH base AS MATERIALIZED (
    SELECT b.id, b.snapshot, m.sha256
    FROM export_jobs b
    JOIN export_manifests m ON m.job_id = b.id AND m.lease_token = b.lease_token
    WHERE b.id = %(since)s::uuid AND b.tenant_id = %(tenant_id)s AND b.status = 'succeeded'
      AND b.format = %(format)s AND b.snapshot IS NOT NULL
      AND (b.payload -> 'selection' ->> 'all')::boolean IS TRUE
), picked AS MATERIALIZED (
    -- Branches gated by the parameters alone, so that one generic (prepared, never
    -- re-planned) plan serves all: explicit ids by primary key, every note, or a delta.
    SELECT n.id, n.version FROM notes n
    WHERE n.tenant_id = %(tenant_id)s AND n.id = ANY(%(note_ids)s::bigint[])
    UNION ALL
    SELECT n.id, n.version FROM notes n
    WHERE n.tenant_id = %(tenant_id)s AND %(note_ids)s::bigint[] IS NULL
      AND %(since)s::uuid IS NULL
    UNION ALL
    SELECT n.id, n.version FROM notes n, base
    WHERE n.tenant_id = %(tenant_id)s
      AND n.changed_xid >= pg_snapshot_xmin(base.snapshot)
      AND NOT pg_visible_in_snapshot(n.changed_xid, base.snapshot)
), gone AS MATERIALIZED (
    SELECT t.note_id, t.version, t.deleted_at FROM note_tombstones t, base
    WHERE t.tenant_id = %(tenant_id)s
      AND t.deleted_xid >= pg_snapshot_xmin(base.snapshot)
      AND NOT pg_visible_in_snapshot(t.deleted_xid, base.snapshot)
      AND NOT EXISTS (SELECT 1 FROM notes n WHERE n.id = t.note_id)
), gate AS (
    SELECT s.n + g.n AS n,
           (SELECT count(*) FROM base) > 0 AS base_found,
           CASE WHEN %(since)s::uuid IS NULL
                THEN s.n BETWEEN 1 AND %(max_selection)s
                     AND (%(note_ids)s::bigint[] IS NULL
                          OR s.n = cardinality(%(note_ids)s::bigint[]))
                ELSE s.n + g.n <= %(max_selection)s AND (SELECT count(*) FROM base) > 0
           END AS acceptable
    FROM (SELECT count(*)::int AS n FROM picked) s,
         (SELECT count(*)::int AS n FROM gone) g
), job AS (
    INSERT INTO export_jobs (
        id, tenant_id, status, queue, format, payload, note_count, request_hash,
        idempotency_key, max_attempts, deadline_at, replay_of, trace_context, snapshot,
        base_job_id, base_manifest_sha256)
    SELECT %(job_id)s, %(tenant_id)s, 'queued',
           CASE WHEN g.n <= %(fast_queue_max_notes)s THEN 'exports.fast' ELSE 'exports.bulk' END,
           %(format)s, %(payload)s, g.n, %(request_hash)s, %(idempotency_key)s, %(max_attempts)s,
           now() + make_interval(secs => %(deadline_seconds)s), %(replay_of)s, %(trace_context)s,
           pg_current_snapshot(), (SELECT id FROM base), (SELECT sha256 FROM base)
    FROM gate g
    WHERE CASE WHEN g.acceptable
               THEN exports_admission_open(%(tenant_id)s, %(capacity)s, %(default_quota)s)
               ELSE false END
    RETURNING *
), items AS (
    INSERT INTO export_job_items (job_id, ordinal, note_id, version, deleted, deleted_at)
    SELECT job.id, row_number() OVER (ORDER BY x.deleted, x.note_id), x.note_id, x.version,
           x.deleted, x.deleted_at
    FROM job
    CROSS JOIN (
        SELECT p.id AS note_id, p.version, false AS deleted, NULL::timestamptz AS deleted_at
        FROM picked p
        UNION ALL
        SELECT t.note_id, t.version, true, t.deleted_at FROM gone t
    ) x
    RETURNING 1
), outbox AS (
    INSERT INTO export_outbox (id, job_id, tenant_id, queue, reason, trace_context)
    SELECT %(message_id)s, job.id, job.tenant_id, job.queue, 'submit', job.trace_context FROM job
), history AS (
    INSERT INTO export_job_events (job_id, kind, to_status, message_id, detail)
    SELECT job.id, 'submitted', 'queued', %(message_id)s,
           %(event_detail)s::jsonb || jsonb_build_object('note_count', job.note_count)
           || CASE WHEN job.base_job_id IS NULL THEN '{}'::jsonb
                   ELSE jsonb_build_object('base_job_id', job.base_job_id) END
    FROM job
)
SELECT g.n AS selected, g.base_found, s.snapshot_count, job.*,
       CASE WHEN job.id IS NOT NULL THEN %(message_id)s END AS message_id,
       CASE WHEN job.id IS NOT NULL
            THEN exports_admit(%(tenant_id)s, %(capacity)s, %(default_quota)s)::text END
           AS admitted,
       CASE WHEN job.id IS NOT NULL THEN pg_notify('export_outbox', job.queue)::text END
           AS notified
FROM gate g
LEFT JOIN job ON true
CROSS JOIN (SELECT count(*)::int AS snapshot_count FROM items) s;

-- name: job_submit_many
-- Several submits of explicit note ids in ONE statement (the api's submit coalescer:
-- concurrent requests of one api process share one statement and one commit). Each row is
-- job_submit on its own: its selection counted and checked (nothing written for a row
-- whose ids are not all the tenant's notes, or too many), admitted or refused on its own by
-- exports_admit_each (INV-9: the global counter's lock, then the tenant's, held until
-- COMMIT; a refused row returns `refusal` XEX01 / XEX02 and its `detail` and writes
-- nothing), and for an admitted one the job, its snapshot (the versions its `picked` read
-- saw, INV-18), its first outbox event and its
-- `submitted` event. One NOTIFY per queue written to. One row back per request (`n`, the
-- position in the arrays), with `selected`, `refusal`, `detail` and the job's columns (NULL
-- when nothing was written for it).
WITH r AS (
    SELECT *
    FROM unnest(%(job_ids)s::uuid[], %(message_ids)s::uuid[], %(tenant_ids)s::text[],
                %(formats)s::text[], %(payloads)s::jsonb[], %(request_hashes)s::text[],
                %(trace_contexts)s::jsonb[], %(event_details)s::jsonb[], %(requested)s::int[])
        WITH ORDINALITY
        AS r (job_id, message_id, tenant_id, format, payload, request_hash, trace_context,
              event_detail, requested, n)
), picked AS MATERIALIZED (
    SELECT DISTINCT w.n, nt.id, nt.version
    FROM unnest(%(note_rows)s::int[], %(note_ids)s::bigint[]) AS w (n, note_id)
    JOIN r ON r.n = w.n
    JOIN notes nt ON nt.id = w.note_id AND nt.tenant_id = r.tenant_id
), gate AS MATERIALIZED (
    SELECT r.*, coalesce(c.found, 0) AS selected,
           coalesce(c.found, 0) BETWEEN 1 AND %(max_selection)s
               AND coalesce(c.found, 0) = r.requested AS acceptable
    FROM r
    LEFT JOIN (SELECT p.n, count(*)::int AS found FROM picked p GROUP BY p.n) c ON c.n = r.n
), admitted AS MATERIALIZED (
    SELECT a.n, a.refusal, a.detail
    FROM exports_admit_each(
        ARRAY(SELECT g.n::int FROM gate g WHERE g.acceptable ORDER BY g.n),
        ARRAY(SELECT g.tenant_id FROM gate g WHERE g.acceptable ORDER BY g.n),
        %(capacity)s, %(default_quota)s) AS a
), job AS (
    INSERT INTO export_jobs (
        id, tenant_id, status, queue, format, payload, note_count, request_hash,
        max_attempts, deadline_at, trace_context, snapshot)
    SELECT g.job_id, g.tenant_id, 'queued',
           CASE WHEN g.selected <= %(fast_queue_max_notes)s THEN 'exports.fast'
                ELSE 'exports.bulk' END,
           g.format, g.payload, g.selected, g.request_hash, %(max_attempts)s,
           now() + make_interval(secs => %(deadline_seconds)s), g.trace_context,
           pg_current_snapshot()
    FROM gate g
    JOIN admitted a ON a.n = g.n AND a.refusal IS NULL
    RETURNING *
), items AS (
    INSERT INTO export_job_items (job_id, ordinal, note_id, version)
    SELECT job.id, row_number() OVER (PARTITION BY job.id ORDER BY p.id), p.id, p.version
    FROM job
    JOIN gate g ON g.job_id = job.id
    JOIN picked p ON p.n = g.n
    RETURNING job_id
), outbox AS (
    INSERT INTO export_outbox (id, job_id, tenant_id, queue, reason, trace_context)
    SELECT g.message_id, job.id, job.tenant_id, job.queue, 'submit', job.trace_context
    FROM job JOIN gate g ON g.job_id = job.id
), history AS (
    INSERT INTO export_job_events (job_id, kind, to_status, message_id, detail)
    SELECT job.id, 'submitted', 'queued', g.message_id,
           g.event_detail || jsonb_build_object('note_count', job.note_count)
    FROM job JOIN gate g ON g.job_id = job.id
)
SELECT g.n, g.selected, a.refusal, a.detail, s.snapshot_count, job.*,
       CASE WHEN job.id IS NOT NULL THEN g.message_id END AS message_id,
       nt.notified
FROM gate g
LEFT JOIN admitted a ON a.n = g.n
LEFT JOIN job ON job.id = g.job_id
LEFT JOIN (SELECT i.job_id, count(*)::int AS snapshot_count FROM items i GROUP BY i.job_id) s
    ON s.job_id = job.id
CROSS JOIN (SELECT count(pg_notify('export_outbox', q.queue))::int AS notified
            FROM (SELECT DISTINCT queue FROM job) q) nt
ORDER BY g.n;

-- name: job_claim_many
-- queued -> running for every job of a delivered batch: the jobs of the message
-- (`job_ids`, with the outbox event `message_ids` that carried each) and the due jobs this
-- claim took from the outbox beside them (the events outbox_mark_sent_and_claim_due claimed
-- for `take_token` in the same transaction; NULL: none). Only a due, uncancelled job with
-- attempts and time left; each gets a fresh lease token and consumes one attempt. A
-- duplicate or early message matches nothing. The events this claim delivers for the first
-- time (`deliver`: still unsent, locked here so that a publisher's mark of the same event
-- waits and then finds it sent) stamp their job's dispatch in the claim's own row version
-- (last_dispatched_at, dispatch_count + 1) and write its `dispatched` event before the
-- `claimed` one; outbox_mark_delivered marks them sent next. The rows are locked in id
-- order first, so two workers claiming overlapping batches (a duplicate delivery) never
-- deadlock. The order in which a batch is formed (fairness across tenants) is the outbox
-- claim's: outbox_mark_sent_and_claim_due.
WITH deliver AS (
    SELECT o.id, o.job_id, o.reason, o.claim_token IS NOT DISTINCT FROM %(take_token)s AS taken
    FROM export_outbox o
    WHERE (o.id = ANY(%(message_ids)s::uuid[]) OR o.claim_token = %(take_token)s)
      AND o.sent_at IS NULL
    ORDER BY o.id
    FOR UPDATE OF o
), wanted AS (
    SELECT w.job_id, min(w.message_id::text)::uuid AS message_id
    FROM (
        SELECT job_id, message_id
        FROM unnest(%(job_ids)s::uuid[], %(message_ids)s::uuid[]) AS m (job_id, message_id)
        UNION ALL
        SELECT d.job_id, d.id FROM deliver d WHERE d.taken
    ) w
    GROUP BY w.job_id
), stamp AS (
    SELECT d.job_id, min(d.id::text)::uuid AS event_id, min(d.reason) AS reason,
           bool_or(d.taken) AS taken, count(*)::int AS n
    FROM deliver d
    GROUP BY d.job_id
), locked AS (
    SELECT j.id
    FROM export_jobs j
    JOIN wanted w ON w.job_id = j.id
    WHERE j.status = 'queued'
      AND j.next_attempt_at <= now()
      AND NOT j.cancel_requested
      AND j.deadline_at > now()
      AND j.attempts < j.max_attempts
    ORDER BY j.id
    FOR UPDATE OF j
), claimed AS (
    UPDATE export_jobs j
    SET status = 'running',
        attempts = j.attempts + 1,
        lease_token = gen_random_uuid(),
        lease_expires_at = now() + make_interval(secs => %(lease_seconds)s),
        started_at = coalesce(j.started_at, now()),
        error_code = NULL,
        error_detail = NULL,
        last_dispatched_at = CASE WHEN s.job_id IS NULL THEN j.last_dispatched_at ELSE now() END,
        dispatch_count = j.dispatch_count + coalesce(s.n, 0),
        updated_at = now()
    FROM locked l
    JOIN wanted w ON w.job_id = l.id
    LEFT JOIN stamp s ON s.job_id = l.id
    WHERE j.id = l.id
      AND j.status = 'queued'
      AND j.next_attempt_at <= now()
      AND NOT j.cancel_requested
      AND j.deadline_at > now()
      AND j.attempts < j.max_attempts
    RETURNING {{job_row_columns}},
              w.message_id, j.dispatch_count, s.event_id AS dispatch_event, s.reason AS dispatch_reason,
              s.taken AS dispatch_taken
), history AS (
    INSERT INTO export_job_events
        (job_id, kind, from_status, to_status, attempt, lease_token, message_id, detail)
    SELECT c.id, k.kind, k.from_status, k.to_status,
           CASE WHEN k.n = 2 THEN c.attempts END, CASE WHEN k.n = 2 THEN c.lease_token END,
           CASE WHEN k.n = 1 THEN c.dispatch_event ELSE c.message_id END,
           CASE WHEN k.n = 1
                THEN jsonb_build_object('reason', c.dispatch_reason,
                                        'dispatch_count', c.dispatch_count)
                     || CASE WHEN c.dispatch_taken THEN '{"by": "claim"}'::jsonb
                             ELSE '{}'::jsonb END
                ELSE '{}'::jsonb END
    FROM claimed c
    CROSS JOIN (VALUES (1, 'dispatched', NULL, NULL), (2, 'claimed', 'queued', 'running'))
        AS k (n, kind, from_status, to_status)
    WHERE k.n = 2 OR c.dispatch_event IS NOT NULL
    ORDER BY c.id, k.n
)
SELECT {{job_row}}
FROM claimed j
ORDER BY id;

-- name: job_claim_refusal_many
-- Why claims matched nothing (read only, on the refusal path), with the attempt and lease
-- token the job has now: the execution a refused (redelivered) message duplicates.
SELECT id, status, queue, attempts, max_attempts, lease_token, cancel_requested,
       lease_expires_at,
       next_attempt_at > now() AS not_due,
       deadline_at <= now() AS past_deadline,
       lease_expires_at > now() AS lease_valid
FROM export_jobs
WHERE id = ANY(%(job_ids)s::uuid[]);

-- name: job_items_first_chunk_many
-- The first chunk of the snapshot of each job of a batch, in one read: per job at most
-- `limit` notes and at most `max_bytes` of title + content (but always its first note), as
-- job_items_chunk. The jobs: `job_ids`, and those of the events the claim in the same
-- transaction took for `take_token` (NULL: none). `window_rows` is how many notes the job's
-- window held before the byte bound: fewer than `limit` means that job's snapshot ends here.
SELECT job_id, ordinal, note_id, title, content, pinned, updated_at, version, deleted,
       missing, window_rows
FROM (
    SELECT r.*,
           count(*) OVER (PARTITION BY r.job_id) AS window_rows,
           row_number() OVER (PARTITION BY r.job_id ORDER BY r.ordinal) AS n,
           sum(octet_length(r.title) + octet_length(r.content))
               OVER (PARTITION BY r.job_id ORDER BY r.ordinal) AS running_bytes
    FROM (
        SELECT {{item_note_columns}}
        FROM (
            SELECT unnest(%(job_ids)s::uuid[]) AS job_id
            UNION
            SELECT o.job_id FROM export_outbox o
            WHERE o.claim_token = %(take_token)s AND o.sent_at IS NULL
        ) b
        CROSS JOIN LATERAL (
            SELECT * FROM export_job_items x
            WHERE x.job_id = b.job_id
            ORDER BY x.ordinal
            LIMIT %(limit)s
        ) i
        LEFT JOIN LATERAL exports_item_note(i.note_id, i.version, i.deleted) t ON true
    ) r
) w
WHERE n = 1 OR running_bytes <= %(max_bytes)s
ORDER BY job_id, ordinal;

-- name: job_renew_lease
-- Extend the lease of a running job, only by its current holder and only before expiry.
WITH renewed AS (
    UPDATE export_jobs
    SET lease_expires_at = now() + make_interval(secs => %(lease_seconds)s), updated_at = now()
    WHERE id = %(job_id)s
      AND status = 'running'
      AND lease_token = %(lease_token)s
      AND lease_expires_at > now()
      AND NOT cancel_requested
      AND deadline_at > now()
    RETURNING *
), history AS (
    INSERT INTO export_job_events (job_id, kind, attempt, lease_token, detail)
    SELECT id, 'renewed', attempts, lease_token,
           jsonb_build_object('lease_expires_at', lease_expires_at, 'progress', %(progress)s::int)
    FROM renewed
)
SELECT * FROM renewed;

-- name: job_finish_if_leased_many
-- running -> succeeded for each job of a batch: a compare-and-set PER ROW on (running, the
-- same token, lease unexpired, deadline ahead, not cancelled). Records the artifact that
-- won (with the store's ETag, NULL for the file backend) and one `succeeded` event per
-- row; a stale worker's row matches nothing and the other rows are not affected.
WITH r AS (
    SELECT *
    FROM unnest(%(job_ids)s::uuid[], %(lease_tokens)s::uuid[], %(result_refs)s::text[],
                %(sha256s)s::text[], %(nbytes)s::bigint[], %(rows)s::int[], %(etags)s::text[])
        AS r (job_id, lease_token, result_ref, sha256, nbytes, nrows, etag)
), locked AS (
    -- the batch's jobs locked in id order (the file header)
    SELECT j.id FROM export_jobs j
    WHERE j.id IN (SELECT r.job_id FROM r)
    ORDER BY j.id
    FOR NO KEY UPDATE OF j
), done AS (
    UPDATE export_jobs j
    SET status = 'succeeded',
        result_ref = r.result_ref,
        result_sha256 = r.sha256,
        result_bytes = r.nbytes,
        result_rows = r.nrows,
        result_etag = r.etag,
        lease_expires_at = NULL,
        finished_at = now(),
        updated_at = now()
    FROM r JOIN locked l ON l.id = r.job_id
    WHERE j.id = r.job_id
      AND j.status = 'running'
      AND j.lease_token = r.lease_token
      AND j.lease_expires_at > now()
      AND j.deadline_at > now()
      AND NOT j.cancel_requested
    RETURNING {{job_row_columns}}, j.result_sha256, j.result_bytes, j.result_rows, j.result_etag
), history AS (
    INSERT INTO export_job_events (job_id, kind, from_status, to_status, attempt, lease_token, detail)
    SELECT id, 'succeeded', 'running', 'succeeded', attempts, lease_token,
           jsonb_build_object('result_ref', result_ref, 'sha256', result_sha256,
                              'bytes', result_bytes, 'rows', result_rows,
                              'etag', result_etag)
    FROM done
)
SELECT {{job_row}}
FROM done j
ORDER BY id;

-- name: job_get
SELECT j.*, {{job_progress}} FROM export_jobs j WHERE j.id = %(job_id)s;

-- name: job_past_deadline
SELECT deadline_at <= now() AS past FROM export_jobs WHERE id = %(job_id)s;

-- name: job_get_for_tenant
SELECT j.*, {{job_progress}} FROM export_jobs j
WHERE j.id = %(job_id)s AND j.tenant_id = %(tenant_id)s;

-- name: job_items_chunk
-- One chunk of the snapshot, by ordinal (keyset), each item resolved to its note version
-- (item_note_columns), for streaming renders: at most `limit`
-- notes and at most `max_bytes` of title + content (but always the first note), so memory
-- stays bounded whatever the notes' sizes. `window_rows` is how many notes the ordinal
-- window held before the byte bound: fewer than `limit` means the snapshot ends here.
SELECT ordinal, note_id, title, content, pinned, updated_at, version, deleted, missing,
       window_rows
FROM (
    SELECT r.*,
           count(*) OVER () AS window_rows,
           row_number() OVER (ORDER BY r.ordinal) AS n,
           sum(octet_length(r.title) + octet_length(r.content)) OVER (ORDER BY r.ordinal)
               AS running_bytes
    FROM (
        SELECT {{item_note_columns}}
        FROM (
            SELECT * FROM export_job_items
            WHERE job_id = %(job_id)s AND ordinal > %(after)s
            ORDER BY ordinal
            LIMIT %(limit)s
        ) i
        LEFT JOIN LATERAL exports_item_note(i.note_id, i.version, i.deleted) t ON true
    ) r
) w
WHERE n = 1 OR running_bytes <= %(max_bytes)s
ORDER BY ordinal;

-- name: job_events
-- One page of a job's history in the order things happened (at, then id: a `dispatched`
-- event is dated when its dispatch began, so it may have a later id than the claim that
-- followed it), after a keyset cursor (at, id), at most `limit` events.
SELECT id, at, kind, from_status, to_status, attempt, lease_token, message_id, detail
FROM export_job_events
WHERE job_id = %(job_id)s
  AND (%(after_at)s::timestamptz IS NULL
       OR (at, id) > (%(after_at)s::timestamptz, %(after_id)s::bigint))
ORDER BY at, id
LIMIT %(limit)s;

-- name: job_lock_lease_expired
-- The recovery-scanner's batch: running jobs whose lease has expired, oldest expiry first,
-- locked (SKIP LOCKED: several scanners never take the same job) until the caller's COMMIT;
-- it decides per job and settles them with the job_*_if_leased_many transitions below
-- (`expired_only`).
SELECT {{job_row}}
FROM export_jobs j
WHERE status = 'running' AND lease_expires_at <= now()
ORDER BY lease_expires_at
LIMIT %(limit)s
FOR UPDATE SKIP LOCKED;

-- name: job_requeue_if_leased_many
-- running -> queued for each job of a batch, due again after its `delay_seconds` but never
-- later than `margin_seconds` before the deadline, with a new outbox event (`message_ids`)
-- available at that time. Used by the lease holder after a transient error (event
-- `retried`, outbox reason `retry`) and by the recovery-scanner once the lease has expired
-- (`expired_only`, event `lease_expired`, outbox reason `recovery`). A row is refused when
-- its token lost the lease, no attempt or no time is left, or on a cancel.
WITH r AS (
    SELECT *
    FROM unnest(%(job_ids)s::uuid[], %(lease_tokens)s::uuid[], %(message_ids)s::uuid[],
                %(delays)s::float8[], %(error_codes)s::text[], %(error_details)s::text[])
        AS r (job_id, lease_token, message_id, delay_seconds, error_code, error_detail)
), locked AS (
    -- the batch's jobs locked in id order (the file header)
    SELECT j.id FROM export_jobs j
    WHERE j.id IN (SELECT r.job_id FROM r)
    ORDER BY j.id
    FOR NO KEY UPDATE OF j
), requeued AS (
    UPDATE export_jobs j
    SET status = 'queued',
        lease_expires_at = NULL,
        next_attempt_at = least(now() + make_interval(secs => r.delay_seconds),
                                j.deadline_at - make_interval(secs => %(margin_seconds)s)),
        error_code = r.error_code,
        error_detail = r.error_detail,
        recovery_kind = CASE WHEN %(expired_only)s THEN 'lease_expiry' END,
        recovery_started_at = CASE WHEN %(expired_only)s THEN j.lease_expires_at END,
        updated_at = now()
    FROM r JOIN locked l ON l.id = r.job_id
    WHERE j.id = r.job_id
      AND j.status = 'running'
      AND j.lease_token = r.lease_token
      AND (NOT %(expired_only)s OR j.lease_expires_at <= now())
      AND j.attempts < j.max_attempts
      AND NOT j.cancel_requested
      AND j.deadline_at > now() + make_interval(secs => %(margin_seconds)s)
    RETURNING {{job_row_columns}}, j.next_attempt_at, r.message_id
), outbox AS (
    INSERT INTO export_outbox (id, job_id, tenant_id, queue, reason, available_at, trace_context)
    SELECT message_id, id, tenant_id, queue, %(outbox_reason)s, next_attempt_at, trace_context
    FROM requeued
), history AS (
    INSERT INTO export_job_events
        (job_id, kind, from_status, to_status, attempt, lease_token, message_id, detail)
    SELECT id, %(event_kind)s, 'running', 'queued', attempts, lease_token, message_id,
           jsonb_build_object('error_code', error_code, 'next_attempt_at', next_attempt_at)
    FROM requeued
)
SELECT {{job_row}}
FROM requeued j
ORDER BY id;

-- name: job_fail_if_leased_many
-- running -> failed + dead letter for each job of a batch: a permanent error, or no attempt
-- or time left. By the lease holder, or by the recovery-scanner once the lease has expired
-- (`expired_only`, which also writes the `lease_expired` event first).
WITH r AS (
    SELECT *
    FROM unnest(%(job_ids)s::uuid[], %(lease_tokens)s::uuid[], %(error_codes)s::text[],
                %(error_details)s::text[])
        AS r (job_id, lease_token, error_code, error_detail)
), locked AS (
    -- the batch's jobs locked in id order (the file header)
    SELECT j.id FROM export_jobs j
    WHERE j.id IN (SELECT r.job_id FROM r)
    ORDER BY j.id
    FOR NO KEY UPDATE OF j
), failed AS (
    UPDATE export_jobs j
    SET status = 'failed',
        error_code = r.error_code,
        error_detail = r.error_detail,
        lease_expires_at = NULL,
        finished_at = now(),
        updated_at = now()
    FROM r JOIN locked l ON l.id = r.job_id
    WHERE j.id = r.job_id
      AND j.status = 'running'
      AND j.lease_token = r.lease_token
      AND (NOT %(expired_only)s OR j.lease_expires_at <= now())
    RETURNING {{job_row_columns}}, j.error_detail
), dead AS (
    INSERT INTO export_dead_letters (job_id, tenant_id, reason, detail, attempts)
    SELECT id, tenant_id, error_code, coalesce(error_detail, ''), attempts FROM failed
), history AS (
    INSERT INTO export_job_events (job_id, kind, from_status, to_status, attempt, lease_token, detail)
    SELECT f.id, k.kind, k.from_status, k.to_status, f.attempts, f.lease_token,
           jsonb_build_object('error_code', f.error_code, 'error_detail', f.error_detail)
    FROM failed f
    CROSS JOIN (VALUES (1, 'lease_expired', 'running', 'running'),
                       (2, 'failed', 'running', 'failed'),
                       (3, 'dead_lettered', 'failed', 'failed')) AS k (n, kind, from_status, to_status)
    WHERE k.n > 1 OR %(expired_only)s
    ORDER BY f.id, k.n
)
SELECT {{job_row}}
FROM failed j
ORDER BY id;

-- name: job_cancel_if_leased_many
-- running -> cancelled for each job of a batch whose cancel was requested, once the cancel
-- has stopped its lease holder (or, with `expired_only`, once its lease has expired).
WITH r AS (
    SELECT *
    FROM unnest(%(job_ids)s::uuid[], %(lease_tokens)s::uuid[]) AS r (job_id, lease_token)
), locked AS (
    -- the batch's jobs locked in id order (the file header)
    SELECT j.id FROM export_jobs j
    WHERE j.id IN (SELECT r.job_id FROM r)
    ORDER BY j.id
    FOR NO KEY UPDATE OF j
), cancelled AS (
    UPDATE export_jobs j
    SET status = 'cancelled', lease_expires_at = NULL, finished_at = now(), updated_at = now()
    FROM r JOIN locked l ON l.id = r.job_id
    WHERE j.id = r.job_id
      AND j.status = 'running'
      AND j.lease_token = r.lease_token
      AND (NOT %(expired_only)s OR j.lease_expires_at <= now())
      AND j.cancel_requested
    RETURNING {{job_row_columns}}
), history AS (
    INSERT INTO export_job_events (job_id, kind, from_status, to_status, attempt, lease_token)
    SELECT c.id, k.kind, 'running', k.to_status, c.attempts, c.lease_token
    FROM cancelled c
    CROSS JOIN (VALUES (1, 'lease_expired', 'running'), (2, 'cancelled', 'cancelled'))
        AS k (n, kind, to_status)
    WHERE k.n > 1 OR %(expired_only)s
    ORDER BY c.id, k.n
)
SELECT {{job_row}}
FROM cancelled j
ORDER BY id;

-- name: job_request_cancel_many
-- Cancels asked for by a tenant (its own jobs: `tenant_id`) or an operator (any tenant's:
-- `tenant_id` NULL), for one job or a bulk action's batch: a queued job is cancelled at once
-- (same transaction); a running job is flagged and its worker stops at the next chunk
-- boundary. Terminal jobs and jobs whose cancel was already requested match nothing, so a
-- bulk cancel racing a single one cancels each job once. The jobs are locked in id order
-- first (the one lock order of batch statements, the file header; FOR UPDATE
-- here returns each job's latest status). `detail` (who asked, the bulk action) goes on the
-- history events.
WITH target AS (
    SELECT j.id, j.status FROM export_jobs j
    WHERE j.id = ANY (%(job_ids)s::uuid[])
      AND (%(tenant_id)s::text IS NULL OR j.tenant_id = %(tenant_id)s::text)
    ORDER BY j.id
    FOR UPDATE OF j
), changed AS (
    UPDATE export_jobs j
    SET cancel_requested = true,
        status = CASE WHEN t.status = 'queued' THEN 'cancelled' ELSE j.status END,
        finished_at = CASE WHEN t.status = 'queued' THEN now() ELSE j.finished_at END,
        updated_at = now()
    FROM target t
    WHERE j.id = t.id AND j.status IN ('queued', 'running') AND NOT j.cancel_requested
    RETURNING j.*, t.status AS previous_status
), history AS (
    INSERT INTO export_job_events (job_id, kind, from_status, to_status, attempt, detail)
    SELECT c.id, k.kind, c.previous_status, k.to_status, c.attempts, %(detail)s::jsonb
    FROM changed c
    CROSS JOIN (VALUES (1, 'cancel_requested', NULL), (2, 'cancelled', 'cancelled'))
        AS k (n, kind, to_status)
    WHERE k.n = 1 OR c.previous_status = 'queued'
    ORDER BY c.id, k.n
)
SELECT j.*, {{job_progress}} FROM changed j ORDER BY j.id;

-- name: job_replay
-- A NEW queued job with the failed original's snapshot and `replay_of`; the original job
-- and its dead letter stay as they are (only a `replayed` history event is added). `detail`
-- (who asked, the bulk action) goes on both history events.
WITH original AS (
    SELECT * FROM export_jobs WHERE id = %(original_id)s AND status = 'failed'
), job AS (
    INSERT INTO export_jobs (
        id, tenant_id, status, queue, format, payload, note_count, request_hash,
        max_attempts, deadline_at, replay_of, trace_context, snapshot, base_job_id,
        base_manifest_sha256)
    SELECT %(job_id)s, tenant_id, 'queued', queue, format, payload, note_count, request_hash,
           %(max_attempts)s, now() + make_interval(secs => %(deadline_seconds)s), id,
           %(trace_context)s, snapshot, base_job_id, base_manifest_sha256
    FROM original
    RETURNING *
), items AS (
    INSERT INTO export_job_items (job_id, ordinal, note_id, version, deleted, deleted_at)
    SELECT job.id, i.ordinal, i.note_id, i.version, i.deleted, i.deleted_at
    FROM job JOIN export_job_items i ON i.job_id = job.replay_of
    RETURNING 1
), outbox AS (
    INSERT INTO export_outbox (id, job_id, tenant_id, queue, reason, trace_context)
    SELECT %(message_id)s, job.id, job.tenant_id, job.queue, 'replay', job.trace_context
    FROM job
), history AS (
    INSERT INTO export_job_events (job_id, kind, from_status, to_status, message_id, detail)
    SELECT job.id, 'submitted', NULL, 'queued', %(message_id)s,
           jsonb_build_object('source', 'replay', 'replay_of', job.replay_of)
               || %(detail)s::jsonb
    FROM job
    UNION ALL
    SELECT job.replay_of, 'replayed', NULL, NULL, NULL,
           jsonb_build_object('replayed_by', job.id) || %(detail)s::jsonb
    FROM job
)
SELECT job.*, (SELECT count(*) FROM items) AS snapshot_count,
       pg_notify('export_outbox', job.queue)::text AS notified
FROM job;

-- name: job_replay_many
-- A bulk replay's batch, set-based: for each open dead letter asked (`dead_letter_ids`, with
-- the new job's and its outbox message's id at the same position), lock its failed job (in
-- job id order, as a single replay locks it, so replays queue up and never deadlock), move
-- the dead letter open -> replayed by `actor` (the guard: a dead letter a single replay or
-- another bulk replay took meanwhile is no longer open and matches nothing, rechecked after
-- the lock), and write the replay as job_replay does: the job, its snapshot items, its
-- outbox event and both history events. A job that already has a queued, running or
-- succeeded replay is left alone (the unique index export_jobs_one_active_replay is the
-- durable guard behind). Admission control follows, per tenant (admission_admit_many).
-- Returns one row per replay written: the dead letter, the original, the new job.
WITH asked AS (
    SELECT a.dead_letter_id, a.job_id, a.message_id
    FROM unnest(%(dead_letter_ids)s::bigint[], %(job_ids)s::uuid[], %(message_ids)s::uuid[])
        AS a (dead_letter_id, job_id, message_id)
), original AS (
    SELECT j.id, j.tenant_id, j.queue, j.format, j.payload, j.note_count, j.request_hash,
           j.snapshot, j.base_job_id, j.base_manifest_sha256,
           a.dead_letter_id, a.job_id AS new_id, a.message_id
    FROM asked a
    JOIN export_dead_letters d ON d.id = a.dead_letter_id
    JOIN export_jobs j ON j.id = d.job_id
    WHERE j.status = 'failed'
    ORDER BY j.id
    FOR UPDATE OF j
), marked AS (
    UPDATE export_dead_letters d
    SET state = 'replayed', replay_job_id = o.new_id, replayed_at = now(),
        replayed_by = %(actor)s
    FROM original o
    WHERE d.id = o.dead_letter_id AND d.job_id = o.id AND d.state = 'open'
      AND NOT EXISTS (
          SELECT 1 FROM export_jobs r
          WHERE r.replay_of = o.id AND r.status IN ('queued', 'running', 'succeeded'))
    RETURNING d.id AS dead_letter_id, o.id AS original_id
), job AS (
    INSERT INTO export_jobs (
        id, tenant_id, status, queue, format, payload, note_count, request_hash,
        max_attempts, deadline_at, replay_of, trace_context, snapshot, base_job_id,
        base_manifest_sha256)
    SELECT o.new_id, o.tenant_id, 'queued', o.queue, o.format, o.payload, o.note_count,
           o.request_hash, %(max_attempts)s, now() + make_interval(secs => %(deadline_seconds)s),
           o.id, %(trace_context)s, o.snapshot, o.base_job_id, o.base_manifest_sha256
    FROM marked m JOIN original o ON o.dead_letter_id = m.dead_letter_id
    RETURNING *
), items AS (
    INSERT INTO export_job_items (job_id, ordinal, note_id, version, deleted, deleted_at)
    SELECT job.id, i.ordinal, i.note_id, i.version, i.deleted, i.deleted_at
    FROM job JOIN export_job_items i ON i.job_id = job.replay_of
), outbox AS (
    INSERT INTO export_outbox (id, job_id, tenant_id, queue, reason, trace_context)
    SELECT o.message_id, job.id, job.tenant_id, job.queue, 'replay', job.trace_context
    FROM job JOIN original o ON o.new_id = job.id
), history AS (
    INSERT INTO export_job_events (job_id, kind, from_status, to_status, message_id, detail)
    SELECT job.id, 'submitted', NULL, 'queued', o.message_id,
           jsonb_build_object('source', 'replay', 'replay_of', job.replay_of)
               || %(detail)s::jsonb
    FROM job JOIN original o ON o.new_id = job.id
    UNION ALL
    SELECT job.replay_of, 'replayed', NULL, NULL, NULL,
           jsonb_build_object('replayed_by', job.id) || %(detail)s::jsonb
    FROM job
), notified AS (
    SELECT pg_notify('export_outbox', q.queue) FROM (SELECT DISTINCT queue FROM job) q
)
SELECT o.dead_letter_id, job.replay_of AS original_id, job.id, job.tenant_id, job.queue,
       (SELECT count(*) FROM notified) AS notified
FROM job JOIN original o ON o.new_id = job.id
ORDER BY o.dead_letter_id;

-- name: job_mark_replayed
-- The `replayed` history event of a failed job redriven with a corrected input (the new
-- job was written by job_submit with `replay_of`, in the same transaction): the original
-- stays failed and its history says by which job and what was corrected. The job row is
-- held FOR KEY SHARE, as every writer of a hot child row holds it (INV-17).
INSERT INTO export_job_events (job_id, kind, detail)
SELECT j.id, 'replayed',
       jsonb_build_object('replayed_by', %(replay_id)s::uuid, 'corrected', %(corrected)s::jsonb)
FROM export_jobs j
WHERE j.id = %(job_id)s AND j.status = 'failed'
FOR KEY SHARE OF j
RETURNING job_id;

-- name: job_lock_for_replay
-- Lock the job a replay is asked for: concurrent replays of one job queue up here, so the
-- first writes the replay and the others find it (idempotent replay). The unique index
-- export_jobs_one_active_replay is the durable guard behind this lock.
SELECT id, tenant_id, status FROM export_jobs WHERE id = %(job_id)s FOR UPDATE;

-- name: job_latest_replay
-- The newest replay of a job (any status), or nothing.
SELECT * FROM export_jobs
WHERE replay_of = %(job_id)s
ORDER BY created_at DESC, id DESC
LIMIT 1;

-- name: job_list_for_tenant
-- A tenant's jobs, newest first, after a keyset cursor (created_at, id), one status or all.
SELECT j.*, {{job_progress}} FROM export_jobs j
WHERE j.tenant_id = %(tenant_id)s
  AND (%(status)s::text IS NULL OR j.status = %(status)s::text)
  AND (%(before_created_at)s::timestamptz IS NULL
       OR (j.created_at, j.id) < (%(before_created_at)s::timestamptz, %(before_id)s::uuid))
ORDER BY j.created_at DESC, j.id DESC
LIMIT %(limit)s;

-- name: job_list_for_tenant_labelled
-- job_list_for_tenant of the jobs that carry every tag and metadata pair asked (`labels`,
-- {"metadata": {...}, "tags": [...]}): a containment served by the partial GIN index
-- export_jobs_labels_idx (migration 0025), whose predicate `payload ? 'labels'` is written
-- out so that the planner knows the index applies. A statement of its own rather than an
-- optional condition of job_list_for_tenant: a generic plan of "labels IS NULL OR …" could
-- never use the index (tests/integration/test_labels_plan.py checks the plan at 1,000,000
-- jobs).
SELECT j.*, {{job_progress}} FROM export_jobs j
WHERE j.tenant_id = %(tenant_id)s
  AND j.payload ? 'labels' AND j.payload -> 'labels' @> %(labels)s::jsonb
  AND (%(status)s::text IS NULL OR j.status = %(status)s::text)
  AND (%(before_created_at)s::timestamptz IS NULL
       OR (j.created_at, j.id) < (%(before_created_at)s::timestamptz, %(before_id)s::uuid))
ORDER BY j.created_at DESC, j.id DESC
LIMIT %(limit)s;

-- name: job_list_admin
-- Any tenant's jobs for operators (GET /v1/admin/exports), newest first after a keyset
-- cursor, by tenant, state and labels (the tags and metadata pairs a job must all carry),
-- each optional. Read unprepared (exportcore.store.jobs.job_list_admin), so each call is
-- planned for its values: a labels filter through export_jobs_labels_idx, a tenant through
-- export_jobs_tenant_created_idx, nothing through export_jobs_created_idx.
SELECT j.*, {{job_progress}} FROM export_jobs j
WHERE (%(tenant_id)s::text IS NULL OR j.tenant_id = %(tenant_id)s::text)
  AND (%(status)s::text IS NULL OR j.status = %(status)s::text)
  AND (%(labels)s::jsonb IS NULL
       OR (j.payload ? 'labels' AND j.payload -> 'labels' @> %(labels)s::jsonb))
  AND (%(before_created_at)s::timestamptz IS NULL
       OR (j.created_at, j.id) < (%(before_created_at)s::timestamptz, %(before_id)s::uuid))
ORDER BY j.created_at DESC, j.id DESC
LIMIT %(limit)s;

-- ---- The recovery-scanner's transitions and retention (bounded batches locked with FOR
-- UPDATE SKIP LOCKED, so several scanners never act on the same job; each change writes its
-- history event in the same statement).

-- name: job_cancel_if_queued_many
-- queued + cancel requested -> cancelled.
WITH doomed AS (
    SELECT id FROM export_jobs
    WHERE status = 'queued' AND cancel_requested
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
), cancelled AS (
    UPDATE export_jobs j
    SET status = 'cancelled', finished_at = now(), updated_at = now()
    FROM doomed d
    WHERE j.id = d.id AND j.status = 'queued' AND j.cancel_requested
    RETURNING j.id, j.attempts, j.queue, j.created_at, j.finished_at
), history AS (
    INSERT INTO export_job_events (job_id, kind, from_status, to_status, attempt)
    SELECT id, 'cancelled', 'queued', 'cancelled', attempts FROM cancelled
)
SELECT id, queue, extract(epoch FROM finished_at - created_at)::float8 AS age FROM cancelled;

-- name: job_fail_if_queued_exhausted_many
-- queued past the deadline or out of attempts -> failed + dead letter.
WITH doomed AS (
    SELECT id FROM export_jobs
    WHERE status = 'queued' AND (deadline_at <= now() OR attempts >= max_attempts)
    ORDER BY deadline_at
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
), failed AS (
    UPDATE export_jobs j
    SET status = 'failed',
        error_code = CASE WHEN j.deadline_at <= now() THEN 'deadline_exceeded'
                          ELSE 'attempts_exhausted' END,
        error_detail = CASE WHEN j.deadline_at <= now() THEN 'the deadline passed while queued'
                            ELSE 'no attempts left' END,
        finished_at = now(),
        updated_at = now()
    FROM doomed d
    WHERE j.id = d.id AND j.status = 'queued'
      AND (j.deadline_at <= now() OR j.attempts >= j.max_attempts)
    RETURNING j.*
), dead AS (
    INSERT INTO export_dead_letters (job_id, tenant_id, reason, detail, attempts)
    SELECT id, tenant_id, error_code, error_detail, attempts FROM failed
), history AS (
    INSERT INTO export_job_events (job_id, kind, from_status, to_status, attempt, detail)
    SELECT f.id, k.kind, k.from_status, 'failed', f.attempts,
           jsonb_build_object('error_code', f.error_code)
    FROM failed f
    CROSS JOIN (VALUES (1, 'failed', 'queued'), (2, 'dead_lettered', 'failed'))
        AS k (n, kind, from_status)
    ORDER BY k.n
)
SELECT id, error_code, queue, extract(epoch FROM finished_at - created_at)::float8 AS age
FROM failed;

-- name: job_redispatch_if_lost_many
-- queued, due, no pending outbox event, and last dispatched (or created) longer ago than the
-- dispatch threshold -> a new outbox event; attempts unchanged. The threshold doubles with
-- each dispatch of the job (capped by max_factor), so a job that waits behind a long queue
-- is not sent again every threshold. Stamping last_dispatched_at in the same UPDATE makes a
-- concurrent scanner's re-check of the row fail, so one loss gives one new event.
WITH lost AS (
    UPDATE export_jobs j
    SET last_dispatched_at = now(),
        recovery_kind = coalesce(j.recovery_kind, 'lost_dispatch'),
        recovery_started_at = coalesce(j.recovery_started_at, j.last_dispatched_at, j.created_at)
    WHERE j.id IN (
        SELECT c.id FROM export_jobs c
        WHERE c.status = 'queued'
          AND c.next_attempt_at <= now()
          AND NOT c.cancel_requested
          AND c.deadline_at > now()
          AND coalesce(c.last_dispatched_at, c.created_at)
              < now() - make_interval(secs => %(threshold_seconds)s
                    * least(power(2, greatest(c.dispatch_count - 1, 0)), %(max_factor)s))
          AND NOT EXISTS (
              SELECT 1 FROM export_outbox o WHERE o.job_id = c.id AND o.sent_at IS NULL)
        ORDER BY c.next_attempt_at
        LIMIT %(limit)s
        FOR UPDATE SKIP LOCKED)
      AND j.status = 'queued'
      AND coalesce(j.last_dispatched_at, j.created_at)
          < now() - make_interval(secs => %(threshold_seconds)s
                * least(power(2, greatest(j.dispatch_count - 1, 0)), %(max_factor)s))
    RETURNING j.id, j.tenant_id, j.queue, j.trace_context, j.attempts, j.dispatch_count
), outbox AS (
    INSERT INTO export_outbox (id, job_id, tenant_id, queue, reason, trace_context)
    SELECT gen_random_uuid(), id, tenant_id, queue, 'redispatch', trace_context FROM lost
    RETURNING id, job_id
), history AS (
    INSERT INTO export_job_events (job_id, kind, attempt, message_id, detail)
    SELECT l.id, 'redispatched', l.attempts, o.id,
           jsonb_build_object('dispatch_count', l.dispatch_count)
    FROM lost l JOIN outbox o ON o.job_id = l.id
)
SELECT o.job_id, o.id AS message_id, l.tenant_id, l.queue, l.attempts, l.trace_context,
       pg_notify('export_outbox', '')::text AS notified
FROM outbox o JOIN lost l ON l.id = o.job_id;

-- name: job_delete_terminal_before
-- Terminal jobs finished before the retention cutoff (cascades to snapshot, outbox,
-- history and dead letter). Returns their artifacts, to delete after commit.
WITH old AS (
    SELECT id FROM export_jobs
    WHERE status IN ('succeeded', 'failed', 'cancelled')
      AND finished_at < now() - make_interval(secs => %(retention_days)s * 86400)
    ORDER BY finished_at
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
)
DELETE FROM export_jobs j USING old WHERE j.id = old.id
RETURNING j.id, j.result_ref;

-- name: job_artifact_owners
-- What the jobs of some artifact keys look like now (orphan cleanup).
SELECT id, status, result_ref, lease_token FROM export_jobs WHERE id = ANY(%(job_ids)s::uuid[]);
