"""A replay learner group's update (`shoal.algos.cores.group_shares.ReplayShare`): two gloo
processes, each updating on its rows of the batch with the gradients all-reduced, take the
update one learner takes on the whole batch: the same weights, the same new priorities (in
the batch's order), the same metrics. No Ray: the ranks are forked processes over localhost.

SAC's reparameterized actions, TD3's (and TD3+BC's) target smoothing and CQL's sampled actions
draw noise per row, which a rank draws for its own rows only: with noise the group's update is
one learner's in distribution, not to the bit. Their comparison here draws no noise in either
(`without_noise`), which leaves every other part of their updates (three or four losses in one
step, clipping per network, the temperature, CQL's Lagrange multiplier) to be compared exactly."""

import gymnasium as gym
import numpy as np
import pytest
import torch
from gloo_ranks import on_two_ranks

import shoal
from shoal.algos.continuous.d4pg import D4PGLearner
from shoal.algos.continuous.ddpg import DDPGLearner
from shoal.algos.continuous.sac import SACLearner
from shoal.algos.continuous.td3 import TD3Learner
from shoal.algos.cores.group_shares import ReplayShare, SequenceShare, rows_of, share
from shoal.algos.multi_agent.maddpg import MADDPG, MADDPGLearner, maddpg_groups, state_dim
from shoal.algos.offline.bc import BCLearner
from shoal.algos.offline.cql import cql_learner
from shoal.algos.offline.iql import IQLLearner
from shoal.algos.offline.td3_bc import td3_bc_learner
from shoal.algos.value.dqn import DQNLearner
from shoal.algos.value.r2d2 import R2D2, R2D2Learner
from shoal.core.types import ReplayBatch
from shoal.registry import ALGORITHMS

N = 45  # rows in each batch: 22 and 23 for the two ranks
OBS = gym.spaces.Box(-1.0, 1.0, (4,))
CASES = {
    # name: (algorithm, action space, settings)
    "dqn-rainbow": ("dqn", gym.spaces.Discrete(3),
                    {"double_q": True, "dueling": True, "noisy": True, "value_head": "c51",
                     "target_update_every": 1, "tau": 0.5}),
    "qrdqn": ("qrdqn", gym.spaces.Discrete(3), {"optim.max_grad_norm": 0.05}),
    "rem": ("rem", gym.spaces.Discrete(3), {}),
    "ddpg": ("ddpg", gym.spaces.Box(-2.0, 2.0, (2,)), {}),
    "td3": ("td3", gym.spaces.Box(-2.0, 2.0, (2,)), {"policy_delay": 2}),
    "sac": ("sac", gym.spaces.Box(-2.0, 2.0, (2,)), {}),
    "sac-discrete": ("sac", gym.spaces.Discrete(3), {}),
    "d4pg": ("d4pg", gym.spaces.Box(-2.0, 2.0, (2,)), {}),
    # the offline learners (their batches come from a dataset's replay)
    "bc": ("bc", gym.spaces.Box(-2.0, 2.0, (2,)), {}),
    "cql": ("cql", gym.spaces.Box(-2.0, 2.0, (2,)), {"lagrange_threshold": 1.0}),
    "cql-discrete": ("cql", gym.spaces.Discrete(3), {}),
    "iql-offline": ("iql-offline", gym.spaces.Box(-2.0, 2.0, (2,)), {}),
    "td3-bc": ("td3-bc", gym.spaces.Box(-2.0, 2.0, (2,)), {"policy_delay": 1}),
}  # fmt: skip
NOISY = ("sac", "td3", "cql", "td3-bc")
"""Their updates draw noise per row: compared with none drawn (`without_noise`)."""
UPDATES = 3
LEARNERS = {"dqn": DQNLearner, "qrdqn": DQNLearner, "rem": DQNLearner, "ddpg": DDPGLearner,
            "td3": TD3Learner, "sac": SACLearner, "d4pg": D4PGLearner, "bc": BCLearner,
            "cql": cql_learner, "iql-offline": IQLLearner, "td3-bc": td3_bc_learner}  # fmt: skip


def without_noise(setattr):
    """``setattr(torch, name, f)`` for each of torch's draws the updates make per row: normal
    noise is zero and uniform noise one half (draws from an explicit generator, the test's
    batches', are left alone)."""
    randn = torch.randn

    def no_randn(*size, generator=None, **kwargs):
        if generator is not None:
            return randn(*size, generator=generator, **kwargs)
        return torch.zeros(*size, **kwargs)

    setattr(torch, "randn_like", torch.zeros_like)
    setattr(torch, "rand_like", lambda t, **kwargs: torch.full_like(t, 0.5, **kwargs))
    setattr(torch, "randn", no_randn)


def make_learner(case):
    name, action_space, settings = CASES[case]
    spec = ALGORITHMS[name]
    config = spec.default_config(**{"model.hidden": (16,), "replay.n_step": 3, **settings})
    torch.manual_seed(0)
    return LEARNERS[name](config, OBS, action_space)


