#!/usr/bin/env bash
# Checks Trainyard's GPU assignment on real NVIDIA GPUs: starts a server on a temporary
# data directory, runs two 1-GPU jobs at once (a small CUDA program through the driver
# API with ctypes, and PyTorch's view too when it is installed) and checks that each sees
# exactly one device, its own, and not the other's. On a machine without NVIDIA GPUs it
# says so and exits 0.
#
#   scripts/gpu-check.sh [path/to/trainyard]     (default: target/release/trainyard, else debug)
set -euo pipefail
cd "$(dirname "$0")/.."

if ! command -v nvidia-smi >/dev/null 2>&1; then
  echo "gpu-check: no nvidia-smi on PATH: this machine has no NVIDIA driver; nothing to check"
  exit 0
fi
if ! nvidia-smi -L >/dev/null 2>&1; then
  echo "gpu-check: nvidia-smi fails here ($(nvidia-smi -L 2>&1 | head -1)); nothing to check"
  exit 0
fi
count=$(nvidia-smi -L | grep -c '^GPU ' || true)
if [ "$count" -lt 2 ]; then
  echo "gpu-check: $count GPU(s): two are needed to check that jobs do not share one; nothing to check"
  exit 0
fi

bin=${1:-}
if [ -z "$bin" ]; then
  for b in target/release/trainyard target/debug/trainyard; do [ -x "$b" ] && bin=$b && break; done
fi
[ -n "$bin" ] && [ -x "$bin" ] || { echo "gpu-check: build trainyard first (cargo build --release -p trainyard)" >&2; exit 2; }
python=$(command -v python3) || { echo "gpu-check: needs python3" >&2; exit 2; }

dir=$(mktemp -d)
chmod 0755 "$dir"
port=$((20000 + RANDOM % 20000))
server=""
cleanup() { [ -n "$server" ] && kill "$server" 2>/dev/null; wait 2>/dev/null || true; rm -rf "$dir"; }
trap cleanup EXIT

# The GPUs' accelerator type as Trainyard names it, and a machine type that asks for one.
model=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
cat >"$dir/trainyard.toml" <<EOF
listen = "127.0.0.1:$port"
gpu_check_secs = 0
[replicas]
per_project_users = false
EOF
"$bin" serve --config "$dir/trainyard.toml" --data-dir "$dir/data" >"$dir/server.log" 2>&1 &
server=$!
for _ in $(seq 100); do curl -sf "http://127.0.0.1:$port/healthz" >/dev/null 2>&1 && break; sleep 0.1; done
type=$(curl -sf "http://127.0.0.1:$port/v1/admin/nodes/local" | "$python" -c 'import json,sys; print(json.load(sys.stdin)["gpus"][0]["acceleratorType"])')
kill "$server"; wait "$server" 2>/dev/null || true
case $type in
  NVIDIA_*) ;;
  *) echo "gpu-check: $model is not one of the API's accelerator types ($type): jobs cannot ask for it; nothing to check"; exit 0 ;;
esac
printf '[[machine_types]]\nname = "gpu-check-1"\nvcpus = 1\nmemory_gb = 4\naccelerator_required = true\n[machine_types.accelerators]\n"%s" = [1]\n' \
  "$type" >>"$dir/trainyard.toml"
"$bin" serve --config "$dir/trainyard.toml" --data-dir "$dir/data" >>"$dir/server.log" 2>&1 &
server=$!
for _ in $(seq 100); do curl -sf "http://127.0.0.1:$port/healthz" >/dev/null 2>&1 && break; sleep 0.1; done
echo "gpu-check: $count x $model ($type); server log: $dir/server.log"

