"""CustomJob.from_local_script: the SDK packages task.py, uploads it to the staging
bucket and creates a CustomJob that installs and runs it in the image."""
from common import TASK, aiplatform

job = aiplatform.CustomJob.from_local_script(
    display_name="sdk-from-local-script",
    script_path=TASK,
    container_uri="python:3.11",
    args=["--epochs", "2"],
    replica_count=1,
    machine_type="n1-standard-4",
)
job.run()
print(job.resource_name, job.state.name)
