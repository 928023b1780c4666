#!/usr/bin/env bash
# A venv with PyTorch (CPU; PyPI's wheel, which also pulls CUDA libraries it does not use
# here: about 83 s and 5.3 GB the first time, pip's cache kept) for the elastic training
# tests (crates/cli/tests/elastic_e2e.rs). Prints the venv's path.
#
# Replicas run as their project's user and must be able to read the venv: it is made from
# the system's Python (a Python under root's home is not theirs to run) with umask 022,
# outside the repository's directory (which may be private).
set -euo pipefail
venv="${TRAINYARD_TORCH_VENV:-/var/tmp/trainyard-torch-venv}"
version=2.15.0
py=/usr/bin/python3
[ -x "$py" ] || py=$(command -v python3)
umask 022
if [ ! -x "$venv/bin/torchrun" ] || [ "$(cat "$venv/.torch-version" 2>/dev/null)" != "$version" ]; then
  rm -rf "$venv"
  "$py" -m venv "$venv"
  "$venv/bin/pip" install -q --disable-pip-version-check "torch==$version" >&2
  echo "$version" > "$venv/.torch-version"
fi
echo "$venv"