cat >"$dir/probe.py" <<'EOF'
# Which CUDA devices this process sees: the driver API (libcuda) by ctypes, and PyTorch's
# view when it is installed. Prints one line: seen=<uuid,...> visible=<CUDA_VISIBLE_DEVICES>.
import ctypes, os, time
cuda = ctypes.CDLL("libcuda.so.1")
assert cuda.cuInit(0) == 0, "cuInit failed"
n = ctypes.c_int()
cuda.cuDeviceGetCount(ctypes.byref(n))
seen = []
for i in range(n.value):
    dev = ctypes.c_int()
    cuda.cuDeviceGet(ctypes.byref(dev), i)
    raw = (ctypes.c_ubyte * 16)()
    cuda.cuDeviceGetUuid(raw, dev)
    h = bytes(raw).hex()
    seen.append("GPU-%s-%s-%s-%s-%s" % (h[:8], h[8:12], h[12:16], h[16:20], h[20:]))
torch_view = ""
try:
    import torch
    torch_view = " torch=%d" % torch.cuda.device_count()
    if torch.cuda.device_count():
        x = torch.ones(1024, device="cuda")
        torch_view += " sum=%d" % int(x.sum().item())
except ImportError:
    pass
print("seen=%s visible=%s%s" % (",".join(seen), os.environ.get("CUDA_VISIBLE_DEVICES", "<unset>"), torch_view), flush=True)
time.sleep(5)  # hold the GPU while the other job runs
EOF

create() {
  curl -sf -X POST "http://127.0.0.1:$port/v1/projects/gpucheck/locations/us-central1/customJobs" \
    -H 'Content-Type: application/json' -d "{\"displayName\": \"$1\", \"jobSpec\": {\"workerPoolSpecs\": [{
      \"machineSpec\": {\"machineType\": \"gpu-check-1\", \"acceleratorType\": \"$type\", \"acceleratorCount\": 1},
      \"replicaCount\": \"1\", \"containerSpec\": {\"imageUri\": \"local\", \"command\": [\"$python\", \"$dir/probe.py\"]}}]}}" |
    "$python" -c 'import json,sys; print(json.load(sys.stdin)["name"])'
}
a=$(create check-a)
b=$(create check-b)
wait_done() {
  for _ in $(seq 600); do
    s=$(curl -sf "http://127.0.0.1:$port/v1/$1" | "$python" -c 'import json,sys; print(json.load(sys.stdin)["state"])')
    case $s in JOB_STATE_SUCCEEDED | JOB_STATE_FAILED | JOB_STATE_CANCELLED) echo "$s"; return ;; esac
    sleep 0.2
  done
  echo TIMEOUT
}
fail=0
declare -A got
for j in "$a" "$b"; do
  state=$(wait_done "$j")
  line=$(curl -sf "http://127.0.0.1:$port/v1/$j/logs" | "$python" -c '
import json, sys
for e in json.load(sys.stdin).get("entries", []):
    if "seen=" in e.get("text", ""):
        print(e["text"]); break')
  echo "gpu-check: $j: $state: $line"
  seen=$(sed -n 's/.*seen=\([^ ]*\).*/\1/p' <<<"$line")
  visible=$(sed -n 's/.*visible=\([^ ]*\).*/\1/p' <<<"$line")
  if [ "$state" != JOB_STATE_SUCCEEDED ]; then echo "gpu-check: FAIL: $j did not succeed" >&2; fail=1; fi
  if [ -z "$seen" ] || [[ $seen == *,* ]]; then echo "gpu-check: FAIL: $j sees '${seen}', not exactly one device" >&2; fail=1; fi
  if [ "$seen" != "$visible" ]; then echo "gpu-check: FAIL: $j sees $seen but was given $visible" >&2; fail=1; fi
  got[$j]=$seen
done
if [ -n "${got[$a]}" ] && [ "${got[$a]}" = "${got[$b]}" ]; then
  echo "gpu-check: FAIL: both jobs ran on ${got[$a]}" >&2
  fail=1
fi
[ "$fail" = 0 ] && echo "gpu-check: OK: each job saw exactly its own GPU (${got[$a]} and ${got[$b]})"
exit "$fail"
