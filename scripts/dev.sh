#!/usr/bin/env bash
# `make dev`: the whole stack on this machine, on real PostgreSQL and Redis.
#
# Starts throwaway PostgreSQL (port 55432) and Redis (port 56379) under .dev/ (DEV_HOME) unless
# DATABASE_URL / CELERY_BROKER_URL are set, migrates, creates the `demo` tenant and an API
# key, imports a real folder of notes (NOTES_DIR, default /usr/share/doc), runs every Procfile
# process under honcho, writes .dev/env when the api is ready, and stops everything it
# started on Ctrl-C or SIGTERM.
#
# Artifacts go to the folder .dev/artifacts by default. ARTIFACT_URL=s3://bucket/prefix (with
# the S3_* settings of README.md) points the stack at an S3-compatible store; DEV_S3=1 starts
# a local one (moto in server mode, in memory, port DEV_S3_PORT=59000) with a bucket
# `notes-exports-dev` and uses it.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT="$PWD"
DEV="${DEV_HOME:-$ROOT/.dev}"  # the servers' data, artifacts, metrics and env file
mkdir -p "$DEV"
DEV="$(cd "$DEV" && pwd)"
export METRICS_DIR="${METRICS_DIR:-$DEV/metrics}"
# Every /metrics server (one port per process, API_METRICS_PORT for the api) on loopback only.
export METRICS_BIND_ADDRESS="${METRICS_BIND_ADDRESS:-127.0.0.1}"
export BEAT_SCHEDULE_FILE="${BEAT_SCHEDULE_FILE:-$DEV/celerybeat-schedule}"

PG_PORT="${DEV_PG_PORT:-55432}"
REDIS_PORT="${DEV_REDIS_PORT:-56379}"
API_PORT="${API_PORT:-8000}"
NOTES_DIR="${NOTES_DIR:-/usr/share/doc}"
TENANT="${DEV_TENANT:-demo}"

say() { printf '\033[1m[dev]\033[0m %s\n' "$*" >&2; }

if python - "$API_PORT" <<'EOF'
import socket, sys
s = socket.socket()
try:
    s.bind(("127.0.0.1", int(sys.argv[1])))
except OSError:
    sys.exit(0)
sys.exit(1)
EOF
then
  say "port $API_PORT is in use; stop what runs there or run: API_PORT=8010 make dev"
  exit 1
fi

started_pg=0
started_redis=0
honcho_pid=""
s3_pid=""

cleanup() {
  trap - EXIT
  # Ignore further stop signals while cleaning up: `make` forwards its TERM to this script
  # right after the process group's own, and a second TERM must not cut the cleanup short
  # (that left PostgreSQL and Redis running).
  trap '' INT TERM
  if [ -n "$honcho_pid" ] && kill -0 "$honcho_pid" 2>/dev/null; then
    say "stopping processes"
    kill -TERM "$honcho_pid" 2>/dev/null || true
    wait "$honcho_pid" 2>/dev/null || true
  fi
  if [ -n "$s3_pid" ] && kill -0 "$s3_pid" 2>/dev/null; then
    kill -TERM "$s3_pid" 2>/dev/null || true
    wait "$s3_pid" 2>/dev/null || true
  fi
  if [ "$started_redis" = 1 ]; then bash scripts/localstack.sh redis-stop "$DEV/redis" "$REDIS_PORT"; fi
  if [ "$started_pg" = 1 ]; then bash scripts/localstack.sh pg-stop "$DEV/pg"; fi
  rm -f "$DEV/env"
  say "stopped"
}
trap cleanup EXIT
trap 'exit 0' INT  # a requested stop is a clean exit
trap 'exit 0' TERM

if [ -z "${DATABASE_URL:-}" ]; then
  say "starting PostgreSQL on 127.0.0.1:$PG_PORT (data in .dev/pg)"
  bash scripts/localstack.sh pg-start "$DEV/pg" "$PG_PORT"
  started_pg=1
  python - "$PG_PORT" <<'EOF'
import sys, psycopg
with psycopg.connect(f"postgresql://postgres@127.0.0.1:{sys.argv[1]}/postgres", autocommit=True) as c:
    if not c.execute("SELECT 1 FROM pg_database WHERE datname = 'exports'").fetchone():
        c.execute("CREATE DATABASE exports")
