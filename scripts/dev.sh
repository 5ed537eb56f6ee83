#!/usr/bin/env bash
# `make dev`: the whole stack on this machine, on real PostgreSQL and Redis.
#
# Starts throwaway PostgreSQL (DEV_PG_PORT, 55432) and Redis (DEV_REDIS_PORT, 56379) under
# .dev/ (DEV_HOME) unless DATABASE_URL / CELERY_BROKER_URL are set, migrates, creates the
# `demo` tenant and an API key, imports a real folder of notes (NOTES_DIR, default
# /usr/share/doc), runs every Procfile process (devtools/devprocs.py: honcho with a warm
# stop), writes $DEV_HOME/env when every process is ready, prints how to submit, and stops
# everything it started on Ctrl-C or SIGTERM. docs/development.md describes every knob.
#
# One stack per DEV_HOME: a second `make dev` on the same DEV_HOME refuses, naming the first
# ($DEV_HOME/stack.pid). A stack stops only the servers whose pid files are in its DEV_HOME
# (scripts/localstack.sh), never one that merely answers on a port.
#
# Redis admits only the ACL user `exports` with a password kept in $DEV_HOME/keys. DEV_HA=1
# runs PostgreSQL under Patroni (etcd, two members, synchronous replication) and Redis with
# Sentinel instead (python -m devtools.ha, under $DEV_HOME/ha; needs the dev lock), with
# DEV_PGBOUNCER=1 PgBouncer in transaction mode in front of the primary.
#
# Manifests are signed: with MANIFEST_SIGNING_KEY when it is set, else with an Ed25519 key
# generated once into $DEV_HOME/manifest-signing.key (mode 600; `make clean` removes it), so
# `exportctl verify` and `restore --chain` work on a fresh stack (docs/development.md).
#
# Artifacts go to the folder .dev/artifacts by default. ARTIFACT_URL=s3://bucket/prefix (with
# the S3_* settings of docs/configuration.md) points the stack at an S3-compatible store; DEV_S3=1 starts
# a local one (moto in server mode, in memory, port DEV_S3_PORT=59000) with a bucket
# `notes-exports-dev` and uses it.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT="$PWD"
DEV="${DEV_HOME:-$ROOT/.dev}"  # the servers' data, artifacts, metrics and env file
mkdir -p "$DEV"
DEV="$(cd "$DEV" && pwd)"
SHOWN_DEV="${DEV#"$ROOT"/}"  # .dev when inside the checkout, else the absolute path
export METRICS_DIR="${METRICS_DIR:-$DEV/metrics}"
# Every /metrics server (one port per process, API_METRICS_PORT for the api) on loopback only.
export METRICS_BIND_ADDRESS="${METRICS_BIND_ADDRESS:-127.0.0.1}"
export BEAT_SCHEDULE_FILE="${BEAT_SCHEDULE_FILE:-$DEV/celerybeat-schedule}"
# make dev reads its logs in a terminal (through honcho, so not a tty): human-readable lines.
export LOG_FORMAT="${LOG_FORMAT:-text}"

PG_PORT="${DEV_PG_PORT:-55432}"
REDIS_PORT="${DEV_REDIS_PORT:-56379}"
API_PORT="${API_PORT:-8000}"
export PUBLISHER_METRICS_PORT="${PUBLISHER_METRICS_PORT:-9101}"
export SCANNER_METRICS_PORT="${SCANNER_METRICS_PORT:-9102}"
export BEAT_METRICS_PORT="${BEAT_METRICS_PORT:-9103}"
export FAST_WORKER_METRICS_PORT="${FAST_WORKER_METRICS_PORT:-9104}"
export BULK_WORKER_METRICS_PORT="${BULK_WORKER_METRICS_PORT:-9105}"
export API_METRICS_PORT="${API_METRICS_PORT:-9100}"
export WEBHOOK_METRICS_PORT="${WEBHOOK_METRICS_PORT:-9106}"
# Every /metrics port of the stack (the Procfile reads the same variables).
METRICS_PORT_VARS=(API_METRICS_PORT PUBLISHER_METRICS_PORT SCANNER_METRICS_PORT BEAT_METRICS_PORT
                   FAST_WORKER_METRICS_PORT BULK_WORKER_METRICS_PORT WEBHOOK_METRICS_PORT)
