"""Experiment trackers beside TensorBoard: a run with ``run.wandb`` (offline, no network)
and ``run.mlflow`` (a local SQLite store) holds the metrics the loop logs, the config, and the
final checkpoint as an artifact; a missing tracker package is a clear error before training."""

import importlib.util

import pytest

import shoal
from shoal.core.errors import ConfigError

QUIET = {
    "run.console": False, "run.tensorboard": False, "run.eval_every_steps": 256,
    "run.eval_episodes": 2, "num_steps": 32, "env.num_envs": 4, "minibatch_size": 64,
}  # fmt: skip
MLFLOW = importlib.util.find_spec("mlflow") is None
WANDB = importlib.util.find_spec("wandb") is None


@pytest.mark.skipif(
    importlib.util.find_spec("mlflow") is None, reason="pip install 'shoal[mlflow]'"
)
def test_mlflow_local_store_holds_metrics_config_and_checkpoint(tmp_path):
    result = shoal.train("ppo", env="CartPole-v1", total_steps=512, run_dir=str(tmp_path / "run"),
                         **{**QUIET, "run.mlflow": "local"})  # fmt: skip
    import mlflow

    mlflow.set_tracking_uri(f"sqlite:///{tmp_path / 'mlflow.db'}")
    [run] = mlflow.search_runs(experiment_names=[tmp_path.name], output_format="list")
    history = mlflow.MlflowClient().get_metric_history(run.info.run_id, "eval.return")
    assert [m.step for m in history][-1] == result.env_steps
    assert run.data.params["run.total_steps"] == "512"
    artifacts = mlflow.MlflowClient().list_artifacts(run.info.run_id, "checkpoint")
    assert {"meta.json", "state.pt"} <= {a.path.split("/")[-1] for a in artifacts}


@pytest.mark.skipif(WANDB, reason="pip install 'shoal[wandb]'")
def test_wandb_offline_run_holds_metrics_config_and_checkpoint(tmp_path, monkeypatch):
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.delenv("WANDB_MODE", raising=False)
    monkeypatch.setenv("WANDB_SILENT", "true")
    run_dir = tmp_path / "run"
    shoal.train("ppo", env="CartPole-v1", total_steps=512, run_dir=str(run_dir),
                **{**QUIET, "run.wandb": "shoal-tests"})  # fmt: skip
    import wandb

    # finish() returns before wandb's service process has flushed and closed the run's
    # transaction log; teardown waits for that (at process exit it happens on its own).
    wandb.teardown()
    [records] = list((run_dir / "wandb").glob("offline-run-*/*.wandb"))  # for `wandb sync`
    data = records.read_bytes()
    for recorded in (b"eval/return", b"loss/policy", b"total_steps", b"state.pt", b"meta.json"):
        assert recorded in data, recorded  # metrics, config, the final checkpoint's files


def test_a_missing_tracker_is_a_clear_error(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "wandb" else real(name, *a))  # fmt: skip
    with pytest.raises(ConfigError, match=r"pip install 'shoal\[wandb\]'"):
        shoal.build_config("ppo", **{"run.wandb": "project"})
