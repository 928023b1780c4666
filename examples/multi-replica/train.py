"""A primary and its workers find each other through CLUSTER_SPEC.

Every replica binds a TCP server on its own HOST:PORT from CLUSTER_SPEC (as a
real framework would). Workers connect to the primary's address, retrying until
it listens, and send their RANK. The primary waits for every worker, sums the
ranks and checks the sum against WORLD_SIZE (ranks 1..N-1 sum to N*(N-1)/2).
"""
import json
import os
import socket
import sys
import time

spec = json.loads(os.environ["CLUSTER_SPEC"])
task = spec["task"]  # {"type": "workerpool1", "index": 0}
me = spec["cluster"][task["type"]][task["index"]]  # this replica's HOST:PORT
primary = spec["cluster"]["workerpool0"][0]
rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
tf_type = json.loads(os.environ["TF_CONFIG"])["task"]["type"]  # chief / worker
name = f"{task['type']}-{task['index']}"
print(f"{name}: TF_CONFIG task type {tf_type}, rank {rank}/{world}, "
      f"my address {me}, primary {primary} (MASTER_ADDR={os.environ['MASTER_ADDR']}:"
      f"{os.environ['MASTER_PORT']})", flush=True)


def split(addr):
    host, port = addr.rsplit(":", 1)
    return host, int(port)


# Every replica listens on its own address, as a framework's server would.
server = socket.create_server(split(me))

if rank == 0:
    # Primary: collect one message per worker.
    server.settimeout(120)
    got = []
    while len(got) < world - 1:
        conn, peer = server.accept()
        with conn:
            msg = conn.makefile().readline().strip()  # e.g. "rank 2 from workerpool1-1"
            conn.sendall(b"ok\n")
        print(f"primary received {msg!r} from {peer[0]}", flush=True)
        got.append(int(msg.split()[1]))
    total, expected = sum(got), world * (world - 1) // 2
    print(f"primary: ranks {sorted(got)}, sum {total}, expected {expected} "
          f"for WORLD_SIZE={world}", flush=True)
    sys.exit(0 if total == expected else 1)

# Worker: connect to the primary, retrying until it is up (up to 60 s).
deadline = time.time() + 60
while True:
    try:
        conn = socket.create_connection(split(primary), timeout=5)
        break
    except OSError as e:
        if time.time() > deadline:
            sys.exit(f"{name}: primary {primary} never came up: {e}")
        print(f"{name}: primary not up yet ({e.strerror}), retrying", flush=True)
        time.sleep(0.5)
with conn:
    conn.sendall(f"rank {rank} from {name}\n".encode())
    reply = conn.makefile().readline().strip()
print(f"{name}: sent rank {rank}, primary answered {reply!r}", flush=True)