def fixed_batches(action_space):
    g = torch.Generator().manual_seed(3)
    batches = []
    for _ in range(UPDATES):
        if isinstance(action_space, gym.spaces.Discrete):
            actions = torch.randint(0, 3, (N,), generator=g)
        else:
            actions = 4.0 * torch.rand(N, 2, generator=g) - 2.0
        batches.append(
            ReplayBatch(
                obs=torch.rand(N, 4, generator=g) * 2 - 1,
                actions=actions,
                rewards=torch.randn(N, 3, generator=g),
                steps=torch.randint(1, 4, (N,), generator=g),
                terminated=torch.rand(N, generator=g) < 0.2,
                next_obs=torch.rand(N, 4, generator=g) * 2 - 1,
                next_action_mask=None,
                weights=0.5 + torch.rand(N, generator=g),  # prioritized replay's weights
                indices=np.arange(N),
            )
        )
    return batches


def update(learner, case):
    """The updates, from the process's torch generator seeded alike (noisy nets, REM)."""
    torch.manual_seed(7)
    return [learner.update(batch) for batch in fixed_batches(CASES[case][1])]


def _replay_rank(rank, case):
    if case in NOISY:
        without_noise(lambda module, name, f: setattr(module, name, f))
    learner = make_learner(case)
    ranks_share = ReplayShare(learner, rank, 2)
    torch.manual_seed(7)
    results = [ranks_share.update((b, [])) for b in fixed_batches(CASES[case][1])]
    return {"state": learner.state_dict(), "results": results}


def _tensors(state, prefix=""):
    """The tensors of a (nested) state dict by dotted key (optimizer state included)."""
    if isinstance(state, torch.Tensor):
        yield prefix, state
    elif isinstance(state, dict):
        for k, v in state.items():
            yield from _tensors(v, f"{prefix}.{k}" if prefix else str(k))


@pytest.mark.parametrize("case", list(CASES))
def test_two_learners_take_the_update_of_one(case, tmp_path, monkeypatch):
    """Both ranks end with the single learner's weights, targets and optimizer state (float
    tolerance: sums are grouped differently); their priorities, joined in rank order, are
    the single learner's, and their metrics weighted by their shares are its metrics."""
    ranks = on_two_ranks(_replay_rank, tmp_path, case)
    if case in NOISY:
        without_noise(monkeypatch.setattr)
    single = make_learner(case)
    initial = dict(_tensors(make_learner(case).state_dict()))
    rows = update(single, case)
    expected = dict(_tensors(single.state_dict()))
    got = [dict(_tensors(rank["state"])) for rank in ranks]
    assert expected.keys() == got[0].keys() == got[1].keys()
    moved = 0
    for key, tensor in expected.items():
        if key == "actor_loss":  # TD3's last actor loss, a metric: each rank's over its rows
            continue
        assert torch.equal(got[0][key], got[1][key]), key
        torch.testing.assert_close(got[0][key], tensor, rtol=1e-5, atol=1e-6, msg=key)
        moved += key in initial and not torch.equal(initial[key], tensor)
    assert moved >= 2  # the weights moved: not a comparison of untouched learners
    for step, (stats, priorities) in enumerate(rows):
        (w0, stats0, p0), (w1, stats1, p1) = (rank["results"][step] for rank in ranks)
        assert (w0, w1) == (22 / 45, 23 / 45)
        torch.testing.assert_close(torch.cat([p0, p1]), priorities.detach(), rtol=1e-5, atol=1e-6)
        for key, value in stats.items():
            weighted = w0 * stats0[key] + w1 * stats1[key]
            assert float(weighted) == pytest.approx(float(value), rel=1e-4, abs=1e-6), key


def test_a_batch_is_cut_into_its_rows_field_by_field():
    batch = fixed_batches(gym.spaces.Discrete(3))[0]
    composite = batch._replace(obs={"a": batch.obs, "b": batch.obs[:, :2]})
    part = rows_of(composite, share(N, 1, 2))
    assert part.obs["a"].shape == (23, 4) and part.obs["b"].shape == (23, 2)
    assert torch.equal(part.rewards, batch.rewards[22:])
    assert part.next_action_mask is None
    assert list(part.indices) == list(range(22, 45))


def r2d2_batches():
    """R2D2's config and three batches of 9 sequences from its replay after a few rollouts of
    CartPole (nothing learned yet)."""
    settings = {
        "env.num_envs": 4, "num_steps": 8, "burn_in": 2, "length": 4, "period": 2,
        "model.hidden": (16,), "model.lstm_hidden": 8, "replay.batch_size": 9,
        "replay.learning_starts": 10_000, "target_update_every": 2,
    }  # fmt: skip
    config = shoal.build_config("r2d2", seed=0, **settings)
    algo = R2D2(config)
    try:
        for _ in range(6):
            algo.train_iteration()
        spaces = algo.sampler.observation_space, algo.sampler.action_space
        return config, spaces, [algo.replay.sample(9, 0.6) for _ in range(UPDATES)]
    finally:
        algo.close()


def make_r2d2(config, spaces):
    torch.manual_seed(0)
    return R2D2Learner(config, *spaces)