NOTES_DIR="${NOTES_DIR:-/usr/share/doc}"
TENANT="${DEV_TENANT:-demo}"
GRACE="${DEV_STOP_GRACE:-30}"

say() { printf '\033[1m[dev]\033[0m %s\n' "$*" >&2; }
listening() { bash scripts/localstack.sh port-listening "$1"; }

# ---- one stack per DEV_HOME ---------------------------------------------------------------
STACK_PID="$DEV/stack.pid"
stack_owner() {
  # "pid api-url" of the live stack that owns DEV_HOME, or nothing.
  local pid rest
  [ -f "$STACK_PID" ] || return 1
  read -r pid rest <"$STACK_PID" || return 1
  [ -n "$pid" ] && [ "$pid" != $$ ] && kill -0 "$pid" 2>/dev/null || return 1
  tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | grep -q 'dev\.sh' || return 1
  echo "$pid $rest"
}
claim_dev_home() {
  local owner
  if owner="$(stack_owner)"; then
    set -- $owner
    say "another make dev already runs with DEV_HOME=$SHOWN_DEV: pid $1, api $2 (started $3)."
    say "stop it (Ctrl-C in its terminal), or run a second stack beside it with its own state and ports:"
    suggest_beside
    exit 1
  fi
  rm -f "$STACK_PID"
  # noclobber: of two scripts starting at once, exactly one creates the file.
  if ! (set -o noclobber; echo "$$ http://127.0.0.1:$API_PORT $(date +%H:%M:%S)" >"$STACK_PID") 2>/dev/null; then
    say "another make dev is starting with DEV_HOME=$SHOWN_DEV; try again in a moment"
    exit 1
  fi
}
suggest_beside() {
  local ports
  ports="$(python - <<'PY'
import socket
socks = [socket.socket() for _ in range(10)]
for s in socks:
    s.bind(("127.0.0.1", 0))
print(" ".join(str(s.getsockname()[1]) for s in socks))
PY
)"
  set -- $ports
  printf '\n    DEV_HOME=%s DEV_PG_PORT=%s DEV_REDIS_PORT=%s API_PORT=%s \\\n' "$DEV-2" "$1" "$2" "$3" >&2
  shift 3
  local var line="     "
  for var in "${METRICS_PORT_VARS[@]}"; do line="$line $var=$1"; shift; done
  printf '%s \\\n      make dev\n\n' "$line" >&2
}
claim_dev_home

# ---- every port this stack will listen on must be free -------------------------------------
check_port() {  # VAR PORT WHAT
  if listening "$2"; then
    say "port $2 ($1, $3) is in use: something already listens there (another stack or program)."
    say "stop it, or move this stack, e.g.: $1=$(python -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])') make dev"
    say "a whole second stack beside the first:"
    suggest_beside
    exit 1
  fi
}
check_port API_PORT "$API_PORT" "the api"
for var in "${METRICS_PORT_VARS[@]}"; do
  check_port "$var" "${!var}" "/metrics"
done

started_pg=0
started_redis=0
started_ha=0
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
  if [ "$started_redis" = 1 ]; then bash scripts/localstack.sh redis-stop "$DEV/redis"; fi
  if [ "$started_pg" = 1 ]; then bash scripts/localstack.sh pg-stop "$DEV/pg"; fi
  if [ "$started_ha" = 1 ]; then python -m devtools.ha stop "$DEV/ha" || true; fi
  rm -f "$DEV/env" "$DEV/env.tmp" "$DEV/procs.pid" "$DEV/moto.pid"
  if [ "$(cut -d' ' -f1 "$STACK_PID" 2>/dev/null)" = $$ ]; then rm -f "$STACK_PID"; fi
  say "stopped"
}
trap cleanup EXIT
# A requested stop is a clean exit. These traps only make the script react at once; a clean
# stop does not depend on them: a shell started with SIGINT ignored (a background job of a
# non-interactive shell: `make dev &` in a script) cannot trap it, and then the supervisor,
# which handles INT itself, stops every process warm and exits 0 (devtools/devprocs.py),
# which ends the `wait` at the bottom and the script, cleanly.
trap 'exit 0' INT
trap 'exit 0' TERM

