#!/usr/bin/env bash
# Stop the cluster scripts/pg/up.sh started (its data stay in STATE_DIR). Idempotent.
#
#   scripts/pg/down.sh [STATE_DIR]     (default /tmp/trainyard-pg)
set -uo pipefail
STATE_DIR=${1:-/tmp/trainyard-pg}
bin=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -1)
[ -n "$bin" ] && [ -f "$STATE_DIR/data/PG_VERSION" ] || exit 0
su postgres -s /bin/sh -c "'$bin/pg_ctl' -D '$STATE_DIR/data' -m fast -w stop" >/dev/null 2>&1 || true
