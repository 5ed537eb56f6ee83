-- Operator console sessions of operator keys (operator_keys): only the SHA-256 of the
-- cookie's token is stored.

-- name: console_session_insert
-- A new session for an operator key (the caller checked the key); ends at `expires_at`.
INSERT INTO console_sessions (token_hash, key_id, csrf_token, expires_at)
VALUES (%(token_hash)s, %(key_id)s, %(csrf_token)s,
        now() + make_interval(secs => %(lifetime_seconds)s))
RETURNING token_hash, key_id, csrf_token, created_at, expires_at;

-- name: console_session_touch
-- The live session with this token hash, its key still active. A session past its end,
-- idle longer than `idle_seconds`, or whose key was revoked matches nothing. It is marked
-- seen only when its last mark is older than `touch_seconds`, so most requests write
-- nothing (and wait for no WAL flush).
WITH live AS (
    SELECT s.token_hash, s.key_id, s.csrf_token, s.created_at, s.expires_at, s.last_seen_at,
           k.prefix, k.label, k.role
    FROM console_sessions s
    JOIN operator_keys k ON k.id = s.key_id AND k.revoked_at IS NULL
    WHERE s.token_hash = %(token_hash)s
      AND s.expires_at > now()
      AND s.last_seen_at > now() - make_interval(secs => %(idle_seconds)s)
), touched AS (
    UPDATE console_sessions c SET last_seen_at = now()
    FROM live
    WHERE c.token_hash = live.token_hash
      AND live.last_seen_at < now() - make_interval(secs => %(touch_seconds)s)
    RETURNING c.token_hash
)
SELECT live.* FROM live;

-- name: console_session_delete
DELETE FROM console_sessions WHERE token_hash = %(token_hash)s RETURNING key_id;

-- name: console_session_prune
-- Ended sessions (past their end or idle too long), a bounded batch at a time.
DELETE FROM console_sessions
WHERE token_hash IN (
    SELECT token_hash FROM console_sessions
    WHERE expires_at <= now() OR last_seen_at <= now() - make_interval(secs => %(idle_seconds)s)
    LIMIT %(limit)s)
RETURNING token_hash;
