"""APPO: the sampler thread's fixed policy lag (counted), V-trace's correction on the hand-
computed data of the V-trace tests, exact resume (synchronous fallback and sampling ahead),
the same run whatever the threads' timing, config errors, Ray runners, and learning CartPole."""

import math
import random
import threading
import time

import pytest
import torch
from state_helpers import assert_states_equal, metric_rows

import shoal
from shoal.algos.policy_gradient.appo import APPOConfig, vtrace_batch
from shoal.collect.ahead import AheadSampler
from shoal.config import replace
from shoal.core.errors import ConfigError
from shoal.core.types import EpisodeStats, Rollout
from shoal.train.checkpoint import load_checkpoint

QUIET = {"run.console": False, "run.tensorboard": False}
SMALL = {
    **QUIET, "env.num_envs": 4, "ppo.num_steps": 16, "ppo.minibatch_size": 32,
    "ppo.num_epochs": 2, "ppo.model.hidden": (16,), "run.eval_every_steps": 64,
    "run.eval_episodes": 2, "run.checkpoint_every_steps": 64, "env.max_episode_steps": 30,
}  # fmt: skip
ITERATION = 64  # env steps per iteration of SMALL


class CountingSampler:
    """A sampler whose rollouts record the weight version they acted with; it sleeps a
    random while per rollout so that the threads interleave differently every time."""

    last_restarted = ()  # no runner restarts

    def __init__(self, seed):
        self.weights = None
        self.acted = []
        self.random = random.Random(seed)
        self.thread = None

    def set_weights(self, weights):
        self.weights = {k: v.clone() for k, v in weights.items()}

    def sample(self):
        self.thread = threading.current_thread()
        time.sleep(self.random.random() * 0.004)
        version = int(self.weights["version"])
        self.acted.append(version)
        zeros = torch.zeros(1, 1)
        rollout = Rollout(zeros, zeros, zeros, zeros, zeros, zeros.bool(), zeros.bool(),
                          zeros.bool(), torch.zeros(1))  # fmt: skip
        return rollout, EpisodeStats(torch.zeros(0).numpy(), torch.zeros(0).numpy())


@pytest.mark.parametrize("max_lag", [1, 2, 3])
def test_the_sampler_never_acts_with_weights_older_than_the_lag(max_lag):
    sampler = CountingSampler(max_lag)
    ahead = AheadSampler(sampler, max_lag)
    ahead.publish(0, {"version": torch.tensor(0)})
    for n in range(40):  # the learner: take rollout n, "update", publish version n + 1
        item = ahead.take(n)
        assert item.index == n and item.version == max(0, n - max_lag)
        assert sampler.acted[n] == item.version  # what the sampler really acted with
        time.sleep(random.random() * 0.004)
        ahead.publish(n + 1, {"version": torch.tensor(n + 1)})
    ahead.stop()
    assert sampler.thread is not threading.current_thread()  # it sampled in its own thread
    assert all(n - v <= max_lag for n, v in enumerate(sampler.acted))
    assert len(ahead.ready) <= max_lag + 1  # sampled ahead, not beyond what the lag allows


@pytest.mark.parametrize("max_lag", [1, 2])
def test_a_stop_samples_exactly_what_the_published_versions_allow(max_lag):
    """What is sampled ahead at a checkpoint depends on the versions, never on timing: after
    rollout n is taken and version n + 1 published, a stop leaves rollouts n + 1 to
    n + 1 + max_lag sampled, and the state names the next one."""
    for trial in range(5):
        ahead = AheadSampler(CountingSampler(trial), max_lag)
        ahead.publish(0, {"version": torch.tensor(0)})
        for n in range(3):
            ahead.take(n)
            ahead.publish(n + 1, {"version": torch.tensor(n + 1)})
        ahead.stop()
        assert [a.index for a in ahead.ready] == list(range(3, 4 + max_lag))
        assert ahead.get_state()["next_index"] == 4 + max_lag


