#!/usr/bin/env bash
# Throwaway PostgreSQL and Redis servers for `make dev` and the tests, plus OS packages.
#
#   scripts/localstack.sh os-packages              install postgresql, redis-server, etcd, pgbouncer,
#                                                  redis-sentinel (+ extras) if absent
#   scripts/localstack.sh pg-start DIR PORT        initdb (first time) and start PostgreSQL on 127.0.0.1:PORT
#   scripts/localstack.sh pg-stop DIR
#   scripts/localstack.sh redis-start DIR PORT     start Redis (no persistence) on 127.0.0.1:PORT; with
#                                                  REDIS_PASSWORD, only the ACL user REDIS_USER (exports)
#   scripts/localstack.sh redis-stop DIR [PORT]
#   scripts/localstack.sh port-listening PORT      exit 0 when something accepts connections there
#   scripts/localstack.sh stop-home DIR            stop what a `make dev` / test run left under DIR:
#                                                  its live stack (stack.pid), then DIR's servers
#
# A server belongs to its DIR: pg-stop / redis-stop stop only the server whose pid file is in
# DIR (postmaster.pid, redis.pid), whatever port it listens on, and never a server that merely
# answers on the port. pg-start / redis-start adopt DIR's own running server, and refuse
# (exit 3, with a message) when another process already listens on PORT.
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
  # The high-availability topology of the drills and `make dev DEV_HA=1` (docs/drills.md):
  # etcd for Patroni (PyPI, the dev lock), PgBouncer, Redis Sentinel.
  command -v etcd >/dev/null 2>&1 || missing+=(etcd-server)
  command -v etcdctl >/dev/null 2>&1 || missing+=(etcd-client)
  command -v pgbouncer >/dev/null 2>&1 || missing+=(pgbouncer)
  command -v redis-sentinel >/dev/null 2>&1 || missing+=(redis-sentinel)
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

