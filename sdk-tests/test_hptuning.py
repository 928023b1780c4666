"""HyperparameterTuningJob through the official Python SDK, with a trial program that
reports its metric with cloudml-hypertune, as users do on the managed service."""

import sys
import uuid

from google.cloud.aiplatform import hyperparameter_tuning as hpt
from google.cloud.aiplatform.compat.types import job_state as gca_job_state

JobState = gca_job_state.JobState

# The trial program runs with this interpreter, which has cloudml-hypertune installed.
TRIAL = r"""
import argparse, os, hypertune
p = argparse.ArgumentParser()
p.add_argument("--lr", type=float)
p.add_argument("--units", type=int)
p.add_argument("--act")
a = p.parse_args()
print("trial", os.environ["CLOUD_ML_TRIAL_ID"], a.lr, a.units, a.act)
score = 1.0 - abs(a.lr - 0.01) * 10 - abs(a.units - 12) / 100 + (0.05 if a.act == "relu" else 0.0)
reporter = hypertune.HyperTune()
for step in range(1, 4):
    reporter.report_hyperparameter_tuning_metric(
        hyperparameter_metric_tag="accuracy", metric_value=score - 0.01 * (3 - step), global_step=step)
"""


def test_hyperparameter_tuning_job_runs_trials(sdk):
    custom_job = sdk.CustomJob(
        display_name=f"trial-{uuid.uuid4().hex[:8]}",
        worker_pool_specs=[{
            "machine_spec": {"machine_type": "n1-standard-4"},
            "replica_count": 1,
            "container_spec": {"image_uri": "python:3.11", "command": [sys.executable, "-c", TRIAL]},
        }],
    )
    job = sdk.HyperparameterTuningJob(
        display_name=f"tune-{uuid.uuid4().hex[:8]}",
        custom_job=custom_job,
        metric_spec={"accuracy": "maximize"},
        parameter_spec={
            "lr": hpt.DoubleParameterSpec(min=0.001, max=0.1, scale="log"),
            "units": hpt.IntegerParameterSpec(min=4, max=16, scale="linear"),
            "act": hpt.CategoricalParameterSpec(values=["relu", "tanh"]),
        },
        max_trial_count=4,
        parallel_trial_count=2,
    )
    job.run()
    assert job.state == JobState.JOB_STATE_SUCCEEDED
    trials = job.trials
    assert len(trials) == 4
    for t in trials:
        assert t.state.name == "SUCCEEDED", t
        params = {p.parameter_id: p.value for p in t.parameters}
        assert set(params) == {"lr", "units", "act"}
        assert 0.001 <= params["lr"] <= 0.1
        assert 4 <= params["units"] <= 16
        assert params["act"] in ("relu", "tanh")
        assert t.final_measurement.step_count == 3
        assert t.final_measurement.metrics[0].metric_id == "accuracy"
        assert t.custom_job.startswith(f"projects/")
    # The trial's CustomJob is a real one, and it ran with the trial's arguments.
    first = sdk.CustomJob.get(trials[0].custom_job)
    assert first.state == JobState.JOB_STATE_SUCCEEDED
    # list omits the trials
    listed = [j for j in sdk.HyperparameterTuningJob.list() if j.resource_name == job.resource_name]
    assert len(listed) == 1