# The secrets of this DEV_HOME ($DEV/keys, mode 600): the Redis ACL user's password and the
# key that encrypts webhook signing secrets at rest (WEBHOOK_SECRET_KEYS unless set;
# docs/webhooks.md) first (Redis starts before the API keys exist), then the API keys (below).
KEYS="$DEV/keys"
API_KEY="" OPERATOR_KEY="" KEYS_TENANT="" REDIS_PASSWORD="" DEV_WEBHOOK_KEY=""
if [ -f "$KEYS" ]; then . "$KEYS"; fi
if [ -z "$REDIS_PASSWORD" ]; then
  REDIS_PASSWORD="$(python -c 'import secrets; print(secrets.token_urlsafe(18))')"
fi
if [ -z "$DEV_WEBHOOK_KEY" ]; then
  DEV_WEBHOOK_KEY="$(python -c 'from exportcore.webhooks.encryption import new_key; print(new_key())')"
fi
export WEBHOOK_SECRET_KEYS="${WEBHOOK_SECRET_KEYS:-$DEV_WEBHOOK_KEY}"
save_keys() {
  (umask 077; printf 'KEYS_TENANT=%q\nAPI_KEY=%q\nOPERATOR_KEY=%q\nREDIS_PASSWORD=%q\nDEV_WEBHOOK_KEY=%q\n' \
    "$KEYS_TENANT" "$API_KEY" "$OPERATOR_KEY" "$REDIS_PASSWORD" "$DEV_WEBHOOK_KEY" >"$KEYS")
}
save_keys

if [ "${DEV_HA:-0}" = 1 ] && [ -z "${DATABASE_URL:-}" ] && [ -z "${CELERY_BROKER_URL:-}" ]; then
  pooler=()
  if [ "${DEV_PGBOUNCER:-0}" = 1 ]; then pooler=(--pooler); fi
  say "starting PostgreSQL under Patroni (etcd, two members, synchronous replication)${pooler:+, PgBouncer in front of the primary,} and Redis with Sentinel under $SHOWN_DEV/ha"
  started_ha=1
  ha_env="$(python -m devtools.ha start "$DEV/ha" "${pooler[@]}")" || { say "the HA topology did not start (logs under $SHOWN_DEV/ha)"; exit 1; }
  eval "$ha_env"
  say "primary and replicas: python -m devtools.ha status $SHOWN_DEV/ha (switchover, kill-primary, kill-redis-master: try a failover)"
fi

# A server of this DEV_HOME still running (its stack was killed) is adopted and stopped at
# the end like one this run started: nobody else owns this DEV_HOME (stack.pid).
if [ -z "${DATABASE_URL:-}" ]; then
  say "starting PostgreSQL on 127.0.0.1:$PG_PORT (DEV_PG_PORT; data in $SHOWN_DEV/pg)"
  started_pg=1
  bash scripts/localstack.sh pg-start "$DEV/pg" "$PG_PORT" || { started_pg=0; say "set DEV_PG_PORT to a free port"; exit 1; }
  python - "$PG_PORT" <<'EOF'
import sys, psycopg
with psycopg.connect(f"postgresql://postgres@127.0.0.1:{sys.argv[1]}/postgres", autocommit=True) as c:
    if not c.execute("SELECT 1 FROM pg_database WHERE datname = 'exports'").fetchone():
        c.execute("CREATE DATABASE exports")
EOF
  export DATABASE_URL="postgresql://postgres@127.0.0.1:$PG_PORT/exports"
