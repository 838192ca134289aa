"""tracking.backends: TensorBoard event files and an MLflow file store in the run directory hold
metrics.jsonl's numbers (loss, tokens/s, memory, val_loss at its steps) and the run's config,
read back with each tool's own reader; no credential reaches either. One short in-process run
feeds both checks. A backend whose package is missing, or an unknown backend, is one error
naming the key before anything starts."""

from __future__ import annotations

import math
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import FAST, read_metrics, read_summary, run_launch
from tests.installed import require

require("tensorboard", "mlflow")

pytestmark = pytest.mark.e2e

SECRET = "SENTINELapikey0123456789"
RUN = [
    "train",
    *FAST,
    "train.steps=4",
    "eval.every=2",
    "batch.global_size=8",
    "tracking.backends=[tensorboard,mlflow]",
    f"wandb.name='x --api-key={SECRET}'",  # a credential typed into the config: never a param
]


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("trackers") / "run"
    run_launch(RUN, directory)
    return directory


def _tensorboard(run: Path) -> tuple[dict[str, dict[int, float]], Any]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(run / "tensorboard"), size_guidance={"scalars": 0})
    events.Reload()
    scalars = {
        tag: {e.step: e.value for e in events.Scalars(tag)} for tag in events.Tags()["scalars"]
    }
    return scalars, events


def _close(a: float, b: float) -> bool:
    return math.isclose(a, b, rel_tol=1e-6, abs_tol=1e-9)


def test_tensorboard_events_hold_the_metrics_and_the_config(run: Path) -> None:
    metrics = read_metrics(run)
    scalars, events = _tensorboard(run)
    assert sorted(scalars["loss"]) == [m["step"] for m in metrics]
    for m in metrics:
        assert _close(scalars["loss"][m["step"]], m["loss"])
        assert _close(scalars["tokens_per_s"][m["step"]], m["tokens_per_s"])
        if m.get("peak_rss_bytes") is not None:
            assert _close(scalars["peak_rss_bytes"][m["step"]], m["peak_rss_bytes"])
    val = {m["step"]: m["val_loss"] for m in metrics if m.get("val_loss") is not None}
    assert val and {s: scalars["val_loss"][s] for s in val} == pytest.approx(val, rel=1e-6)
    summary = read_summary(run)
    assert _close(scalars["summary/final_loss"][4], summary["final_loss"])
    # The config as hparams: the hparams plugin's experiment record lists every key.
    from tensorboard.plugins.hparams import plugin_data_pb2

    content = events.PluginTagToContent("hparams")
    data = plugin_data_pb2.HParamsPluginData.FromString(content["_hparams_/session_start_info"])
    hparams = dict(data.session_start_info.hparams)
    assert hparams["train.steps"].number_value == 4
    assert hparams["tracking.backends"].string_value == "['tensorboard', 'mlflow']"
    assert SECRET not in str(data)


def test_mlflow_store_holds_the_metrics_and_the_config(run: Path) -> None:
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{run / 'mlflow.db'}")
    run_id = (run / "mlflow_run_id.txt").read_text().strip()
    got = client.get_run(run_id)
    assert got.info.status == "FINISHED" and got.info.run_name == run.name
    metrics = read_metrics(run)
    history = {m.step: m.value for m in client.get_metric_history(run_id, "loss")}
    assert history == pytest.approx({m["step"]: m["loss"] for m in metrics}, rel=1e-6)
    val = {m.step: m.value for m in client.get_metric_history(run_id, "val_loss")}
    assert val == pytest.approx(
        {m["step"]: m["val_loss"] for m in metrics if m.get("val_loss") is not None}, rel=1e-6
    )
    tokens = client.get_metric_history(run_id, "tokens_per_s")
    assert len(tokens) == len(metrics)
    params = got.data.params
    assert params["train.steps"] == "4" and params["derived.world_size"] == "1"
    assert SECRET not in str(params) and "wandb.name" in params


def test_only_the_named_trackers_run(run: Path) -> None:
    assert not (run / "wandb").exists()  # wandb left out of tracking.backends: not started


def test_a_missing_package_names_the_extra(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setitem(sys.modules, "tensorboard", None)  # what an install without [tracking] has
    proc = run_launch(
        ["train", *FAST, "train.steps=1", "tracking.backends=[tensorboard]"],
        tmp_path / "run",
        check=False,
        in_process=True,
    )
    assert proc.returncode != 0
    lines = [line for line in proc.stderr.splitlines() if "tracking.backends" in line]
    assert len(lines) == 1 and "pip install 'launcher[tracking]'" in lines[0], proc.stderr
    assert not (tmp_path / "run" / "metrics.jsonl").exists()


def test_an_unknown_backend_is_one_error_naming_the_key(tmp_path: Path) -> None:
    proc = run_launch(
        ["plan", *FAST, "tracking.backends=[wandb,neptune]"], tmp_path / "run", check=False
    )
    assert proc.returncode != 0
    errors = [line for line in proc.stderr.splitlines() if "tracking.backends" in line]
    assert len(errors) == 1 and "unknown value 'neptune'" in errors[0], proc.stderr
    assert "wandb, tensorboard, mlflow" in errors[0]
