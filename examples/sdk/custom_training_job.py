"""CustomTrainingJob: the same script as a training pipeline whose backing CustomJob runs
it; `run` waits for the pipeline and raises if it fails."""
from common import TASK, aiplatform

job = aiplatform.CustomTrainingJob(display_name="sdk-custom-training-job", script_path=TASK, container_uri="python:3.11")
job.run(replica_count=1, machine_type="n1-standard-4", args=["--epochs", "3"])
print(job.resource_name, job.state.name, job.gca_resource.training_task_metadata["backingCustomJob"])