fi
if [ -z "${CELERY_BROKER_URL:-}" ]; then
  say "starting Redis on 127.0.0.1:$REDIS_PORT (DEV_REDIS_PORT)"
  started_redis=1
  REDIS_USER=exports REDIS_PASSWORD="$REDIS_PASSWORD" \
    bash scripts/localstack.sh redis-start "$DEV/redis" "$REDIS_PORT" || { started_redis=0; say "set DEV_REDIS_PORT to a free port"; exit 1; }
  export CELERY_BROKER_URL="redis://exports:$REDIS_PASSWORD@127.0.0.1:$REDIS_PORT/0"
fi
export ARTIFACT_DIR="${ARTIFACT_DIR:-$DEV/artifacts}"
if [ "${DEV_S3:-0}" = 1 ] && [ -z "${ARTIFACT_URL:-}" ]; then
  S3_PORT="${DEV_S3_PORT:-59000}"
  say "starting an S3-compatible server (moto, in memory) on 127.0.0.1:$S3_PORT"
  moto_server -H 127.0.0.1 -p "$S3_PORT" >"$DEV/moto.log" 2>&1 &
  s3_pid=$!
  echo "$s3_pid" >"$DEV/moto.pid"
  for _ in $(seq 1 100); do
    if curl -fsS "http://127.0.0.1:$S3_PORT/" >/dev/null 2>&1; then break; fi
    if ! kill -0 "$s3_pid" 2>/dev/null; then say "moto_server failed (see $SHOWN_DEV/moto.log)"; exit 1; fi
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
# Failpoints (exportcore.faults) are on in the dev stack: writing this file arms one, e.g. to
# fail the next export and try dead letters and replay (docs/development.md, "Make an export
# fail"). Emptied at start, so nothing armed by an earlier run fires; a file you name is kept.
if [ -z "${EXPORTS_FAULTS_FILE:-}" ]; then
  export EXPORTS_FAULTS_FILE="$DEV/faults.json"
  : >"$EXPORTS_FAULTS_FILE"
fi
# Local webhook receivers listen on plain http on this machine: allow both (docs/webhooks.md).
export WEBHOOK_ALLOW_HTTP="${WEBHOOK_ALLOW_HTTP:-true}"
export WEBHOOK_ALLOW_PRIVATE_NETWORKS="${WEBHOOK_ALLOW_PRIVATE_NETWORKS:-true}"

# ---- the manifest signing key ---------------------------------------------------------------
if [ -z "${MANIFEST_SIGNING_KEY:-}" ]; then
  SIGNING_KEY_FILE="$DEV/manifest-signing.key"
  if [ ! -s "$SIGNING_KEY_FILE" ]; then
    (umask 077; exportctl manifest-key new >"$SIGNING_KEY_FILE.tmp" 2>/dev/null) \
      && mv -f "$SIGNING_KEY_FILE.tmp" "$SIGNING_KEY_FILE" \
      || { say "could not generate a manifest signing key"; exit 1; }
    say "generated the manifest signing key $SHOWN_DEV/manifest-signing.key (MANIFEST_SIGNING_KEY overrides it)"
  fi
  MANIFEST_SIGNING_KEY="$(cat "$SIGNING_KEY_FILE")"
  export MANIFEST_SIGNING_KEY
fi

say "migrating"
exportctl migrate >/dev/null
exportctl tenant create "$TENANT" >/dev/null
# The dev keys live beside the dev database ($DEV/keys, mode 600): a restart reuses them
# instead of minting new ones; `make clean` removes both together.
if [ -z "$API_KEY" ] || [ -z "$OPERATOR_KEY" ] || [ "$KEYS_TENANT" != "$TENANT" ]; then
  API_KEY="$(exportctl apikey create "$TENANT" --quiet --label "make dev")"
  OPERATOR_KEY="$(exportctl operator-key create --label "make dev" --quiet)"
  KEYS_TENANT="$TENANT"
  save_keys
fi
say "importing notes from $NOTES_DIR"
exportctl notes import "$NOTES_DIR" --tenant "$TENANT" --show-skipped 5

