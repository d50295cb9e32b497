"""A learner group's gradient step (`shoal.algos.cores.learner_group.SplitStep`): two gloo
processes, each backpropagating its share of every minibatch, take the update one learner
takes on the whole minibatch. No Ray: the ranks are forked processes over localhost."""

from datetime import timedelta

import gymnasium as gym
import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from shoal.algos.cores.learner_group import SplitStep, share
from shoal.algos.cores.rollout_batch import RolloutBatch
from shoal.algos.policy_gradient.a2c import A2CConfig, A2CLearner
from shoal.algos.policy_gradient.ppo import PPOConfig, PPOLearner
from shoal.config import EnvConfig, ModelConfig, OptimConfig
from shoal.distributed.collective import free_port

N = 45  # samples in the batch: minibatches of 15, split 7 / 8 between the ranks
SPACES = (gym.spaces.Box(-1.0, 1.0, (4,)), gym.spaces.Discrete(3))


def fixed_batch():
    g = torch.Generator().manual_seed(3)
    return RolloutBatch(
        obs=torch.randn(N, 4, generator=g),
        actions=torch.randint(0, 3, (N,), generator=g),
        log_probs=torch.log(torch.full((N,), 1 / 3)) + 0.3 * torch.randn(N, generator=g),
        values=torch.randn(N, generator=g),
        advantages=2.0 + torch.randn(N, generator=g),  # standardizing them matters
        returns=torch.randn(N, generator=g),
    )


def make_learner(name):
    """PPO (two epochs of shuffled minibatches of 15, advantages standardized per minibatch,
    gradient clipping that binds) or A2C (one step on the whole batch, RMSprop-TF); the same
    initial weights in every process."""
    common = dict(
        env=EnvConfig(num_envs=5),
        model=ModelConfig(hidden=(16,), backend="torch"),
        optim=OptimConfig(lr=0.01, max_grad_norm=0.05),
        num_steps=9,
    )
    torch.manual_seed(0)
    if name == "ppo":
        config = PPOConfig(**common, num_epochs=2, minibatch_size=15, ent_coef=0.01)
        return PPOLearner(config, *SPACES)
    config = A2CConfig(**common, optimizer="rmsprop-tf", normalize_advantages=True)
    return A2CLearner(config, *SPACES)


def update(learner, name):
    """Two updates, minibatch orders from the process's torch generator (seeded alike)."""
    torch.manual_seed(7)
    rows = []
    for _ in range(2):
        if name == "ppo":
            rows.append(learner.update(fixed_batch(), 0.01, 0.2, kl_coeff=0.0))
        else:
            rows.append(learner.update(fixed_batch(), 0.01))
    return rows


def _rank_main(rank, name, port, out_dir):
    torch.set_num_threads(1)
    # A short timeout: a rank that fails must not leave the other waiting.
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2,
        timeout=timedelta(seconds=60),
    )  # fmt: skip
    try:
        learner = make_learner(name)
        learner.step = SplitStep(learner, rank, 2)
        rows = update(learner, name)
        torch.save({"weights": learner.model.state_dict(), "rows": rows}, f"{out_dir}/{rank}.pt")
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("name", ["ppo", "a2c"])
def test_two_learners_take_the_update_of_one(name, tmp_path):
    """The ranks' weights are equal to each other and to one learner's after its update on
    the whole batch (float tolerance: the sums are grouped differently), with unequal shares
    (7 and 8 of 15), advantages standardized over the whole minibatch, clipping after the
    all-reduce; the ranks' loss metrics average to the single learner's."""
    # fork: the children start with shoal already imported (spawning re-imports it, seconds).
    args = (name, free_port(), str(tmp_path))
    mp.start_processes(_rank_main, args=args, nprocs=2, join=True, start_method="fork")
    ranks = [torch.load(tmp_path / f"{r}.pt", weights_only=False) for r in range(2)]
    single = make_learner(name)
    rows = update(single, name)
    for key, tensor in single.model.state_dict().items():
        assert torch.equal(ranks[0]["weights"][key], ranks[1]["weights"][key]), key
        torch.testing.assert_close(ranks[0]["weights"][key], tensor, rtol=1e-5, atol=1e-6)
    # The weights moved: the comparison is not of two untouched models.
    initial = next(make_learner(name).model.parameters())
    assert not torch.equal(initial, next(single.model.parameters()))
    # Each rank's metrics are means over its share (PPO: 7 and 8 rows of every 15, A2C: 22
    # and 23 of 45): weighted by the shares they are the single learner's.
    size = 15 if name == "ppo" else N
    weights = [(share(size, r, 2).stop - share(size, r, 2).start) / size for r in range(2)]
    for key in ("loss/value", "loss/total"):
        weighted = sum(w * rank["rows"][0][key] for w, rank in zip(weights, ranks, strict=True))
        assert weighted == pytest.approx(rows[0][key], rel=1e-4, abs=1e-6), key


def test_shares_cover_the_rows_once():
    for size in (2, 7, 15, 64):
        for world in (1, 2, 3):
            if world > size:
                continue
            parts = [share(size, r, world) for r in range(world)]
            assert parts[0].start == 0 and parts[-1].stop == size
            assert all(a.stop == b.start for a, b in zip(parts, parts[1:], strict=False))
            assert max(p.stop - p.start for p in parts) - min(p.stop - p.start for p in parts) <= 1