def test_an_error_in_the_sampler_thread_reaches_the_learner():
    class Broken(CountingSampler):
        def sample(self):
            raise RuntimeError("env died")

    ahead = AheadSampler(Broken(0), 1)
    ahead.publish(0, {"version": torch.tensor(0)})
    with pytest.raises(RuntimeError, match="env died"):
        ahead.take(0)


class TableModel(torch.nn.Module):
    """Returns the policy log-probabilities and values of a table, looked up by observation
    (the observation is the row's index)."""

    def __init__(self, log_probs, values):
        super().__init__()
        self.log_probs, self.values = log_probs.flatten(), values.flatten()

    def forward(self, obs, action_mask=None):
        index = obs[:, 0].long()
        log_probs = self.log_probs

        class Table:
            def log_prob(self, actions):
                return log_probs[index]

        return Table(), self.values[index]


def test_vtrace_correction_on_the_vtrace_tests_hand_computed_data():
    """The hand-computed case of tests/losses/test_vtrace.py (gamma 0.5) laid out as a
    rollout: column 0 as there (ratios 2, then 0.5; bootstrap 4 at the rollout's end);
    columns 1 and 2 end at t = 0 (terminated; truncated with a final observation worth 6),
    so their t = 1 is the autoreset step, whose observation is the final one and which the
    batch leaves out. Expected, as there: vs 2.5, 3 | 1 | 4; advantages 1.5, 1 | 0 | 3.
    The ratios are to the current network's policy; the batch's log-probs and values are
    the current network's too."""
    log = math.log
    target = torch.tensor([[log(2.0), log(0.5), 0.0], [log(0.5), 0.0, 0.0]])
    values = torch.tensor([[1.0, 1.0, 1.0], [2.0, 5.0, 6.0]])
    model = TableModel(target, values)
    obs = torch.arange(6, dtype=torch.float32).reshape(2, 3, 1)
    rollout = Rollout(
        obs=obs, actions=torch.zeros(2, 3, dtype=torch.long), log_probs=torch.zeros(2, 3),
        values=torch.full((2, 3), 99.0),  # the behaviour's values: V-trace uses the current
        rewards=torch.tensor([[1.0, 1.0, 1.0], [2.0, 0.0, 0.0]]),
        terminated=torch.tensor([[False, True, False], [False, False, False]]),
        truncated=torch.tensor([[False, False, True], [False, False, False]]),
        valid=torch.tensor([[True, True, True], [True, False, False]]),
        last_values=torch.tensor([4.0, 0.0, 0.0]),
    )  # fmt: skip
    ppo = replace(APPOConfig().ppo, gamma=0.5, gae_lambda=1.0)
    config = APPOConfig(ppo=ppo, correction="vtrace")
    batch = vtrace_batch(model, rollout, config, torch.device("cpu"))
    # valid steps in time-major order: (0,0), (0,1), (0,2), (1,0)
    torch.testing.assert_close(batch.returns, torch.tensor([2.5, 1.0, 4.0, 3.0]))
    torch.testing.assert_close(batch.advantages, torch.tensor([1.5, 0.0, 3.0, 1.0]))
    torch.testing.assert_close(batch.log_probs, torch.tensor([log(2.0), log(0.5), 0.0, log(0.5)]))
    torch.testing.assert_close(batch.values, torch.tensor([1.0, 1.0, 1.0, 2.0]))
    assert batch.obs.flatten().tolist() == [0.0, 1.0, 2.0, 3.0]


