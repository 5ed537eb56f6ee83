-- The read-only role of KEDA's postgresql trigger (keda.postgresql.url): it can log in and
-- read the three columns the backlog query reads, nothing else (no payload, no tenant, no
-- note). Run it once as the database owner, with your own password:
--   psql "$DATABASE_URL" -v password=... -f files/keda/reader-role.sql
CREATE ROLE notes_exports_keda LOGIN PASSWORD :'password';
GRANT SELECT (queue, status, next_attempt_at) ON export_jobs TO notes_exports_keda;
ALTER ROLE notes_exports_keda SET default_transaction_read_only = on;
ALTER ROLE notes_exports_keda SET statement_timeout = '5s';
