"""Vizier studies through the official Python SDK, over REST or gRPC
(TRAINYARD_SDK_TRANSPORT): the generated `aiplatform_v1.VizierServiceClient`, and the
SDK's own
`google.cloud.aiplatform.vizier.Study` (which needs the `google-vizier` package for its
`pyvizier` types), driving a training loop that runs in the test itself."""

import uuid

import google.oauth2.credentials
import pytest
from google.api_core import exceptions
from google.api_core.client_options import ClientOptions

from conftest import LOCATION, PROJECT, TOKEN


def _loss(params):
    """A bowl around x = 1.3, units = 20; sgd a little worse."""
    return (params["x"] - 1.3) ** 2 + (params["units"] - 20) ** 2 / 400 + (0.1 if params.get("opt") == "sgd" else 0.0)


@pytest.fixture
def client(server):
    from google.cloud import aiplatform_v1

    # REST: an http:// endpoint; gRPC: host:port, the CA trusted by
    # GRPC_DEFAULT_SSL_ROOTS_FILE_PATH.
    endpoint = server["url"] if server["transport"] == "rest" else server["endpoint"]
    return aiplatform_v1.VizierServiceClient(
        transport=server["transport"],
        client_options=ClientOptions(api_endpoint=endpoint),
        credentials=google.oauth2.credentials.Credentials(token=TOKEN),
    )


def test_vizier_service_client_training_loop(client):
    from google.cloud.aiplatform_v1 import types

    P = types.StudySpec.ParameterSpec
    parent = f"projects/{PROJECT}/locations/{LOCATION}"
    name = f"loop-{uuid.uuid4().hex[:8]}"
    spec = types.StudySpec(
        metrics=[types.StudySpec.MetricSpec(metric_id="loss", goal=types.StudySpec.MetricSpec.GoalType.MINIMIZE)],
        parameters=[
            P(parameter_id="x", double_value_spec=P.DoubleValueSpec(min_value=-5, max_value=5)),
            P(parameter_id="units", integer_value_spec=P.IntegerValueSpec(min_value=1, max_value=64)),
            P(parameter_id="opt", categorical_value_spec=P.CategoricalValueSpec(values=["adam", "sgd"])),
        ],
        median_automated_stopping_spec=types.StudySpec.MedianAutomatedStoppingSpec(),
    )
    study = client.create_study(parent=parent, study=types.Study(display_name=name, study_spec=spec))
    assert study.state == types.Study.State.ACTIVE
    assert study.name.startswith(f"{parent}/studies/")
    assert study.name.rsplit("/", 1)[1].isdigit()

    losses = {}
    for _ in range(6):
        lro = client.suggest_trials(request={"parent": study.name, "suggestion_count": 1, "client_id": "worker-1"})
        response = lro.result(timeout=60)
        assert response.study_state == types.Study.State.ACTIVE
        (trial,) = response.trials
        assert trial.state == types.Trial.State.ACTIVE
        assert trial.client_id == "worker-1"
        params = {p.parameter_id: p.value for p in trial.parameters}
        assert set(params) == {"x", "units", "opt"}
        assert params["units"] == int(params["units"]) and 1 <= params["units"] <= 64
        loss = _loss(params)
        for step in (1, 2):
            client.add_trial_measurement(
                request={
                    "trial_name": trial.name,
                    "measurement": {"step_count": step, "metrics": [{"metric_id": "loss", "value": loss + 0.1 * (2 - step)}]},
                }
            )
        should = client.check_trial_early_stopping_state(request={"trial_name": trial.name}).result(timeout=30)
        assert should.should_stop in (True, False)
        done = client.complete_trial(request={"name": trial.name})
        assert done.state in (types.Trial.State.SUCCEEDED,)
        assert done.final_measurement.metrics[0].value == pytest.approx(loss)
        losses[trial.id] = loss

    best = min(losses, key=losses.get)
    optimal = client.list_optimal_trials(request={"parent": study.name}).optimal_trials
    assert [t.id for t in optimal] == [best]
    assert [t.id for t in client.list_trials(parent=study.name)] == sorted(losses, key=int)
    assert client.get_trial(name=f"{study.name}/trials/{best}").final_measurement.metrics[0].metric_id == "loss"

    # A trial asked to stop should stop; an ended one cannot be completed again.
    lro = client.suggest_trials(request={"parent": study.name, "suggestion_count": 1, "client_id": "worker-2"})
    (extra,) = lro.result(timeout=60).trials
    assert client.stop_trial(request={"name": extra.name}).state == types.Trial.State.STOPPING
    assert client.check_trial_early_stopping_state(request={"trial_name": extra.name}).result(timeout=30).should_stop
    infeasible = client.complete_trial(request={"name": extra.name, "trial_infeasible": True, "infeasible_reason": "diverged"})
    assert infeasible.state == types.Trial.State.INFEASIBLE and infeasible.infeasible_reason == "diverged"
    with pytest.raises(exceptions.BadRequest, match="INFEASIBLE"):
        client.complete_trial(request={"name": extra.name})

    assert client.lookup_study(request={"parent": parent, "display_name": name}).name == study.name
    assert study.name in [s.name for s in client.list_studies(parent=parent)]
    client.delete_trial(name=extra.name)
    with pytest.raises(exceptions.NotFound):
        client.get_trial(name=extra.name)
    client.delete_study(name=study.name)
    with pytest.raises(exceptions.NotFound):
        client.get_study(name=study.name)


