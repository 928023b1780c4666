#!/usr/bin/env bash
# Restart the cluster scripts/pg/up.sh started (fast shutdown: every session is cut), for
# the tests that check servers go on through a restart of their store.
#
#   scripts/pg/restart.sh [STATE_DIR]     (default /tmp/trainyard-pg)
set -euo pipefail
STATE_DIR=${1:-/tmp/trainyard-pg}
bin=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -1)
[ -n "$bin" ] && [ -f "$STATE_DIR/data/PG_VERSION" ] || { echo "[pg-restart] no cluster in $STATE_DIR" >&2; exit 1; }
su postgres -s /bin/sh -c "'$bin/pg_ctl' -D '$STATE_DIR/data' -l '$STATE_DIR/server.log' -m fast -w -t 60 restart" >/dev/null
