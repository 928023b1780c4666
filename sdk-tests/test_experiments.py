"""Vertex AI Experiments through the official Python SDK, over REST or gRPC
(TRAINYARD_SDK_TRANSPORT), as the managed service's "custom training with Experiments"
flow uses it: `aiplatform.init(experiment=...)` (the metadata store, the experiment's
context and the project's default TensorBoard made on first use), runs with parameters,
metrics, time series and classification metrics, `get_experiment_df`, resumed runs, lists
and deletes; and a CustomJob run into an experiment run whose program logs into that run
with the SDK and nothing of its own but `aiplatform.init()`.
"""

import sys
import uuid

import pytest

from conftest import LOCATION, PROJECT, TRANSPORT, _running_server


@pytest.fixture
def experiments(sdk):
    """The SDK (configured by `sdk`), with the experiment it is set to reset afterwards and
    its transport kept (see `_init`)."""
    from google.cloud.aiplatform import initializer
    from google.cloud.aiplatform.metadata import metadata

    transport = initializer.global_config._api_transport
    yield sdk
    metadata._experiment_tracker.reset()
    initializer.global_config._api_transport = transport


def _init(aiplatform, **kwargs):
    """`aiplatform.init(experiment=...)` with the project named again: without a project
    (or a transport), the SDK's `init` switches the process to its REST transport, and the
    gRPC run of this suite would then test REST."""
    aiplatform.init(project=PROJECT, **kwargs)


def test_experiment_runs_logged_and_read_back(experiments, server):
    aiplatform = experiments
    name = f"exp-{uuid.uuid4().hex[:8]}"
    _init(aiplatform, experiment=name, experiment_description="learning rates")
    # The transport of this suite's run, not one the SDK chose.
    from google.cloud.aiplatform import initializer

    assert (initializer.global_config._api_transport or "grpc") == server["transport"]

    exp = aiplatform.Experiment(name)
    assert exp.resource_name == f"projects/{PROJECT}/locations/{LOCATION}/metadataStores/default/contexts/{name}"
    # The project's default TensorBoard backs it.
    tb = exp.backing_tensorboard_resource_name
    assert tb and tb.startswith(f"projects/{PROJECT}/locations/{LOCATION}/tensorboards/"), tb
    defaults = aiplatform.Tensorboard.list(filter="is_default=true")
    assert [t.resource_name for t in defaults] == [tb]

    for run, lr in (("run-1", 0.1), ("run-2", 0.01)):
        aiplatform.start_run(run)
        aiplatform.log_params({"lr": lr, "optimizer": "adam"})
        for step in range(1, 4):
            aiplatform.log_time_series_metrics({"loss": 1.0 / (step * (1 + lr))}, step=step)
        aiplatform.log_metrics({"accuracy": 0.9 + lr})
        aiplatform.log_classification_metrics(labels=["cat", "dog"], matrix=[[9, 1], [2, 8]], display_name="confusion")
        aiplatform.end_run()

    df = aiplatform.get_experiment_df()
    rows = {r["run_name"]: r for r in df.to_dict("records")}
    assert set(rows) == {"run-1", "run-2"}, df
    assert rows["run-1"]["param.lr"] == 0.1 and rows["run-1"]["param.optimizer"] == "adam"
    assert rows["run-2"]["metric.accuracy"] == pytest.approx(0.91)
    assert rows["run-1"]["state"] == "COMPLETE"
    # The last point of each time series.
    assert rows["run-1"]["time_series_metric.loss"] == pytest.approx(1.0 / (3 * 1.1))

    # A run resumed, and read by name.
    aiplatform.start_run("run-1", resume=True)
    aiplatform.log_metrics({"f1": 0.7})
    aiplatform.end_run()
    run = aiplatform.ExperimentRun("run-1", experiment=name)
    assert run.get_params() == {"lr": 0.1, "optimizer": "adam"}
    assert run.get_metrics() == {"accuracy": pytest.approx(1.0), "f1": 0.7}
    series = run.get_time_series_data_frame()
    assert list(series["step"]) == [1, 2, 3], series
    assert list(series["loss"]) == pytest.approx([1.0 / (s * 1.1) for s in (1, 2, 3)])
    metrics = run.get_classification_metrics()
    assert metrics and metrics[0]["matrix"] == [[9, 1], [2, 8]], metrics

    assert sorted(r.name for r in aiplatform.ExperimentRun.list(experiment=name)) == ["run-1", "run-2"]
    assert name in [e.name for e in aiplatform.Experiment.list()]

    # A second start of a run that exists is refused, naming it; the run is unchanged.
    with pytest.raises(Exception, match="already exists"):
        aiplatform.start_run("run-2")

    exp.delete(delete_backing_tensorboard_runs=True)
    assert name not in [e.name for e in aiplatform.Experiment.list()]
    assert aiplatform.ExperimentRun.get("run-1", experiment=name) is None