def test_vizier_service_client_refuses_bad_input(client):
    from google.cloud.aiplatform_v1 import types

    parent = f"projects/{PROJECT}/locations/{LOCATION}"
    P = types.StudySpec.ParameterSpec
    bad = types.Study(
        display_name=f"bad-{uuid.uuid4().hex[:8]}",
        study_spec=types.StudySpec(
            metrics=[types.StudySpec.MetricSpec(metric_id="m", goal=types.StudySpec.MetricSpec.GoalType.MAXIMIZE)],
            parameters=[P(parameter_id="x", double_value_spec=P.DoubleValueSpec(min_value=2, max_value=1))],
        ),
    )
    with pytest.raises(exceptions.BadRequest, match=r"studySpec\.parameters\[0\]"):
        client.create_study(parent=parent, study=bad)
    with pytest.raises(exceptions.NotFound):
        client.get_study(name=f"{parent}/studies/999999")


def test_sdk_vizier_study(sdk, server):
    # The SDK's Study and Trial classes need google-vizier's pyvizier.
    pytest.importorskip("vizier")
    from google.cloud.aiplatform.vizier import Study
    from google.cloud.aiplatform.vizier import pyvizier as vz

    config = vz.StudyConfig()
    config.algorithm = vz.Algorithm.RANDOM_SEARCH
    config.metric_information.append(vz.MetricInformation(name="loss", goal=vz.ObjectiveMetricGoal.MINIMIZE))
    root = config.search_space.select_root()
    root.add_float_param("x", -5.0, 5.0, scale_type=vz.ScaleType.LINEAR)
    root.add_int_param("units", 1, 64)
    root.add_discrete_param("batch", [16, 32, 64])
    name = f"sdk-{uuid.uuid4().hex[:8]}"
    study = Study.create_or_load(display_name=name, problem=config)
    assert study.resource_name.startswith(f"projects/{PROJECT}/locations/{LOCATION}/studies/")

    results = {}
    for _ in range(4):
        (trial,) = study.suggest(count=1, worker="w")
        params = {k: v.value for k, v in trial.parameters.items()}
        assert params["batch"] in (16, 32, 64)
        loss = _loss(params)
        trial.add_measurement(vz.Measurement(metrics={"loss": loss + 0.5}, steps=1))
        assert trial.should_stop() is False  # no automated stopping rule in this study
        trial.complete(vz.Measurement(metrics={"loss": loss}, steps=2))
        assert trial.status == vz.TrialStatus.COMPLETED
        results[trial.uid] = loss
    assert [t.uid for t in study.optimal_trials()] == [min(results, key=results.get)]
    assert sorted(t.uid for t in study.trials()) == sorted(results)
    assert study.get_trial(min(results)).materialize().final_measurement.metrics["loss"].value == pytest.approx(results[min(results)])

    # The name is taken now. Over REST, create_or_load cannot fall back to a lookup: the
    # REST transport turns the 409 ALREADY_EXISTS answer into `Conflict` (by HTTP status),
    # while the SDK catches `AlreadyExists`, its subclass (by gRPC status). Over gRPC the
    # status is ALREADY_EXISTS itself: the SDK catches it and loads the study by its name,
    # as against the managed service.
    if server["transport"] == "rest":
        with pytest.raises(exceptions.Conflict, match="exists already"):
            Study.create_or_load(display_name=name, problem=config)
    else:
        assert Study.create_or_load(display_name=name, problem=config).resource_name == study.resource_name
    assert Study(study.resource_name).resource_name == study.resource_name
    study.delete()
    with pytest.raises(exceptions.NotFound):
        Study(study.resource_name)
