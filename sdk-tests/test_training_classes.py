"""The SDK's training classes, unchanged: CustomJob.from_local_script, CustomTrainingJob,
CustomContainerTrainingJob and CustomPythonPackageTrainingJob, which upload code to Cloud
Storage (STORAGE_EMULATOR_HOST points google-cloud-storage at the server's endpoint) and
create trainingPipelines. Programs run as host processes: the SDK's command
(`pip install --upgrade pip && pip3 install --user /gcs/bucket/... && python3 -m ...`) runs
in a venv of the job's, with /gcs the project's buckets.
"""

import subprocess
import sys
import textwrap
import uuid

import pytest
from google.cloud import storage
from google.cloud.aiplatform import training_jobs
from google.cloud.aiplatform.compat.types import job_state as gca_job_state
from google.cloud.aiplatform.compat.types import pipeline_state as gca_pipeline_state

from conftest import PROJECT

JobState = gca_job_state.JobState
PipelineState = gca_pipeline_state.PipelineState
IMAGE = "python:3.11"
PREBUILT = "us-docker.pkg.dev/vertex-ai/training/sklearn-cpu.1-0:latest"


@pytest.fixture(autouse=True)
def quick_polls(monkeypatch):
    """The SDK polls a pipeline every 5 s; once a second is enough here (timing only)."""
    monkeypatch.setattr(training_jobs, "_JOB_WAIT_TIME", 1)


@pytest.fixture(autouse=True)
def storage_endpoint(server, monkeypatch):
    """What a user changes besides api_endpoint and credentials: STORAGE_EMULATOR_HOST,
    and the staging bucket exists in the project (as on the managed service)."""
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", server["url"])
    client = storage.Client(project=PROJECT)
    if client.lookup_bucket("bucket") is None:
        client.create_bucket("bucket")


def unique(prefix):
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def script(tmp_path, body):
    path = tmp_path / "task.py"
    path.write_text(textwrap.dedent(body))
    return str(path)


TRAIN = """
    import os, sys
    print("training with", sys.argv[1:], flush=True)
    out = os.environ.get("AIP_MODEL_DIR", "")
    print("model dir", out, flush=True)
"""


def logs_of(server, job_name):
    import requests

    r = requests.get(f"{server['url']}/v1/{job_name}/logs", timeout=10)
    r.raise_for_status()
    return r.text


def test_from_local_script_with_a_plain_image(sdk, server, tmp_path):
    job = sdk.CustomJob.from_local_script(
        display_name=unique("local-script"),
        script_path=script(tmp_path, TRAIN),
        container_uri=IMAGE,
        args=["--epochs", "2"],
        replica_count=1,
        machine_type="n1-standard-4",
    )
    job.run()
    assert job.state == JobState.JOB_STATE_SUCCEEDED
    assert "training with ['--epochs', '2']" in logs_of(server, job.resource_name)


def test_from_local_script_with_a_prebuilt_training_image(sdk, server, tmp_path):
    job = sdk.CustomJob.from_local_script(
        display_name=unique("prebuilt"),
        script_path=script(tmp_path, TRAIN),
        container_uri=PREBUILT,
        args=["--lr", "0.1"],
        replica_count=1,
        machine_type="n1-standard-4",
    )
    spec = job.job_spec.worker_pool_specs[0]
    assert spec.python_package_spec.python_module, "the SDK sends a pythonPackageSpec for prebuilt images"
    job.run()
    assert job.state == JobState.JOB_STATE_SUCCEEDED
    assert "training with ['--lr', '0.1']" in logs_of(server, job.resource_name)


def test_custom_training_job_run(sdk, server, tmp_path):
    job = sdk.CustomTrainingJob(display_name=unique("training"), script_path=script(tmp_path, TRAIN), container_uri=IMAGE)
    model = job.run(replica_count=1, machine_type="n1-standard-4", args=["--steps", "3"])
    assert model is None, "no serving container: no model"
    assert job.state == PipelineState.PIPELINE_STATE_SUCCEEDED
    backing = job.gca_resource.training_task_metadata["backingCustomJob"]
    assert "training with ['--steps', '3']" in logs_of(server, backing)


def test_custom_container_training_job_run(sdk, server):
    job = sdk.CustomContainerTrainingJob(
        display_name=unique("container"),
        container_uri=IMAGE,
        command=["python3", "-c", "import sys; print('container training', sys.argv[1:])"],
    )
    job.run(replica_count=1, machine_type="n1-standard-4", args=["--x", "1"])
    assert job.state == PipelineState.PIPELINE_STATE_SUCCEEDED
    backing = job.gca_resource.training_task_metadata["backingCustomJob"]
    assert "container training ['--x', '1']" in logs_of(server, backing)


def test_custom_python_package_training_job_run(sdk, server, tmp_path):
    pkg = tmp_path / "pkg"
    (pkg / "trainer").mkdir(parents=True)
    (pkg / "setup.py").write_text("from setuptools import setup\nsetup(name='trainer', version='0.1', packages=['trainer'])\n")
    (pkg / "trainer" / "__init__.py").write_text("")
    (pkg / "trainer" / "task.py").write_text("import sys\nprint('package task', sys.argv[1:])\n")
    subprocess.run([sys.executable, "setup.py", "-q", "sdist", "--formats=gztar", "-d", "dist"], cwd=pkg, check=True)
    sdist = next((pkg / "dist").glob("*.tar.gz"))
    client = storage.Client(project=PROJECT)
    name = f"packages/{unique('trainer')}/{sdist.name}"
    client.bucket("bucket").blob(name).upload_from_filename(str(sdist))
    job = sdk.CustomPythonPackageTrainingJob(
        display_name=unique("package"),
        python_package_gcs_uri=f"gs://bucket/{name}",
        python_module_name="trainer.task",
        container_uri=IMAGE,
    )
    job.run(replica_count=1, machine_type="n1-standard-4", args=["--y", "2"])
    assert job.state == PipelineState.PIPELINE_STATE_SUCCEEDED
    backing = job.gca_resource.training_task_metadata["backingCustomJob"]
    assert "package task ['--y', '2']" in logs_of(server, backing)


def test_a_failing_training_script_raises_its_error(sdk, tmp_path):
    job = sdk.CustomTrainingJob(
        display_name=unique("failing"),
        script_path=script(tmp_path, "raise ValueError('the data is bad: boom')\n"),
        container_uri=IMAGE,
    )
    with pytest.raises(RuntimeError) as e:
        job.run(replica_count=1, machine_type="n1-standard-4")
    assert "boom" in str(e.value)
    assert job.state == PipelineState.PIPELINE_STATE_FAILED
