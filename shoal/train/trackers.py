"""Experiment trackers beside the run's own log files: Weights & Biases (``run.wandb``) and
MLflow (``run.mlflow``). Each logs every metric the training loop logs, the run's config, and
at the end the config file and the final checkpoint as artifacts."""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from shoal.train.logger import Logger, scalar


def make_trackers(
    run_dir: Path, config: dict[str, Any], wandb: str | None = None, mlflow: str | None = None
) -> list[Logger]:
    """The trackers a run's settings ask for (``run.wandb`` project, ``run.mlflow`` URI)."""
    trackers: list[Logger] = []
    if wandb:
        trackers.append(WandbLogger(wandb, run_dir, config))
    if mlflow is not None:
        trackers.append(MlflowLogger(mlflow, run_dir, config))
    return trackers


class WandbLogger:
    """Weights & Biases (Biewald 2020): the run's metrics, its config, and at the end the
    config file and the final checkpoint as an artifact. Offline (files under
    ``run_dir/wandb``, ``wandb sync`` uploads them later) unless ``WANDB_MODE`` or an API key
    says otherwise, so it works without a network."""

    def __init__(self, project: str, run_dir: Path, config: dict[str, Any]) -> None:
        try:
            import wandb
        except ImportError:
            raise ImportError(
                "--run.wandb needs Weights & Biases: pip install 'shoal[wandb]'"
            ) from None
        self.wandb = wandb
        online: Any = os.environ.get("WANDB_MODE") or ("online" if os.environ.get("WANDB_API_KEY")
                                                       else "offline")  # fmt: skip
        self.run = wandb.init(
            project=project, name=run_dir.name, dir=str(run_dir), config=config, mode=online,
            id=run_dir.name.replace("/", "-")[-64:], resume="allow", reinit="finish_previous",
        )  # fmt: skip

    def log(self, metrics: Mapping[str, float], step: int) -> None:
        self.run.log({k: scalar(v) for k, v in metrics.items()}, step=int(step))

    def artifacts(self, config: Path, checkpoint: Path | None) -> None:
        artifact = self.wandb.Artifact(f"{self.run.name}-checkpoint", type="model")
        artifact.add_file(str(config))
        if checkpoint is not None:
            artifact.add_dir(str(checkpoint), name="checkpoint")
        self.run.log_artifact(artifact)

    def close(self) -> None:
        self.run.finish()


class MlflowLogger:
    """MLflow tracking: the run's metrics and config (flattened, as parameters), and at the
    end the config file and the final checkpoint as artifacts. ``uri`` ``local`` keeps the
    runs beside the run directory (``mlflow.db``, a SQLite store, and ``mlartifacts/``;
    ``mlflow ui --backend-store-uri sqlite:///.../mlflow.db`` shows them); any tracking URI
    works."""

    def __init__(self, uri: str, run_dir: Path, config: dict[str, Any]) -> None:
        try:
            import mlflow
        except ImportError:
            raise ImportError("--run.mlflow needs MLflow: pip install 'shoal[mlflow]'") from None
        self.mlflow = mlflow
        name = run_dir.parent.name or "shoal"
        mlflow.set_tracking_uri(uri)
        if uri in ("", "local"):  # a SQLite store and an artifact folder beside the run
            store = run_dir.parent.resolve()
            mlflow.set_tracking_uri(f"sqlite:///{store / 'mlflow.db'}")
            if mlflow.get_experiment_by_name(name) is None:
                mlflow.create_experiment(name, artifact_location=(store / "mlartifacts").as_uri())
        mlflow.set_experiment(name)
        self.run = mlflow.start_run(run_name=run_dir.name)
        flat = _flatten(config)
        for start in range(0, len(flat), 100):  # MLflow takes parameters in batches
            mlflow.log_params(dict(list(flat.items())[start : start + 100]))

    def log(self, metrics: Mapping[str, float], step: int) -> None:
        values = {k.replace("/", "."): float(scalar(v)) for k, v in metrics.items()}
        self.mlflow.log_metrics({k: v for k, v in values.items() if math.isfinite(v)}, step=step)

    def artifacts(self, config: Path, checkpoint: Path | None) -> None:
        self.mlflow.log_artifact(str(config))
        if checkpoint is not None:
            self.mlflow.log_artifacts(str(checkpoint), artifact_path="checkpoint")

    def close(self) -> None:
        self.mlflow.end_run()


def _flatten(config: Mapping[str, Any], prefix: str = "") -> dict[str, str]:
    out: dict[str, str] = {}
    for key, value in config.items():
        if isinstance(value, Mapping):
            out.update(_flatten(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = str(value)[:500]
    return out
