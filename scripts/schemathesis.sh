#!/usr/bin/env bash
# Property-based API tests: schemathesis generates requests from /openapi.json and checks
# every response against the document (no 5xx, status codes, content types, headers and
# bodies as documented, invalid input refused). `positive_data_acceptance` is left out:
# the document cannot express rules such as the filter grammar or a non-empty
# displayName, which the server rightly refuses with 400.
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
bin="${TRAINYARD_BIN:-$repo/target/debug/trainyard}"
venv="${TRAINYARD_SCHEMATHESIS_VENV:-$repo/.venv-schemathesis}"
req="$repo/scripts/schemathesis-requirements.txt"
if [ ! -x "$venv/bin/python" ]; then python3 -m venv "$venv"; fi
if ! cmp -s "$req" "$venv/.requirements"; then
  "$venv/bin/pip" install -q --disable-pip-version-check -r "$req"
  cp "$req" "$venv/.requirements"
fi
work="$(mktemp -d)"
# A root server's replicas run as per-project users, who pass through here (never list it).
chmod 711 "$work"
port="$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')"
"$bin" serve --listen "127.0.0.1:$port" --data-dir "$work/data" >"$work/server.log" 2>&1 &
server=$!
cleanup() { kill "$server" 2>/dev/null || true; wait "$server" 2>/dev/null || true; rm -rf "$work"; }
trap cleanup EXIT
for _ in $(seq 100); do
  python3 -c "import urllib.request,sys; urllib.request.urlopen('http://127.0.0.1:$port/healthz', timeout=1)" 2>/dev/null && break
  sleep 0.1
done
set +e
"$venv/bin/schemathesis" run "http://127.0.0.1:$port/openapi.json" \
  --checks all --exclude-checks positive_data_acceptance \
  --max-examples "${SCHEMATHESIS_EXAMPLES:-50}" --request-timeout 10 --no-color 2>&1 | tee "$work/out.txt" | sed -n '/FAILURES\|SUMMARY/,$p'
code=${PIPESTATUS[0]}
echo "schemathesis: $(grep -E "[0-9]+ generated" "$work/out.txt" | tr -s " ")"
if grep -q "Server error" "$work/out.txt"; then echo "schemathesis: a 5xx response was seen"; code=1; fi
exit "$code"