def _r2d2_rank(rank, config, spaces, batches):
    learner = make_r2d2(config, spaces)
    split = SequenceShare(learner, rank, 2)
    results = [split.update((batch, [("set_exploration", (0.3,))])) for batch in batches]
    return {"state": learner.state_dict(), "results": results}


def test_two_r2d2_learners_take_the_update_of_one(tmp_path):
    """R2D2's ranks take 4 and 5 of 9 sequences each (burn-in and targets are per sequence);
    they end with one learner's recurrent network, target and optimizer state, and give its
    sequence priorities and metrics (weighted by their shares of the valid steps)."""
    config, spaces, batches = r2d2_batches()
    ranks = on_two_ranks(_r2d2_rank, tmp_path, config, spaces, batches)
    single = make_r2d2(config, spaces)
    single.set_exploration(0.3)
    rows = [single.update(batch) for batch in batches]
    expected = dict(_tensors(single.state_dict()))
    got = [dict(_tensors(rank["state"])) for rank in ranks]
    assert expected.keys() == got[0].keys()
    for key, tensor in expected.items():
        assert torch.equal(got[0][key], got[1][key]), key
        torch.testing.assert_close(got[0][key], tensor, rtol=1e-5, atol=1e-6, msg=key)
    initial = dict(_tensors(make_r2d2(config, spaces).state_dict()))
    assert sum(not torch.equal(initial[k], v) for k, v in expected.items() if k in initial) >= 2
    for step, (stats, priorities) in enumerate(rows):
        (w0, stats0, p0), (w1, stats1, p1) = (rank["results"][step] for rank in ranks)
        assert w0 + w1 == pytest.approx(1.0)
        torch.testing.assert_close(torch.cat([p0, p1]), priorities.detach(), rtol=1e-5, atol=1e-6)
        for key, value in stats.items():
            weighted = w0 * stats0[key] + w1 * stats1[key]
            assert float(weighted) == pytest.approx(float(value), rel=1e-4, abs=1e-6), key


def maddpg_batches(continuous):
    """MADDPG's config, agent groups and three batches of 16 joint steps from its replay after
    a few rollouts of the particles' spread task (three agents, random actions so far)."""
    settings = {
        "env.num_envs": 4, "rollout_steps": 4, "model.hidden": (16,),
        "replay.batch_size": 16, "replay.learning_starts": 10_000, "replay.n_step": 2,
        "replay.prioritized": "proportional", "env.kwargs": {"continuous": continuous},
    }  # fmt: skip
    config = shoal.build_config("maddpg", seed=0, **settings)
    algo = MADDPG(config)
    try:
        for _ in range(3):
            algo.train_iteration()
        groups = maddpg_groups(algo.runner.env)
        batches = [algo.replay.sample(16, 0.6) for _ in range(UPDATES)]
        return config, groups, state_dim(algo.runner.env), batches
    finally:
        algo.close()


def make_maddpg(config, groups, dim):
    torch.manual_seed(0)
    return MADDPGLearner(config, groups, dim)


def _maddpg_rank(rank, made, batches):
    learner = make_maddpg(*made)
    split = ReplayShare(learner, rank, 2)
    torch.manual_seed(7)
    results = [split.update((batch, [])) for batch in batches]
    return {"state": learner.state_dict(), "results": results}


def test_two_maddpg_learners_take_the_update_of_one(tmp_path):
    """MADDPG with continuous actions (deterministic actors: no noise in the update) on joint
    steps of three agents: ranks of 8 joint steps each end with one learner's actors, critics,
    targets and optimizer states, and give its priorities and metrics. (Discrete actions draw
    Gumbel noise per row, which each rank draws for its own rows.)"""
    config, groups, dim, batches = maddpg_batches(continuous=True)
    made = (config, groups, dim)
    ranks = on_two_ranks(_maddpg_rank, tmp_path, made, batches)
    single = make_maddpg(*made)
    torch.manual_seed(7)
    rows = [single.update(batch) for batch in batches]
    expected = dict(_tensors(single.state_dict()))
    got = [dict(_tensors(rank["state"])) for rank in ranks]
    assert expected.keys() == got[0].keys()
    for key, tensor in expected.items():
        assert torch.equal(got[0][key], got[1][key]), key
        torch.testing.assert_close(got[0][key], tensor, rtol=1e-5, atol=1e-6, msg=key)
    initial = dict(_tensors(make_maddpg(*made).state_dict()))
    assert sum(not torch.equal(initial[k], v) for k, v in expected.items() if k in initial) >= 2
    for step, (stats, priorities) in enumerate(rows):
        (w0, stats0, p0), (w1, stats1, p1) = (rank["results"][step] for rank in ranks)
        assert (w0, w1) == (0.5, 0.5)
        torch.testing.assert_close(torch.cat([p0, p1]), priorities.detach(), rtol=1e-5, atol=1e-6)
        for key, value in stats.items():
            weighted = w0 * stats0[key] + w1 * stats1[key]
            assert float(weighted) == pytest.approx(float(value), rel=1e-4, abs=1e-6), key
