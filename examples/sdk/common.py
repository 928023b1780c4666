"""What the SDK examples share: the SDK pointed at a Trainyard server, and the staging
bucket made first (as on the managed service, where it must exist before a job uses it)."""
import os

import google.oauth2.credentials
from google.cloud import aiplatform, storage

SERVER = os.environ.get("TRAINYARD_SERVER", "http://127.0.0.1:8080")
PROJECT = os.environ.get("TRAINYARD_PROJECT", "local")
TOKEN = os.environ.get("TRAINYARD_TOKEN", "unused-without-a-tokens-file")
BUCKET = "sdk-examples"

# The SDK's uploads (the packaged script) go to the server's Cloud Storage endpoint.
os.environ["STORAGE_EMULATOR_HOST"] = SERVER
credentials = google.oauth2.credentials.Credentials(token=TOKEN)
client = storage.Client(project=PROJECT, credentials=credentials)
if client.lookup_bucket(BUCKET) is None:
    client.create_bucket(BUCKET)
aiplatform.init(
    project=PROJECT,
    location="us-central1",
    api_endpoint=SERVER,
    api_transport="rest",
    credentials=credentials,
    staging_bucket=f"gs://{BUCKET}",
)
TASK = os.path.join(os.path.dirname(os.path.abspath(__file__)), "task.py")