port_listening() {
  # A connect probe: true only while a listener accepts on 127.0.0.1:PORT. (Binding would
  # also fail for a port with connections in TIME_WAIT that nothing listens on any more.)
  (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null
}

port_taken() {
  echo "port $1 is in use by a process that is not $2's $3 (another stack or program listens there); choose another port" >&2
  return 3
}

pg_owned_port() {
  # The port of DIR's running PostgreSQL (line 4 of postmaster.pid), or nothing.
  local dir="$1" pid
  [ -f "$dir/data/postmaster.pid" ] || return 1
  pid="$(head -n1 "$dir/data/postmaster.pid")"
  kill -0 "$pid" 2>/dev/null || return 1
  sed -n 4p "$dir/data/postmaster.pid"
}

redis_owned_pid() {
  # The pid of DIR's running Redis (redis.pid of a live redis-server), or nothing.
  local dir="$1" pid
  [ -f "$dir/redis.pid" ] || return 1
  pid="$(tr -dc 0-9 <"$dir/redis.pid")"
  [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null || return 1
  grep -q redis-server "/proc/$pid/cmdline" 2>/dev/null || return 1
  echo "$pid"
}

pg_start() {
  local dir="$1" port="$2" bin running
  bin="$(pg_bin)"
  mkdir -p "$dir"
  dir="$(cd "$dir" && pwd)"
  if [ "$(id -u)" = 0 ]; then
    chown postgres:postgres "$dir"
    make_traversable "$dir"
  fi
  if ! pg_owned_port "$dir" >/dev/null && port_listening "$port"; then
    port_taken "$port" "$dir" PostgreSQL; return
  fi
  if [ ! -f "$dir/data/PG_VERSION" ]; then
    as_pg "$bin/initdb" -D "$dir/data" -U postgres -A trust -E UTF8 --locale=C.UTF-8 >"$dir/initdb.log" 2>&1 \
      || as_pg "$bin/initdb" -D "$dir/data" -U postgres -A trust -E UTF8 >"$dir/initdb.log" 2>&1
  fi
  if as_pg "$bin/pg_ctl" -D "$dir/data" status >/dev/null 2>&1; then
    running="$(pg_owned_port "$dir" || true)"
    if [ -n "$running" ] && [ "$running" != "$port" ]; then
      echo "the PostgreSQL of $dir already runs on port $running, not $port: stop it first (pg-stop $dir)" >&2
      return 3
    fi
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
  if redis_owned_pid "$dir" >/dev/null; then
    if [ "$(cat "$dir/redis.port" 2>/dev/null)" != "$port" ]; then
      echo "the Redis of $dir already runs on port $(cat "$dir/redis.port" 2>/dev/null || echo '?'), not $port: stop it first (redis-stop $dir)" >&2
      return 3
    fi
    return 0
  fi
  if port_listening "$port"; then port_taken "$port" "$dir" Redis; return; fi
  echo "$port" >"$dir/redis.port"
  local acl=() cli=(redis-cli -h 127.0.0.1 -p "$port")
  if [ -n "${REDIS_PASSWORD:-}" ]; then
    # An ACL user (REDIS_USER, default exports) with REDIS_PASSWORD, stored as its SHA-256;
    # the default user off: every client authenticates (docs/development.md).
    local user="${REDIS_USER:-exports}" hash
    hash="$(printf '%s' "$REDIS_PASSWORD" | sha256sum | cut -d' ' -f1)"
    (umask 077; printf 'user default off\nuser %s on #%s ~* &* +@all -@admin\n' "$user" "$hash" >"$dir/users.acl")
    acl=(--aclfile "$dir/users.acl")
    cli+=(--user "$user" --no-auth-warning)
    export REDISCLI_AUTH="$REDIS_PASSWORD"
  else
    rm -f "$dir/users.acl"
  fi
  # noeviction (also the default): a full broker refuses writes, never drops queued messages
  redis-server --port "$port" --bind 127.0.0.1 --dir "$dir" --save '' --appendonly no --maxmemory-policy noeviction \
    "${acl[@]}" --daemonize yes --pidfile "$dir/redis.pid" --logfile "$dir/redis.log"
  for _ in $(seq 1 50); do
    [ "$("${cli[@]}" ping 2>/dev/null)" = PONG ] && return 0
    sleep 0.1
  done
  echo "redis did not start on port $port (see $dir/redis.log)" >&2
  return 1
}

redis_stop() {
  # TERM to DIR's own Redis (no save points, so it exits without saving), and wait for it.
  local dir="$1" pid
  pid="$(redis_owned_pid "$dir")" || return 0
  kill -TERM "$pid" 2>/dev/null || return 0
  for _ in $(seq 1 100); do
    kill -0 "$pid" 2>/dev/null || return 0
    sleep 0.1
  done
  kill -KILL "$pid" 2>/dev/null || true  # stopped (SIGSTOP) or hung: it had 10 s
}

pid_of() {
  # The pid in FILE when that process is alive and its command line contains PATTERN.
  local file="$1" pattern="$2" pid
  [ -f "$file" ] || return 1
  pid="$(cut -d' ' -f1 "$file" | tr -dc 0-9)"
  [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null || return 1
  tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | grep -q -- "$pattern" || return 1
  echo "$pid"
}

wait_gone() {
  local pid="$1" tenths="$2"
  for _ in $(seq 1 "$tenths"); do
    kill -0 "$pid" 2>/dev/null || return 0
    sleep 0.1
  done
  return 1
}

stop_home() {
  # Everything under DIR, found by its pid files (never by port): the dev script that owns
  # DIR stops what it started itself (warm stop, then its servers); processes and servers
  # of a stack that was killed are stopped here one by one.
  local dir="$1" pid
  [ -d "$dir" ] || return 0
  if pid="$(pid_of "$dir/stack.pid" 'dev\.sh')"; then
    echo "stopping the make dev stack of $dir (pid $pid)" >&2
    kill -TERM "$pid"
    wait_gone "$pid" 900 || true
  fi
  if pid="$(pid_of "$dir/procs.pid" devtools.devprocs)"; then
    kill -TERM "$pid"; wait_gone "$pid" 600 || kill -KILL "$pid" 2>/dev/null || true
  fi
  if pid="$(pid_of "$dir/moto.pid" moto_server)"; then
    kill -TERM "$pid"; wait_gone "$pid" 50 || kill -KILL "$pid" 2>/dev/null || true
  fi
  redis_stop "$dir/redis"
  pg_stop "$dir/pg"
  ha_stop "$dir/ha"
}

ha_stop() {
  # The DEV_HA=1 topology (devtools/ha) by its pid files: Sentinels and Redis first, then
  # PgBouncer, the Patroni members (each stops its PostgreSQL), etcd.
  local dir="$1" file pid
  [ -d "$dir" ] || return 0
  for file in "$dir"/redis/s*.pid "$dir"/redis/r*.pid "$dir"/pg/pgbouncer/*.pid \
              "$dir"/pg/pg*/patroni.pid "$dir"/pg/etcd/etcd.pid; do
    [ -f "$file" ] || continue
    pid="$(pid_of "$file" 'redis\|pgbouncer\|patroni\|etcd')" || continue
    kill -CONT "$pid" 2>/dev/null || true
    kill -TERM "$pid" 2>/dev/null || continue
    wait_gone "$pid" 600 || kill -KILL "$pid" 2>/dev/null || true
  done
  local data
  for data in "$dir"/pg/pg*/data; do
    [ -f "$data/postmaster.pid" ] && as_pg "$(pg_bin)/pg_ctl" -D "$data" -m fast -w stop >/dev/null 2>&1 || true
  done
}

cmd="${1:-}"
shift || true
case "$cmd" in
  os-packages) os_packages "$@" ;;
  pg-start) pg_start "$@" ;;
  pg-stop) pg_stop "$@" ;;
  redis-start) redis_start "$@" ;;
  redis-stop) redis_stop "$@" ;;
  port-listening) port_listening "$@" ;;
  stop-home) stop_home "$@" ;;
  *) sed -n '2,23p' "$0"; exit 2 ;;
esac
