"""The training program of the SDK examples: reads its arguments, "trains" a few steps
and writes a model file where the service says (AIP_MODEL_DIR)."""
import argparse
import json
import os

parser = argparse.ArgumentParser()
parser.add_argument("--epochs", type=int, default=3)
args = parser.parse_args()
loss = 1.0
for epoch in range(1, args.epochs + 1):
    loss *= 0.5
    print(f"epoch {epoch} loss {loss:.4f}", flush=True)
model_dir = os.environ.get("AIP_MODEL_DIR", "")
print(f"model dir {model_dir}", flush=True)
if model_dir:
    # The managed service gives gs:// directories as /gcs/ paths: plain files.
    path = model_dir.replace("gs://", "/gcs/", 1)
    os.makedirs(path, exist_ok=True)
    with open(os.path.join(path, "model.json"), "w") as f:
        json.dump({"loss": loss}, f)