# The program of the job: unchanged code written for the managed service, logging into the
# run the job was given (AIP_EXPERIMENT_NAME, AIP_EXPERIMENT_RUN_NAME).
INSIDE = """
from google.cloud import aiplatform

aiplatform.init()
aiplatform.log_params({"batch": 32, "epochs": 3})
for step in range(1, 4):
    aiplatform.log_time_series_metrics({"val_loss": 0.5 / step}, step=step)
aiplatform.log_metrics({"val_accuracy": 0.75})
print("inside: logged into", aiplatform.initializer.global_config.project, flush=True)
"""


def test_custom_job_runs_into_an_experiment_run(tmp_path):
    """`CustomJob.run(experiment=..., experiment_run=...)` against a TLS server (whose jobs
    reach it with no endpoint of their own, see test_in_job), over this run's transport:
    the job's program logs
    parameters, metrics and a time series into the run; the SDK marks the run COMPLETE
    after the job. The SDK here is configured for this server alone and put back after."""
    import google.oauth2.credentials
    from google.cloud import aiplatform
    from google.cloud.aiplatform import initializer
    from google.cloud.aiplatform.metadata import metadata

    saved = {k: getattr(initializer.global_config, k) for k in ("_project", "_location", "_credentials", "_api_endpoint", "_api_transport", "_staging_bucket")}
    with _running_server(tls=True) as server:
        try:
            # This run's transport: gRPC reads its trusted roots once a process, so the
            # REST run (whose process may have used gRPC before this server's CA was
            # trusted) goes over HTTPS.
            grpc = TRANSPORT == "grpc"
            aiplatform.init(
                project=PROJECT,
                location=LOCATION,
                api_endpoint=server["endpoint"] if grpc else server["url"],
                api_transport="grpc" if grpc else "rest",
                credentials=google.oauth2.credentials.Credentials(token="t"),
                staging_bucket="gs://exp-bucket",
            )
            name = f"jobexp-{uuid.uuid4().hex[:8]}"
            _init(aiplatform, experiment=name)
            # The run exists before the job (the SDK asks for it), RUNNING.
            aiplatform.start_run("trained")
            job = aiplatform.CustomJob(
                display_name="into-a-run",
                worker_pool_specs=[{
                    "machine_spec": {"machine_type": "n1-standard-4"},
                    "replica_count": 1,
                    "container_spec": {"image_uri": "local/sdk", "command": [sys.executable, "-c", INSIDE]},
                }],
            )
            job.run(experiment=name, experiment_run="trained")
            assert job.state.name == "JOB_STATE_SUCCEEDED"
            spec = job.gca_resource.job_spec
            assert spec.experiment_run.endswith(f"/contexts/{name}-trained"), spec
            run = aiplatform.ExperimentRun("trained", experiment=name)
            assert run.get_params() == {"batch": 32, "epochs": 3}
            assert run.get_metrics() == {"val_accuracy": 0.75}
            assert list(run.get_time_series_data_frame()["val_loss"]) == pytest.approx([0.5, 0.25, 0.5 / 3])
            assert run.get_state() == "COMPLETE"
        finally:
            metadata._experiment_tracker.reset()
            for k, v in saved.items():
                setattr(initializer.global_config, k, v)