say "starting processes from the Procfile (a stop gives each $GRACE s: DEV_STOP_GRACE)"
RUN_DIR="$DEV/run"
python -m devtools.devprocs --grace "$GRACE" --run-dir "$RUN_DIR" &
honcho_pid=$!
echo "$honcho_pid" >"$DEV/procs.pid"  # for `make clean` after a killed run

ready() {
  curl -fsS "http://127.0.0.1:$API_PORT/readyz" >/dev/null 2>&1 || return 1
  # the workers consume (their heartbeat advances only then); the loops serve /metrics
  [ -f "$RUN_DIR/fast-worker.heartbeat" ] && [ -f "$RUN_DIR/bulk-worker.heartbeat" ] || return 1
  local port
  for port in "$PUBLISHER_METRICS_PORT" "$SCANNER_METRICS_PORT" "$BEAT_METRICS_PORT"; do
    curl -fsS -o /dev/null "http://127.0.0.1:$port/metrics" 2>/dev/null || return 1
  done
}
deadline=$((SECONDS + ${DEV_READY_TIMEOUT:-180}))
until ready; do
  if ! kill -0 "$honcho_pid" 2>/dev/null; then say "a process failed to start (its lines are above)"; exit 1; fi
  if [ "$SECONDS" -ge "$deadline" ]; then say "the stack did not become ready in ${DEV_READY_TIMEOUT:-180} s"; exit 1; fi
  sleep 0.2
done

# Written beside and renamed into place: whoever waits for $DEV/env (a script, the tests)
# reads it whole, never a file created but not yet filled.
umask 077
cat >"$DEV/env.tmp" <<EOF
export API_URL=http://127.0.0.1:$API_PORT
export API_KEY=$API_KEY
export OPERATOR_KEY=$OPERATOR_KEY
export ARTIFACT_DIR=$ARTIFACT_DIR
EOF
# quoted: a multi-host URL holds '&', a Sentinel broker URL ';'
for var in DATABASE_URL CELERY_BROKER_URL ARTIFACT_URL S3_ENDPOINT_URL S3_REGION S3_ADDRESSING_STYLE S3_ACCESS_KEY_ID \
           S3_SECRET_ACCESS_KEY DOWNLOAD_MODE DATABASE_POOLER DATABASE_DIRECT_URL \
           BROKER_SENTINEL_MASTER BROKER_SENTINEL_PASSWORD WEBHOOK_SECRET_KEYS; do
  if [ -n "${!var:-}" ]; then printf 'export %s=%q\n' "$var" "${!var}" >>"$DEV/env.tmp"; fi
done
printf 'export EXPORTS_FAULTS_FILE=%q\n' "$EXPORTS_FAULTS_FILE" >>"$DEV/env.tmp"
mv -f "$DEV/env.tmp" "$DEV/env"

# Last, after every process said it is ready, so it is not buried in their start-up lines.
cat >&2 <<EOF

  notes-exports is running (tenant '$TENANT', api http://127.0.0.1:$API_PORT, docs /docs).
  In another shell:

    source $SHOWN_DEV/env
    ID=\$(.venv/bin/exportctl submit --all --format json)   # prints only the job id
    .venv/bin/exportctl watch \$ID       # live progress until it finishes
    .venv/bin/exportctl download \$ID    # saves export-<id>.json and checks its sha256

  or with curl:

    curl -s -X POST \$API_URL/v1/exports -H "Authorization: Bearer \$API_KEY" \\
         -H 'Content-Type: application/json' -d '{"all": true, "format": "json"}'

  The operator console: http://127.0.0.1:$API_PORT/console/ (sign in with \$OPERATOR_KEY).
  To make the next export fail (dead letters, replay): docs/development.md, "Make an export fail".

  Ctrl-C stops everything (running exports finish first, up to $GRACE s).

EOF
# 0 after a clean stop (requested, every process exited 0 in time); else the status of the
# process that ended first or of a stop that had to kill something: set -e passes it on.
wait "$honcho_pid"
