"""DD-PPO: gradient averaging across processes equals single-process PPO on the whole batch;
config validation; Ray learners (smoke, identical replicas, exact resume); NaN losses; a
fixed-seed learning test."""

import math
import socket
from datetime import timedelta

import gymnasium as gym
import numpy as np
import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from state_helpers import assert_states_equal, metric_rows

import shoal
from shoal.algos.cores.rollout_batch import RolloutBatch
from shoal.algos.policy_gradient.ddppo import (
    DDPPO,
    DDPPOConfig,
    PPOBlock,
    RankResult,
    equal_size,
    synchronize,
)
from shoal.algos.policy_gradient.ppo import PPOConfig, PPOLearner
from shoal.collect.evaluate import evaluate
from shoal.config import EnvConfig, ModelConfig, RenamedFieldWarning, RunConfig, replace
from shoal.core.errors import ConfigError, DistributedError, NaNLossError
from shoal.core.types import EpisodeStats
from shoal.distributed.collective import agree_finite
from shoal.train.checkpoint import load_checkpoint

N = 32  # samples in the fixed batch; each of two ranks gets half
SPACES = (gym.spaces.Box(-1.0, 1.0, (4,)), gym.spaces.Discrete(2))
LR, CLIP = 0.05, 0.2


def fixed_batch():
    g = torch.Generator().manual_seed(3)
    return RolloutBatch(
        obs=torch.randn(N, 4, generator=g),
        actions=torch.randint(0, 2, (N,), generator=g),
        log_probs=torch.log(torch.full((N,), 0.5)) + 0.3 * torch.randn(N, generator=g),
        values=torch.randn(N, generator=g),
        advantages=torch.randn(N, generator=g),
        returns=torch.randn(N, generator=g),
    )


def make_learner(minibatch_size):
    """PPO's learner with one epoch of one minibatch, no advantage normalization (so the
    loss of the whole batch is the mean of the losses of its halves), gradient clipping on;
    the same initial weights in every process."""
    config = PPOConfig(
        env=EnvConfig(num_envs=4),
        model=ModelConfig(hidden=(8,)),
        num_steps=8,
        num_epochs=1,
        minibatch_size=minibatch_size,
        normalize_advantages=False,
        ent_coef=0.01,
    )
    torch.manual_seed(0)
    return PPOLearner(config, *SPACES)


