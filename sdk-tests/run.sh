#!/usr/bin/env bash
# Runs the official-Python-SDK conformance suite against target/debug/trainyard
# (or $TRAINYARD_BIN). Build the server first: cargo build -p trainyard
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(dirname "$here")"
venv="${TRAINYARD_SDK_VENV:-$repo/.venv}"
stamp="$venv/.sdk-tests-requirements"
if [ ! -x "$venv/bin/python" ]; then
    python3 -m venv "$venv"
fi
# (Re)install when the venv is new or requirements.txt changed since the last install.
if ! cmp -s "$here/requirements.txt" "$stamp"; then
    "$venv/bin/pip" install -q --disable-pip-version-check -r "$here/requirements.txt"
    cp "$here/requirements.txt" "$stamp"
fi
cd "$here"
set +e
"$venv/bin/python" -m pytest -q -p no:cacheprovider "$@"
exit $?
