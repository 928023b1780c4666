"""A fake training loop that checkpoints and resumes.

Every step sleeps 0.2 s and computes a made-up loss. Every --every steps the
current step is saved to AIP_CHECKPOINT_DIR as JSON, written atomically (write a
temporary file, then rename it over the old one), so a replica killed at any
moment leaves either the old checkpoint or the new one, never half a file.
On start the program looks for that checkpoint and carries on from it: Trainyard
restarts a killed replica with the same AIP_CHECKPOINT_DIR.
At the end a model file is written to AIP_MODEL_DIR.
"""
import argparse
import json
import math
import os
import time

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=50)
parser.add_argument("--every", type=int, default=5, help="checkpoint every N steps")
args = parser.parse_args()

# Set by Trainyard from baseOutputDirectory (<base>/checkpoints/ and <base>/model/).
ckpt_dir = os.environ["AIP_CHECKPOINT_DIR"]
model_dir = os.environ["AIP_MODEL_DIR"]
os.makedirs(ckpt_dir, exist_ok=True)
os.makedirs(model_dir, exist_ok=True)
ckpt_path = os.path.join(ckpt_dir, "checkpoint.json")


def save_checkpoint(step, loss):
    tmp = ckpt_path + ".tmp"
    with open(tmp, "w") as f:
        json.dump({"step": step, "loss": loss}, f)
        f.flush()
        os.fsync(f.fileno())  # the bytes are on disk before the rename makes them visible
    os.replace(tmp, ckpt_path)  # atomic on POSIX


# Resume from the latest checkpoint, if any.
start, loss = 0, None
if os.path.exists(ckpt_path):
    with open(ckpt_path) as f:
        saved = json.load(f)
    start, loss = saved["step"], saved["loss"]
    print(f"resumed from step {start}", flush=True)
else:
    print("no checkpoint found, starting from step 0", flush=True)

if start < args.steps:
    print(f"pid {os.getpid()}, training steps {start + 1}..{args.steps}", flush=True)
else:
    print(f"already trained {args.steps} steps; delete {ckpt_dir} to start over", flush=True)
for step in range(start + 1, args.steps + 1):
    time.sleep(0.2)  # the "work"
    loss = 2.0 * math.exp(-step / 15.0) + 0.05  # a loss that goes down
    print(f"step {step} loss {loss:.4f}", flush=True)
    if step % args.every == 0:
        save_checkpoint(step, loss)
        print(f"checkpoint saved at step {step}", flush=True)

# The "model": whatever a serving system would load.
with open(os.path.join(model_dir, "model.json"), "w") as f:
    json.dump({"steps": args.steps, "final_loss": loss}, f)
print(f"model written to {os.path.join(model_dir, 'model.json')}", flush=True)