@pytest.mark.parametrize("max_lag", [0, 1])
def test_resume_is_exact(max_lag, tmp_path, capsys):
    """The synchronous fallback (lag 0) and sampling ahead (lag 1: the checkpoint holds the
    rollout sampled during the last update and the envs after it) both resume exactly."""
    overrides = {**SMALL, "max_lag": max_lag, "env.normalize_obs": True, "correction": "vtrace"}
    first, total = 3 * ITERATION, 5 * ITERATION
    part = shoal.train("appo", seed=3, total_steps=first, run_dir=str(tmp_path / "a"), **overrides)
    resumed = shoal.train(resume=part.run_dir, total_steps=total)
    straight = shoal.train("appo", seed=3, total_steps=total, run_dir=str(tmp_path / "b"),
                           **overrides)  # fmt: skip
    assert "could not be restored" not in capsys.readouterr().out
    assert resumed.env_steps == straight.env_steps == total
    got, want = load_checkpoint(resumed.run_dir).state, load_checkpoint(straight.run_dir).state
    assert_states_equal(got["algorithm"], want["algorithm"])
    assert metric_rows(resumed.run_dir) == metric_rows(straight.run_dir)
    lags = [row["train/policy_lag"] for row in metric_rows(straight.run_dir)
            if "train/policy_lag" in row]  # fmt: skip
    assert lags == [0] * max_lag + [max_lag] * (len(lags) - max_lag)


def test_sampling_ahead_gives_the_same_run_whatever_the_timing(tmp_path):
    runs = [shoal.train("appo", seed=5, total_steps=6 * ITERATION,
                        run_dir=str(tmp_path / str(i)), **SMALL) for i in range(2)]  # fmt: skip
    a, b = (load_checkpoint(r.run_dir).state["algorithm"] for r in runs)
    assert_states_equal(a, b)


def test_the_synchronous_fallback_with_the_clip_correction_is_ppo(tmp_path):
    """lag 0 and correction clip: PPO's loop and batch, so PPO's very run."""
    ppo_overrides = {k.replace("ppo.", ""): v for k, v in SMALL.items()}
    ppo = shoal.train("ppo", seed=2, total_steps=3 * ITERATION, run_dir=str(tmp_path / "p"),
                      **ppo_overrides)  # fmt: skip
    appo = shoal.train("appo", seed=2, total_steps=3 * ITERATION, run_dir=str(tmp_path / "a"),
                       max_lag=0, correction="clip", **SMALL)  # fmt: skip
    want = load_checkpoint(ppo.run_dir).state["algorithm"]["policy"]
    got = load_checkpoint(appo.run_dir).state["algorithm"]["policy"]
    assert_states_equal(got, want)


def test_config_errors():
    with pytest.raises(ConfigError, match="max_lag"):
        shoal.build_config("appo", max_lag=-1)
    with pytest.raises(ConfigError, match="recurrent"):
        shoal.build_config("appo", **{"ppo.model.lstm_hidden": 8})
    with pytest.raises(ConfigError, match="top level"):
        shoal.build_config("appo", **{"ppo.env.num_envs": 3})
    with pytest.raises(ConfigError, match="APPOConfig.ppo.minibatch_size"):
        shoal.build_config("appo", **{"ppo.minibatch_size": 10**6})
    with pytest.raises(ConfigError, match="vtrace_clip_rho_threshold"):
        shoal.build_config("appo", vtrace_clip_rho_threshold=0.0)


def test_ray_runners_sample_ahead(ray_session, tmp_path):
    result = shoal.train("appo", seed=1, total_steps=3 * ITERATION, run_dir=str(tmp_path / "r"),
                         **{**SMALL, "run.runners": 1, "env.num_envs": 4})  # fmt: skip
    assert result.env_steps == 3 * ITERATION
    lags = [row["train/policy_lag"] for row in metric_rows(result.run_dir)
            if "train/policy_lag" in row]  # fmt: skip
    assert lags[-1] == 1


@pytest.mark.learning
def test_appo_solves_cartpole(tmp_path):
    result = shoal.train(tuned="appo-cartpole", seed=0, run_dir=str(tmp_path / "run"), **QUIET)
    assert result.eval_return is not None and result.eval_return >= 475
    assert result.env_steps <= 150_000
