"""The training loop drives algorithms whose iteration is not "step a vector env, update":
a population evaluated by whole episodes (evolution strategies) and a pass over a fixed
dataset (offline learners). Both go through `shoal.train.loop.run` unchanged: they stop at
``run.total_steps`` of their own progress counter, evaluate and checkpoint on its cadence,
stop at a target return, and resume exactly."""

from dataclasses import dataclass, field
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
from state_helpers import assert_states_equal, metric_rows

from shoal.config import EnvConfig, RunConfig
from shoal.train.checkpoint import load_checkpoint
from shoal.train.loop import run

QUIET = RunConfig(console=False, tensorboard=False, eval_episodes=4)


@dataclass(frozen=True)
class FamilyConfig:
    run: RunConfig = field(default_factory=lambda: QUIET)
    env: EnvConfig = field(default_factory=lambda: EnvConfig(id="CartPole-v1", num_envs=1))
    population: int = 6
    batch: int = 64


class LinearPolicy:
    """Deterministic actions ``argmax(obs / scale @ w)`` of a linear CartPole policy."""

    def __init__(self, weights: np.ndarray, scale: np.ndarray | float = 1.0):
        self.weights, self.scale = weights.copy(), scale

    def act(self, obs: np.ndarray, deterministic: bool = True) -> np.ndarray:
        return np.argmax(np.asarray(obs) / self.scale @ self.weights, axis=-1)


class PopulationSearch:
    """Random search over a linear policy: each iteration evaluates ``population`` perturbed
    copies by one whole episode each and keeps the best; no vector env is stepped by the
    loop, and an iteration's env steps vary with how long the episodes last."""

    def __init__(self, config: FamilyConfig):
        self.config = config
        self.env = gym.make("CartPole-v1")
        self.rng = np.random.default_rng(config.run.seed)
        self.weights = np.zeros((4, 2))
        self.best = -np.inf
        self.env_steps = self.iteration = 0

    def _episode(self, weights: np.ndarray) -> float:
        obs, _ = self.env.reset(seed=int(self.rng.integers(2**31)))
        total, done = 0.0, False
        while not done:
            obs, reward, terminated, truncated, _ = self.env.step(int(np.argmax(obs @ weights)))
            total, done = total + reward, terminated or truncated
            self.env_steps += 1
        return total

    def train_iteration(self) -> dict[str, float]:
        candidates = [self.weights + self.rng.normal(0, 0.5, (4, 2)) for _ in range(6)]
        scores = [self._episode(w) for w in candidates]
        best = int(np.argmax(scores))
        if scores[best] >= self.best:
            self.weights, self.best = candidates[best], scores[best]
        self.iteration += 1
        return {"train/best": float(self.best), "train/population_mean": float(np.mean(scores))}

    def policy(self) -> LinearPolicy:
        return LinearPolicy(self.weights)

    def state_dict(self) -> dict[str, Any]:
        return {
            "weights": self.weights,
            "best": float(self.best),
            "rng": self.rng.bit_generator.state,
            "counters": {"env_steps": self.env_steps, "iteration": self.iteration},
        }

    def load_state_dict(self, state: dict[str, Any]) -> bool:
        self.weights, self.best = np.asarray(state["weights"]), state["best"]
        self.rng.bit_generator.state = state["rng"]
        self.env_steps = state["counters"]["env_steps"]
        self.iteration = state["counters"]["iteration"]
        return True

    def close(self) -> None:
        self.env.close()


