"""AlphaZero's and MuZero's learner groups (`shoal.algos.planning.learners`): two gloo
processes, each updating on its rows of a batch (MuZero's unrolls cut along the batch axis of
their time-major targets) with the gradients all-reduced, take the update one learner takes
on the whole batch: the same weights, optimizer state, metrics and (MuZero) new priorities in
the batch's order. No Ray: the ranks are forked processes over localhost."""

import functools

import gymnasium as gym
import numpy as np
import pytest
import torch
from gloo_ranks import on_two_ranks

from shoal.algos.cores.group_shares import ReplayShare, share
from shoal.algos.planning import alphazero, muzero
from shoal.algos.planning.learners import (
    AlphaZeroLearner,
    MuZeroLearner,
    learner_of,
    unroll_rows,
)
from shoal.config import ModelConfig, OptimConfig
from shoal.data.positions import Positions
from shoal.data.trajectories import Unroll

B, K, A = 45, 3, 9  # rows (22 and 23 for the two ranks), unroll steps, actions
UPDATES = 3


def positions(seed):
    g = torch.Generator().manual_seed(seed)
    legal = torch.rand(B, A, generator=g) < 0.7
    legal[:, 0] = True
    policy = torch.rand(B, A, generator=g) * legal
    return Positions(
        obs=torch.randn(B, 4, 3, 3, generator=g),
        legal=legal,
        policy=policy / policy.sum(1, keepdim=True),
        outcome=torch.randint(-1, 2, (B,), generator=g).float(),
    )


def unrolls(seed):
    g = torch.Generator().manual_seed(seed)
    masks = torch.rand(K + 1, B, generator=g) < 0.9
    policy = torch.rand(K + 1, B, 2, generator=g)
    return Unroll(
        obs=torch.randn(B, 4, generator=g),
        actions=torch.randint(0, 2, (K, B), generator=g),
        target_value=3 * torch.randn(K + 1, B, generator=g),
        target_reward=torch.rand(K, B, generator=g),
        target_policy=policy / policy.sum(-1, keepdim=True),
        value_mask=masks,
        reward_mask=masks[1:],
        policy_mask=masks,
        weights=0.5 + torch.rand(B, generator=g),
        indices=np.arange(B),
    )


def make(name):
    """A small learner, the same initial weights in every process."""
    torch.manual_seed(0)
    model = ModelConfig(hidden=(16,))
    optim = OptimConfig(lr=0.01, max_grad_norm=0.5)
    if name == "alphazero":
        config = alphazero.AlphaZeroConfig(model=model, optim=optim, channels=8)
        spaces = (gym.spaces.Box(-1, 1, (4, 3, 3)), gym.spaces.Discrete(A))
        return learner_of(AlphaZeroLearner, alphazero.build_model, config, *spaces)
    config = muzero.MuZeroConfig(model=model, optim=optim, unroll_steps=K, latent=8)
    spaces = (gym.spaces.Box(-1, 1, (4,)), gym.spaces.Discrete(2))
    return learner_of(MuZeroLearner, muzero._network, config, *spaces)


BATCHES = {"alphazero": positions, "muzero": unrolls}


def _rank(rank, name):
    learner = make(name)
    cut = {"muzero": {"cut": unroll_rows}}.get(name, {})
    split = functools.partial(ReplayShare, **cut)(learner, rank, 2)
    results = [split.update((BATCHES[name](k), [("set_lr", (0.02,))])) for k in range(UPDATES)]
    return {"state": learner.state_dict(), "results": results}


@pytest.mark.parametrize("name", ["alphazero", "muzero"])
def test_two_search_learners_take_the_update_of_one(name, tmp_path):
    ranks = on_two_ranks(_rank, tmp_path, name)
    single = make(name)
    single.set_lr(0.02)
    expected = [single.update(BATCHES[name](k)) for k in range(UPDATES)]
    for key, tensor in single.model.state_dict().items():
        got = [rank["state"]["model"][key] for rank in ranks]
        assert torch.equal(got[0], got[1]), key
        torch.testing.assert_close(got[0], tensor, rtol=1e-4, atol=1e-5)
    assert not torch.equal(next(make(name).model.parameters()), next(single.model.parameters()))
    assert ranks[0]["state"]["grad_steps"] == UPDATES
    weights = [(share(B, r, 2).stop - share(B, r, 2).start) / B for r in range(2)]
    for k, (parts, priorities) in enumerate(expected):
        results = [rank["results"][k] for rank in ranks]
        assert [w for w, _, _ in results] == weights
        for key, value in parts.items():
            got = sum(w * r[key] for w, r, _ in results)
            assert float(got) == pytest.approx(float(value), rel=1e-4, abs=1e-6), key
        if name == "muzero":  # the first position's value errors, in the batch's order
            joined = torch.cat([p for _, _, p in results])
            torch.testing.assert_close(joined, priorities, rtol=1e-4, atol=1e-5)
        else:
            assert priorities is None and all(p is None for _, _, p in results)


def test_unrolls_are_cut_along_their_batch_axis():
    batch = unrolls(0)
    rows = unroll_rows(batch, slice(5, 9))
    assert rows.obs.shape == (4, 4) and rows.weights.shape == (4,)
    assert rows.actions.shape == (K, 4) and rows.target_policy.shape == (K + 1, 4, 2)
    torch.testing.assert_close(rows.target_value, batch.target_value[:, 5:9])
    np.testing.assert_array_equal(rows.indices, np.arange(5, 9))