EOF
  export DATABASE_URL="postgresql://postgres@127.0.0.1:$PG_PORT/exports"
fi
if [ -z "${CELERY_BROKER_URL:-}" ]; then
  say "starting Redis on 127.0.0.1:$REDIS_PORT"
  bash scripts/localstack.sh redis-start "$DEV/redis" "$REDIS_PORT"
  started_redis=1
  export CELERY_BROKER_URL="redis://127.0.0.1:$REDIS_PORT/0"
fi
export ARTIFACT_DIR="${ARTIFACT_DIR:-$DEV/artifacts}"
if [ "${DEV_S3:-0}" = 1 ] && [ -z "${ARTIFACT_URL:-}" ]; then
  S3_PORT="${DEV_S3_PORT:-59000}"
  say "starting an S3-compatible server (moto, in memory) on 127.0.0.1:$S3_PORT"
  moto_server -H 127.0.0.1 -p "$S3_PORT" >"$DEV/moto.log" 2>&1 &
  s3_pid=$!
  for _ in $(seq 1 100); do
    if curl -fsS "http://127.0.0.1:$S3_PORT/" >/dev/null 2>&1; then break; fi
    if ! kill -0 "$s3_pid" 2>/dev/null; then say "moto_server failed (see .dev/moto.log)"; exit 1; fi
    sleep 0.1
  done
  export S3_ENDPOINT_URL="http://127.0.0.1:$S3_PORT" S3_REGION=us-east-1 S3_ADDRESSING_STYLE=path
  export S3_ACCESS_KEY_ID=dev S3_SECRET_ACCESS_KEY=dev  # moto accepts any credentials
  python -m devtools.s3 create-bucket "$S3_ENDPOINT_URL" notes-exports-dev
  export ARTIFACT_URL="s3://notes-exports-dev/artifacts"
fi
say "artifacts: ${ARTIFACT_URL:-file://$ARTIFACT_DIR} (downloads: ${DOWNLOAD_MODE:-stream})"
export API_BIND="127.0.0.1:$API_PORT"
export PYTHONUNBUFFERED=1

say "migrating"
exportctl migrate >/dev/null
exportctl tenant create "$TENANT" >/dev/null
API_KEY="$(exportctl apikey create "$TENANT" --quiet --label "make dev")"
say "importing notes from $NOTES_DIR"
exportctl notes import "$NOTES_DIR" --tenant "$TENANT" --show-skipped 5

say "starting processes from the Procfile"
honcho -f Procfile start &
honcho_pid=$!

for _ in $(seq 1 150); do
  if curl -fsS "http://127.0.0.1:$API_PORT/readyz" >/dev/null 2>&1; then break; fi
  if ! kill -0 "$honcho_pid" 2>/dev/null; then say "a process failed to start"; exit 1; fi
  sleep 0.2
done
curl -fsS "http://127.0.0.1:$API_PORT/readyz" >/dev/null || { say "api did not become ready"; exit 1; }

umask 077
cat >"$DEV/env" <<EOF
export API_URL=http://127.0.0.1:$API_PORT
export API_KEY=$API_KEY
export DATABASE_URL=$DATABASE_URL
export CELERY_BROKER_URL=$CELERY_BROKER_URL
export ARTIFACT_DIR=$ARTIFACT_DIR
EOF
for var in ARTIFACT_URL S3_ENDPOINT_URL S3_REGION S3_ADDRESSING_STYLE S3_ACCESS_KEY_ID \
           S3_SECRET_ACCESS_KEY DOWNLOAD_MODE; do
  if [ -n "${!var:-}" ]; then printf 'export %s=%q\n' "$var" "${!var}" >>"$DEV/env"; fi
done

cat >&2 <<EOF

  notes-exports is running (tenant '$TENANT'). In another shell:

    source .dev/env
    curl -s -X POST \$API_URL/v1/exports -H "Authorization: Bearer \$API_KEY" \\
         -H 'Content-Type: application/json' -d '{"all": true, "format": "json"}'
    .venv/bin/exportctl watch <id>      # live status until it finishes
    .venv/bin/exportctl download <id>   # saves the file and checks its sha256

  Ctrl-C stops everything.

EOF
wait "$honcho_pid"