def expert_dataset(size: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """CartPole states and a scripted controller's actions (push toward where the pole
    falls), from the controller's own episodes."""
    env, rng = gym.make("CartPole-v1"), np.random.default_rng(seed)
    obs, _ = env.reset(seed=seed)
    states, actions = [], []
    while len(states) < size:
        action = int(obs[2] + 0.5 * obs[3] > 0) if rng.random() > 0.1 else int(rng.integers(2))
        states.append(obs)
        actions.append(action)
        obs, _, terminated, truncated, _ = env.step(action)
        if terminated or truncated:
            obs, _ = env.reset()
    env.close()
    return np.array(states), np.array(actions)


class DatasetPass:
    """Behaviour cloning of a logistic linear policy from a fixed dataset, one minibatch per
    iteration; its progress counter is the number of samples learned from (no env steps)."""

    def __init__(self, config: FamilyConfig):
        self.config = config
        self.obs, self.actions = expert_dataset(2000, seed=7)
        self.scale = self.obs.std(0)  # per-feature scale: the pole's angle is tiny beside speeds
        self.rng = np.random.default_rng(config.run.seed)
        self.weights = np.zeros((4, 2))
        self.env_steps = self.iteration = 0

    def train_iteration(self) -> dict[str, float]:
        index = self.rng.integers(len(self.obs), size=self.config.batch)
        x, y = self.obs[index] / self.scale, self.actions[index]
        logits = x @ self.weights
        p = np.exp(logits - logits.max(1, keepdims=True))
        p /= p.sum(1, keepdims=True)
        loss = -np.log(p[np.arange(len(y)), y] + 1e-12).mean()
        p[np.arange(len(y)), y] -= 1.0
        self.weights -= 0.5 * x.T @ p / len(y)
        self.env_steps += len(y)
        self.iteration += 1
        return {"loss/bc": float(loss)}

    def policy(self) -> LinearPolicy:
        return LinearPolicy(self.weights, self.scale)

    def state_dict(self) -> dict[str, Any]:
        return {
            "weights": self.weights,
            "rng": self.rng.bit_generator.state,
            "counters": {"env_steps": self.env_steps, "iteration": self.iteration},
        }

    def load_state_dict(self, state: dict[str, Any]) -> bool:
        self.weights = np.asarray(state["weights"])
        self.rng.bit_generator.state = state["rng"]
        self.env_steps = state["counters"]["env_steps"]
        self.iteration = state["counters"]["iteration"]
        return True

    def close(self) -> None:
        pass


@dataclass(frozen=True)
class Spec:
    name: str
    algorithm_cls: Any
    backends: tuple[str, ...] = ("auto", "torch")
    runners: bool = False
    prepare: Any = None
    acts_jointly: bool = False
    own_spaces: bool = False
    extra_evaluation: bool = False

    def unit(self, config: Any) -> str:
        return "env step"

    def default_config(self) -> Any:
        return FamilyConfig()


FAMILIES = {
    "population": Spec("population", PopulationSearch),
    "dataset": Spec("dataset", DatasetPass),
}


def config(tmp_path, name: str, **run: Any) -> FamilyConfig:
    settings = {"run_dir": str(tmp_path / name), "eval_every_steps": 1000, **run}
    return FamilyConfig(run=RunConfig(**{**QUIET.__dict__, **settings}))


@pytest.mark.parametrize("family", list(FAMILIES))
def test_the_loop_stops_evaluates_and_checkpoints_on_the_algorithms_own_counter(family, tmp_path):
    spec = FAMILIES[family]
    result = run(spec, config(tmp_path, "a", total_steps=3000, checkpoint_every_steps=1000))
    assert result.stop_reason == "total_steps" and result.env_steps >= 3000
    assert result.eval_step == result.env_steps and result.eval_return is not None
    rows = metric_rows(result.run_dir)
    evaluated = [row["step"] for row in rows if "eval/return" in row]
    due, expected = 1000, []
    for row in rows:  # the first iteration at or past each multiple of 1000 evaluates
        if row["step"] >= due:
            expected.append(row["step"])
            due = (row["step"] // 1000 + 1) * 1000
    assert evaluated == expected and len(evaluated) >= 2
    saved = sorted(int(p.name[5:]) for p in (result.run_dir / "checkpoints").glob("step_*"))
    assert saved[-1] == result.env_steps and 1 <= len(saved) <= 3  # keep_checkpoints
    assert load_checkpoint(result.run_dir).meta["env_steps"] == result.env_steps


@pytest.mark.parametrize("family", list(FAMILIES))
def test_the_loop_resumes_them_exactly(family, tmp_path):
    spec = FAMILIES[family]
    part = run(spec, config(tmp_path, "part", total_steps=1500, checkpoint_every_steps=500))
    whole = config(tmp_path, "part", total_steps=3000, checkpoint_every_steps=500)
    resumed = run(spec, whole, resume=load_checkpoint(part.run_dir))
    straight = run(spec, config(tmp_path, "straight", total_steps=3000, checkpoint_every_steps=500))
    assert resumed.resumed_from == part.env_steps and resumed.env_steps == straight.env_steps
    got = load_checkpoint(resumed.run_dir).state["algorithm"]
    assert_states_equal(got, load_checkpoint(straight.run_dir).state["algorithm"])
    assert metric_rows(resumed.run_dir) == metric_rows(straight.run_dir)


@pytest.mark.parametrize("family", list(FAMILIES))
def test_they_learn_cartpole_through_the_loop_and_stop_at_the_target(family, tmp_path):
    """A target a random linear policy does not reach (its CartPole return is about 20)."""
    spec = FAMILIES[family]
    result = run(
        spec, config(tmp_path, "t", total_steps=60_000, target_return=195.0, eval_every_steps=500)
    )
    assert result.stop_reason == "target_return" and result.eval_return >= 195.0
    assert result.env_steps < 60_000