def _rank_main(rank, port, out_dir):
    """One of two gloo processes over localhost: half the batch, one synchronized step."""
    torch.set_num_threads(1)
    # A short timeout: a rank that fails must not leave the other waiting gloo's 30 minutes.
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2,
        timeout=timedelta(seconds=60),
    )  # fmt: skip
    try:
        learner = make_learner(N // 2)
        synchronize(learner, world_size=2)
        half = fixed_batch().map(lambda x: x[rank * N // 2 : (rank + 1) * N // 2])
        learner.update(half, LR, CLIP, kl_coeff=0.0)
        # Batches of 6 and 5 samples are cut to the smaller size on both ranks.
        sized = equal_size(fixed_batch().map(lambda x: x[: 6 - rank]))
        # A non-finite loss on rank 1 only stops both ranks, before any backward pass.
        value = torch.tensor(float("nan") if rank == 1 else 1.0, requires_grad=True)
        try:
            agree_finite({"value": value, "total": value * 2}, "a DD-PPO learner")
            nan_error = None
        except NaNLossError as exc:
            nan_error = str(exc)
        torch.save(
            {
                "grads": [p.grad for p in learner.parameters],
                "weights": learner.model.state_dict(),
                "equal_size": sized.obs.shape[0],
                "nan_error": nan_error,
            },
            f"{out_dir}/rank{rank}.pt",
        )
    finally:
        dist.destroy_process_group()


def free_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_two_processes_match_single_process_gradients(tmp_path):
    """Two processes with half a batch each, gradients all-reduced: the averaged gradient is
    the single-process gradient of the loss on the whole batch (clipped after averaging), and
    one optimizer step leaves both replicas identical and equal to the single-process step."""
    # fork: the children start with shoal already imported (spawning re-imports it, seconds).
    args = (free_port(), str(tmp_path))
    mp.start_processes(_rank_main, args=args, nprocs=2, join=True, start_method="fork")
    ranks = [torch.load(tmp_path / f"rank{r}.pt", weights_only=True) for r in range(2)]

    single = make_learner(N)
    single.update(fixed_batch(), LR, CLIP, 0.0)
    for r in ranks:
        for got, parameter in zip(r["grads"], single.parameters, strict=True):
            torch.testing.assert_close(got, parameter.grad, rtol=1e-5, atol=1e-7)
        for name, tensor in single.model.state_dict().items():
            torch.testing.assert_close(r["weights"][name], tensor, rtol=1e-5, atol=1e-7)
    for name, tensor in ranks[0]["weights"].items():
        assert torch.equal(tensor, ranks[1]["weights"][name]), name
    assert [r["equal_size"] for r in ranks] == [5, 5]
    assert "a loss on a DD-PPO learner" in ranks[0]["nan_error"]
    assert "loss/value became nan" in ranks[1]["nan_error"]


@pytest.mark.parametrize(
    ("changes", "match"),
    [
        ({"num_learners": 0}, "DDPPOConfig.num_learners"),
        ({"run": RunConfig(runners=2)}, "DDPPOConfig.run.*num_learners"),
        ({"ppo.num_epochs": 0}, "PPOConfig.num_epochs"),
        ({"ppo.clip_eps": -0.1}, "PPOConfig.clip_eps"),
        # The rollout of one learner is ppo.num_steps x the top-level env's num_envs.
        ({"ppo.minibatch_size": 4096}, "DDPPOConfig.ppo.minibatch_size.*= 1024"),
        ({"ppo.model": ModelConfig(lstm_hidden=8)}, "PPOConfig.model"),
        ({"ppo.kl_coeff": 0.2}, "kl_coeff"),
        ({"ppo.target_kl": 0.01}, "target_kl"),
        ({"ppo.model.backend": "numpy"}, "backend"),
        ({"ppo.env": EnvConfig(num_envs=3)}, "set run and env at the top level"),
        ({"env": EnvConfig(normalize_obs=True)}, "DDPPOConfig.env.*separate statistics"),
    ],
)
def test_config_validation(changes, match):
    with pytest.raises(ConfigError, match=match):
        replace(DDPPOConfig(), **changes)


def test_learner_config_is_the_ppo_block_with_the_run_and_env():
    config = DDPPOConfig(
        env=EnvConfig(num_envs=64),
        ppo=PPOBlock(num_steps=16, num_epochs=3, minibatch_size=1024, clip_eps=0.1, gamma=0.9),
    )
    ppo = config.learner_config()
    assert type(ppo) is PPOConfig
    assert (ppo.num_steps, ppo.num_epochs, ppo.minibatch_size) == (16, 3, 1024)
    assert (ppo.clip_eps, ppo.gamma, ppo.env, ppo.run) == (0.1, 0.9, config.env, config.run)
    assert ppo.target_kl is None and ppo.kl_coeff == 0.0  # per-rank early stops would deadlock


def test_old_flat_fields_and_flags_land_in_the_ppo_block():
    with pytest.warns(RenamedFieldWarning) as caught:
        config = replace(DDPPOConfig(), num_steps=64, **{"optim.lr": 0.01})
    assert config.ppo.num_steps == 64 and config.ppo.optim.lr == 0.01
    assert len(caught) == 2
    with pytest.warns(RenamedFieldWarning) as caught:
        config = shoal.config.from_dict(DDPPOConfig, {"minibatch_size": 64, "optim": {"lr": 0.1}})
    assert "config field 'minibatch_size' is now 'ppo.minibatch_size'" in str(caught[0].message)
    assert config.ppo.minibatch_size == 64 and config.ppo.optim.lr == 0.1


def test_driver_raises_a_rank_nan_loss():
    """A rank that hit a NaN loss returns its message; the driver raises NaNLossError."""

    class Pool:
        def call_all(self, method, *args):
            no_episodes = EpisodeStats(np.zeros(0), np.zeros(0, np.int64))
            ok = RankResult({"loss/total": 1.0}, 8, no_episodes)
            return [ok, "loss/value became nan on a DD-PPO learner; weights left unchanged"]

    algo = DDPPO.__new__(DDPPO)
    algo.config, algo.pool, algo.env_steps = DDPPOConfig(), Pool(), 0
    algo._lockstep = algo.pool.call_all
    with pytest.raises(NaNLossError, match="loss/value"):
        algo.train_iteration()


def small(**extra):
    overrides = {
        "env.num_envs": 4,
        "ppo.num_steps": 16,
        "ppo.minibatch_size": 32,
        "ppo.num_epochs": 2,
        "ppo.model.hidden": (16,),
        "run.eval_every_steps": 0,
        "run.checkpoint_every_steps": 0,
        "run.console": False,
        "run.tensorboard": False,
    }
    overrides.update(extra)
    return overrides


ITERATION_STEPS = 2 * 4 * 16  # 2 learners x 4 envs x 16 steps


def test_ray_learners_stay_identical_and_a_lost_learner_stops_the_run(ray_session):
    config = shoal.api.build_config("ddppo", seed=1, **small())
    algo = DDPPO(config)
    try:
        for _ in range(2):
            metrics = algo.train_iteration()
        assert algo.env_steps == 2 * ITERATION_STEPS and algo.iteration == 2
        for key in ("loss/policy", "loss/value", "loss/total", "train/approx_kl"):
            assert math.isfinite(metrics[key]), key
        rank0, rank1 = algo.pool.call_all("get_weights")
        for name, tensor in rank0.items():
            assert torch.equal(tensor, rank1[name]), name
        env = shoal.make_env("CartPole-v1", num_envs=3)
        actions = algo.policy().act(env.reset(seed=1))
        assert actions.shape == (3,) and all(env.action_space.contains(a) for a in actions)
        env.close()
        # The others cannot go on without a rank: the run stops with a clear error.
        algo.pool.kill(1)
        with pytest.raises(DistributedError, match="learner 1 failed.*[Rr]esume"):
            algo.train_iteration()
    finally:
        algo.close()


def test_resume_is_exact(forked_learners, tmp_path):
    """Synchronous and seeded per rank, DD-PPO is deterministic: a resumed run (learner
    state, each rank's envs and torch generator restored) repeats the straight one. (Its
    ranks forked from the test, tests/forked_ray.py; on Ray: the lost-learner test above.)"""
    total = 4 * ITERATION_STEPS
    overrides = small(**{"ppo.optim.lr_schedule": "linear", "ppo.optim.anneal_steps": total})
    run_a, run_b = str(tmp_path / "a"), str(tmp_path / "b")
    part = shoal.train("ddppo", seed=2, total_steps=total // 2, run_dir=run_a, **overrides)
    resumed = shoal.train(resume=part.run_dir, total_steps=total)
    straight = shoal.train("ddppo", seed=2, total_steps=total, run_dir=run_b, **overrides)
    assert resumed.env_steps == straight.env_steps == total and resumed.iterations == 4
    got, want = load_checkpoint(resumed.run_dir).state, load_checkpoint(straight.run_dir).state
    assert len(got["algorithm"]["ranks"]) == 2
    assert_states_equal(got["algorithm"], want["algorithm"])
    assert metric_rows(resumed.run_dir) == metric_rows(straight.run_dir)


def test_tuned_example_builds():
    config = shoal.registry.find_tuned("ddppo-cartpole").build_config()
    assert isinstance(config, DDPPOConfig) and config.num_learners == 2
    assert config.run.target_return == 475 and config.learner_config().minibatch_size == 1024


@pytest.mark.learning
def test_learns_cartpole_with_two_learners(forked_learners, tmp_path):
    """The tuned example with 2 learners, seed 0, reaches an evaluation mean of 475 on
    CartPole-v1 (49k-98k env steps on seeds 0-2, about 1 s of training)."""
    result = shoal.train(
        tuned="ddppo-cartpole",
        seed=0,
        run_dir=str(tmp_path / "run"),
        **{"run.console": False, "run.tensorboard": False},
    )
    assert result.solved and result.eval_return >= 475, result
    policy = shoal.load(result.run_dir)
    env = shoal.make_env("CartPole-v1", num_envs=20)
    metrics = evaluate(policy, env, seed=2024)
    env.close()
    assert metrics["eval/return"] >= 400, metrics
