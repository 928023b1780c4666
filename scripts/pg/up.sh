#!/usr/bin/env bash
# Start a private PostgreSQL cluster for development and CI (Debian's postgresql package,
# installed if missing), and print the URL the tests use:
#   export TRAINYARD_TEST_PG_URL=postgres://trainyard:...@127.0.0.1:PORT/postgres
# Idempotent: a second run finds the cluster running and prints the URL again.
#
#   eval "$(scripts/pg/up.sh [STATE_DIR])"     (default /tmp/trainyard-pg; port 55432)
#
# Needs root (initdb runs as the postgres user). The package's own cluster is not used:
# without systemd as PID 1 it does not start here.
set -euo pipefail
STATE_DIR=${1:-/tmp/trainyard-pg}
PORT=${TRAINYARD_PG_PORT:-55432}
log() { printf '[pg-up] %s\n' "$*" >&2; }
die() { printf '[pg-up] ERROR: %s\n' "$*" >&2; exit 1; }
[ "$(id -u)" -eq 0 ] || die "must run as root (initdb and the server run as the postgres user)"

bin=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -1 || true)
if [ -z "$bin" ] || [ ! -x "$bin/initdb" ]; then
  log "installing postgresql (apt-get)"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -q >/dev/null 2>&1 || die "apt-get update failed"
  apt-get install -y -q --no-install-recommends postgresql >/dev/null 2>&1 || die "apt-get install postgresql failed"
  bin=$(ls -d /usr/lib/postgresql/*/bin | sort -V | tail -1)
fi

data=$STATE_DIR/data
secret=$STATE_DIR/password
mkdir -p "$STATE_DIR"
chown postgres: "$STATE_DIR"
chmod 0700 "$STATE_DIR"
if [ ! -s "$secret" ]; then
  head -c 18 /dev/urandom | od -An -tx1 | tr -d ' \n' > "$secret"
  chown postgres: "$secret"
  chmod 0600 "$secret"
fi
if [ ! -f "$data/PG_VERSION" ]; then
  log "initdb $data"
  su postgres -s /bin/sh -c "'$bin/initdb' -D '$data' -U trainyard --auth=scram-sha-256 --pwfile='$secret' -E UTF8 --locale=C.UTF-8" >"$STATE_DIR/initdb.log" 2>&1 \
    || { tail -20 "$STATE_DIR/initdb.log" >&2; die "initdb failed"; }
  # A test cluster: no fsync wait on commits would hide a missing durability setting, so
  # the defaults stay; more connections for tests that run side by side.
  printf "max_connections = 300\nlisten_addresses = '127.0.0.1'\nunix_socket_directories = '%s'\n" "$STATE_DIR" >> "$data/postgresql.conf"
fi
if ! su postgres -s /bin/sh -c "'$bin/pg_ctl' -D '$data' status" >/dev/null 2>&1; then
  su postgres -s /bin/sh -c "'$bin/pg_ctl' -D '$data' -o '-p $PORT' -l '$STATE_DIR/server.log' -w -t 60 start" >/dev/null \
    || { tail -20 "$STATE_DIR/server.log" >&2; die "the server did not start (log: $STATE_DIR/server.log)"; }
  log "PostgreSQL $("$bin/postgres" --version | awk '{print $3}') on 127.0.0.1:$PORT (data $data)"
fi
url="postgres://trainyard:$(cat "$secret")@127.0.0.1:$PORT/postgres"
PGPASSWORD=$(cat "$secret") "$bin/psql" -h 127.0.0.1 -p "$PORT" -U trainyard -d postgres -Atqc 'SELECT 1' >/dev/null \
  || die "cannot connect to the cluster as trainyard"
echo "export TRAINYARD_TEST_PG_URL=$url"
# How the tests restart it (the chaos test of several servers on one store).
echo "export TRAINYARD_TEST_PG_RESTART=$(cd "$(dirname "$0")" && pwd)/restart.sh"
