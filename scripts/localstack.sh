#!/usr/bin/env bash
# Throwaway PostgreSQL and Redis servers for `make dev` and the tests, plus OS packages.
#
#   scripts/localstack.sh os-packages              install postgresql + redis-server (+ extras) if absent
#   scripts/localstack.sh pg-start DIR PORT        initdb (first time) and start PostgreSQL on 127.0.0.1:PORT
#   scripts/localstack.sh pg-stop DIR
#   scripts/localstack.sh redis-start DIR PORT     start Redis (no persistence) on 127.0.0.1:PORT
#   scripts/localstack.sh redis-stop DIR PORT
#
# PostgreSQL refuses to run as root: as root, the server runs as the `postgres` user and the
# data directory belongs to it (every parent directory must be traversable, see
# ../shared/MACHINE-NOTES.md).
set -euo pipefail

PG_VERSION="${PG_VERSION:-15}"

pg_bin() {
  local dir
  for dir in "/usr/lib/postgresql/${PG_VERSION}/bin" /usr/lib/postgresql/*/bin; do
    if [ -x "$dir/pg_ctl" ]; then echo "$dir"; return 0; fi
  done
  command -v pg_ctl >/dev/null 2>&1 && dirname "$(command -v pg_ctl)" && return 0
  echo "PostgreSQL server binaries not found (install the postgresql package)" >&2
  return 1
}

as_pg() {
  if [ "$(id -u)" = 0 ]; then runuser -u postgres -- "$@"; else "$@"; fi
}

apt_install() {
  local SUDO=""
  [ "$(id -u)" = 0 ] || SUDO="sudo"
  export DEBIAN_FRONTEND=noninteractive
  # Another apt/dpkg run (unattended upgrades, a second checkout installing its packages) holds
  # the dpkg lock for a while: wait for it instead of failing at once.
  local lock=(-o DPkg::Lock::Timeout=600)
  if ! $SUDO apt-get "${lock[@]}" install -y -q --no-install-recommends "$@" >/dev/null; then
    $SUDO apt-get "${lock[@]}" update -q >/dev/null
    $SUDO apt-get "${lock[@]}" install -y -q --no-install-recommends "$@" >/dev/null
  fi
}

os_packages() {
  local missing=()
  pg_bin >/dev/null 2>&1 || missing+=(postgresql)
  command -v redis-server >/dev/null 2>&1 || missing+=(redis-server)
  command -v psql >/dev/null 2>&1 || missing+=(postgresql-client)
  for extra in "$@"; do
    case "$extra" in
      prometheus) command -v promtool >/dev/null 2>&1 || missing+=(prometheus) ;;
      *) dpkg -s "$extra" >/dev/null 2>&1 || missing+=("$extra") ;;
    esac
  done
  if [ "${#missing[@]}" -gt 0 ]; then
    echo "installing OS packages: ${missing[*]}" >&2
    apt_install "${missing[@]}"
  fi
}

make_traversable() {
  # postgres must be able to reach DIR through every parent when we run as root.
  local d
  d="$(cd "$1" && pwd)"
  while [ "$d" != "/" ]; do
    chmod o+x "$d" 2>/dev/null || true
    d="$(dirname "$d")"
  done
}

pg_start() {
  local dir="$1" port="$2" bin
  bin="$(pg_bin)"
  mkdir -p "$dir"
  dir="$(cd "$dir" && pwd)"
  if [ "$(id -u)" = 0 ]; then
    chown postgres:postgres "$dir"
    make_traversable "$dir"
  fi
  if [ ! -f "$dir/data/PG_VERSION" ]; then
    as_pg "$bin/initdb" -D "$dir/data" -U postgres -A trust -E UTF8 --locale=C.UTF-8 >"$dir/initdb.log" 2>&1 \
      || as_pg "$bin/initdb" -D "$dir/data" -U postgres -A trust -E UTF8 >"$dir/initdb.log" 2>&1
  fi
  if as_pg "$bin/pg_ctl" -D "$dir/data" status >/dev/null 2>&1; then
    return 0
  fi
  as_pg "$bin/pg_ctl" -D "$dir/data" -l "$dir/pg.log" -w -t 30 \
    -o "-p $port -k $dir -c listen_addresses=127.0.0.1 -c max_connections=300 -c shared_buffers=128MB -c fsync=on" start >/dev/null
}

pg_stop() {
  local dir="$1" bin
  bin="$(pg_bin)"
  [ -f "$dir/data/PG_VERSION" ] || return 0
  as_pg "$bin/pg_ctl" -D "$dir/data" -m fast -w stop >/dev/null 2>&1 || true
}

redis_start() {
  local dir="$1" port="$2"
  mkdir -p "$dir"
  dir="$(cd "$dir" && pwd)"
  if redis-cli -h 127.0.0.1 -p "$port" ping >/dev/null 2>&1; then return 0; fi
  redis-server --port "$port" --bind 127.0.0.1 --dir "$dir" --save '' --appendonly no \
    --daemonize yes --pidfile "$dir/redis.pid" --logfile "$dir/redis.log"
  for _ in $(seq 1 50); do
    redis-cli -h 127.0.0.1 -p "$port" ping >/dev/null 2>&1 && return 0
    sleep 0.1
  done
  echo "redis did not start on port $port (see $dir/redis.log)" >&2
  return 1
}

redis_stop() {
  local dir="$1" port="$2"
  redis-cli -h 127.0.0.1 -p "$port" shutdown nosave >/dev/null 2>&1 || true
}

cmd="${1:-}"
shift || true
case "$cmd" in
  os-packages) os_packages "$@" ;;
  pg-start) pg_start "$@" ;;
  pg-stop) pg_stop "$@" ;;
  redis-start) redis_start "$@" ;;
  redis-stop) redis_stop "$@" ;;
  *) sed -n '2,12p' "$0"; exit 2 ;;
esac
