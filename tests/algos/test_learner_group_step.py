"""A learner group's gradient step (`shoal.algos.cores.group_shares.SplitStep`): two gloo
processes, each backpropagating its share of every minibatch, take the update one learner
takes on the whole minibatch. No Ray: the ranks are forked processes over localhost."""

import gymnasium as gym
import pytest
import torch
from gloo_ranks import on_two_ranks
from learner_group_runs import flat_tensors

from shoal.algos.cores.group_shares import ColumnShare, SplitStep, columns_of, share
from shoal.algos.cores.rollout_batch import RolloutBatch
from shoal.algos.policy_gradient import acer
from shoal.algos.policy_gradient.a2c import A2CConfig, A2CLearner
from shoal.algos.policy_gradient.acer import ACERConfig, ACERLearner
from shoal.algos.policy_gradient.acktr import ACKTRConfig, ACKTRLearner, ACKTRShare
from shoal.algos.policy_gradient.impala import IMPALAConfig, IMPALALearner
from shoal.algos.policy_gradient.pg import PGBatch, PGConfig, PGLearner, PGShare
from shoal.algos.policy_gradient.ppo import PPOConfig, PPOLearner
from shoal.algos.policy_gradient.trpo import TRPOConfig, TRPOLearner, TRPOShare
from shoal.config import EnvConfig, ModelConfig, OptimConfig
from shoal.core.types import Rollout

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


def _split_steps(rank, name):
    learner = make_learner(name)
    learner.step = SplitStep(learner, rank, 2)
    rows = update(learner, name)
    return {"weights": learner.model.state_dict(), "rows": rows}


@pytest.mark.parametrize("name", ["ppo", "a2c"])
def test_two_learners_take_the_update_of_one(name, tmp_path):
    """The ranks' weights are equal to each other and to one learner's after its update on
    the whole batch (float tolerance: the sums are grouped differently), with unequal shares
    (7 and 8 of 15), advantages standardized over the whole minibatch, clipping after the
    all-reduce; the ranks' loss metrics average to the single learner's."""
    ranks = on_two_ranks(_split_steps, tmp_path, name)
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


T, B = 6, 5  # IMPALA's time-major batch: 6 steps of 5 envs, columns split 2 / 3


def fixed_rollout():
    """A time-major batch with autoreset steps (invalid: the ranks' shares of the valid steps
    are not their shares of the columns), terminations and truncations."""
    g = torch.Generator().manual_seed(5)
    valid = torch.ones(T, B, dtype=torch.bool)
    valid[2, 0] = valid[4, 0] = valid[3, 1] = False  # three of them in the first rank's columns
    return Rollout(
        obs=torch.randn(T, B, 4, generator=g),
        actions=torch.randint(0, 3, (T, B), generator=g),
        log_probs=torch.log(torch.full((T, B), 1 / 3)) + 0.3 * torch.randn(T, B, generator=g),
        values=torch.randn(T, B, generator=g),
        rewards=torch.randn(T, B, generator=g),
        terminated=torch.rand(T, B, generator=g) < 0.15,
        truncated=torch.rand(T, B, generator=g) < 0.1,
        valid=valid,
        last_values=torch.randn(B, generator=g),
    )


def make_impala():
    config = IMPALAConfig(
        env=EnvConfig(num_envs=B), model=ModelConfig(hidden=(16,), backend="torch"),
        optim=OptimConfig(lr=0.01, max_grad_norm=0.5), num_steps=T,
    )  # fmt: skip
    torch.manual_seed(0)
    return IMPALALearner(config, *SPACES)


def _impala_rank(rank):
    learner = make_impala()
    split = ColumnShare(learner, rank, 2)
    rows = [split.update((fixed_rollout(), 0.01)) for _ in range(2)]
    return {"state": learner.state_dict(), "rows": rows}


def test_two_impala_learners_take_the_update_of_one(tmp_path):
    """Each rank takes its env columns (V-trace runs along each column's time axis); the
    gradients, weighted by the ranks' shares of the valid steps (12 - 3 = 9 and 18 of 27),
    sum to the whole batch's: both ranks end with the weights and optimizer state of one
    learner after the same two updates, and their weighted metrics are its metrics."""
    ranks = on_two_ranks(_impala_rank, tmp_path)
    single = make_impala()
    rows = [single.update(fixed_rollout(), 0.01) for _ in range(2)]
    for key, tensor in single.model.state_dict().items():
        got = [rank["state"]["model"][key] for rank in ranks]
        assert torch.equal(got[0], got[1]), key
        torch.testing.assert_close(got[0], tensor, rtol=1e-5, atol=1e-6)
    initial = next(make_impala().model.parameters())
    assert not torch.equal(initial, next(single.model.parameters()))
    (w0, first), (w1, second) = (rank["rows"][0] for rank in ranks)
    assert (w0, w1) == (9 / 27, 18 / 27)
    for key in ("loss/policy", "loss/value", "train/rho_mean"):
        assert w0 * first[key] + w1 * second[key] == pytest.approx(rows[0][key], rel=1e-4), key


def test_a_rollout_is_cut_into_env_columns_field_by_field():
    rollout = fixed_rollout()._replace(obs={"a": torch.zeros(T, B, 2)}, last_obs=torch.ones(B, 3))
    part = columns_of(rollout, share(B, 1, 2))
    assert part.obs["a"].shape == (T, 3, 2) and part.last_obs.shape == (3, 3)
    assert torch.equal(part.rewards, rollout.rewards[:, 2:])
    assert torch.equal(part.last_values, rollout.last_values[2:])
    assert part.step_states is None


def pg_batch(size):
    g = torch.Generator().manual_seed(11)
    return PGBatch(
        obs=torch.randn(size, 4, generator=g),
        actions=torch.randint(0, 3, (size,), generator=g),
        returns=3.0 + torch.randn(size, generator=g),  # standardizing them matters
    )


def make_pg():
    config = PGConfig(
        env=EnvConfig(num_envs=5), model=ModelConfig(hidden=(16,), backend="torch"),
        optim=OptimConfig(lr=0.01, max_grad_norm=0.5), num_steps=9, ent_coef=0.01,
    )  # fmt: skip
    torch.manual_seed(0)
    return PGLearner(config, *SPACES)


def _pg_rank(rank, size):
    learner = make_pg()
    split = PGShare(learner, rank, 2)
    rows = [split.update((pg_batch(size), 0.01)) for _ in range(2)]
    return {"state": learner.state_dict(), "rows": rows}


@pytest.mark.parametrize("size", [13, 1, 0])
def test_two_reinforce_learners_take_the_update_of_one(size, tmp_path):
    """REINFORCE's ranks take the whole batch's baseline-subtracted, standardized advantages,
    then their rows (6 and 7 of 13); a batch of one sample leaves rank 0 without rows (it
    joins at weight 0), and a batch of none (no episode ended) takes no step anywhere."""
    ranks = on_two_ranks(_pg_rank, tmp_path, size)
    single = make_pg()
    rows = [single.update(pg_batch(size), 0.01) for _ in range(2)]
    for key, tensor in single.model.state_dict().items():
        got = [rank["state"]["model"][key] for rank in ranks]
        assert torch.equal(got[0], got[1]), key
        torch.testing.assert_close(got[0], tensor, rtol=1e-5, atol=1e-6)
    moved = not torch.equal(next(make_pg().model.parameters()), next(single.model.parameters()))
    assert moved == (size > 0)
    (w0, first), (w1, second) = (rank["rows"][0] for rank in ranks)
    assert (w0, w1) == {13: (6 / 13, 7 / 13), 1: (0.0, 1.0), 0: (0.5, 0.5)}[size]
    assert first["train/samples"] == second["train/samples"] == size
    for key in ("loss/policy", "loss/value", "loss/entropy", "train/return_mean"):
        if size:
            assert w0 * first[key] + w1 * second[key] == pytest.approx(rows[0][key], rel=1e-4)


def acer_segment():
    """IMPALA's time-major batch as an ACER segment, behaviour statistics from a policy
    perturbed away from the learner's (importance weights that differ from 1)."""
    rollout = fixed_rollout()._replace(last_obs=torch.randn(B, 4, generator=torch.Generator()))
    behaviour = make_acer().model
    with torch.no_grad():
        for p in behaviour.parameters():
            p.add_(0.1 * torch.randn(p.shape, generator=torch.Generator().manual_seed(2)))
    return acer.segment_of(rollout, acer.behaviour_statistics(behaviour, rollout.obs))


def make_acer():
    config = ACERConfig(
        env=EnvConfig(num_envs=B), model=ModelConfig(hidden=(16,), backend="torch"),
        optim=OptimConfig(lr=0.01, max_grad_norm=0.5), num_steps=T, delta=0.05,
    )  # fmt: skip
    torch.manual_seed(0)
    return ACERLearner(config, *SPACES)


def _acer_rank(rank, segment):
    learner = make_acer()
    split = ColumnShare(learner, rank, 2)
    rows = [split.update((segment, 0.01)) for _ in range(2)]
    return {"state": learner.state_dict(), "rows": rows}


def test_two_acer_learners_take_the_update_of_one(tmp_path):
    """ACER's ranks take env columns of a segment (Retrace runs along each column's time axis;
    the trust-region projection, binding at delta 0.05, is per step): both end with one
    learner's network, average network and optimizer state, and their weighted metrics are
    its metrics."""
    segment = acer_segment()
    ranks = on_two_ranks(_acer_rank, tmp_path, segment)
    single = make_acer()
    rows = [single.update(segment, 0.01) for _ in range(2)]
    for part in ("model", "average"):
        for key, tensor in single.state_dict()[part].items():
            got = [rank["state"][part][key] for rank in ranks]
            assert torch.equal(got[0], got[1]), (part, key)
            torch.testing.assert_close(got[0], tensor, rtol=1e-5, atol=1e-6)
    assert not torch.equal(next(make_acer().model.parameters()), next(single.model.parameters()))
    (w0, first), (w1, second) = (rank["rows"][0] for rank in ranks)
    assert (w0, w1) == (9 / 27, 18 / 27)
    for key in ("loss/policy", "loss/critic", "train/rho_mean", "train/kl_average"):
        weighted = float(w0 * first[key] + w1 * second[key])
        assert weighted == pytest.approx(float(rows[0][key]), rel=1e-4, abs=1e-7), key
    # The second update's policy has left the average one: the trust region is in play.
    assert float(rows[1]["train/kl_average"]) > 0


def make_trpo(action_space):
    """TRPO with a value regression of 2 epochs of minibatches of 15 (split 7 / 8) and the
    last minibatch of 1 sample (46 rows: one rank computes on it at weight 0)."""
    config = TRPOConfig(
        env=EnvConfig(num_envs=5), model=ModelConfig(hidden=(16,), backend="torch"),
        num_steps=10, vf_minibatch_size=15, vf_epochs=2, max_kl=0.05,
    )  # fmt: skip
    torch.manual_seed(0)
    return TRPOLearner(config, SPACES[0], action_space)


def trpo_batch(action_space):
    """46 rows; actions of ``action_space``, behaviour log-probabilities near the initial
    policy's (so the line search's trust region binds as in training)."""
    g = torch.Generator().manual_seed(5)
    size = 46
    obs = torch.randn(size, 4, generator=g)
    if isinstance(action_space, gym.spaces.Discrete):
        actions = torch.randint(0, 3, (size,), generator=g)
    else:
        actions = torch.randn(size, 2, generator=g)
    with torch.no_grad():
        log_probs = make_trpo(action_space).model.distribution(obs, None).log_prob(actions)
    return RolloutBatch(
        obs=obs,
        actions=actions,
        log_probs=log_probs + 0.1 * torch.randn(size, generator=g),
        values=torch.randn(size, generator=g),
        advantages=2.0 + torch.randn(size, generator=g),
        returns=torch.randn(size, generator=g),
    )


TRPO_SPACES = {"discrete": SPACES[1], "box": gym.spaces.Box(-1.0, 1.0, (2,))}


def _trpo_rank(rank, kind):
    learner = make_trpo(TRPO_SPACES[kind])
    split = TRPOShare(learner, rank, 2)
    torch.manual_seed(7)  # the value regression's minibatch orders
    rows = [split.update((trpo_batch(TRPO_SPACES[kind]),)) for _ in range(2)]
    return {"state": learner.state_dict(), "rows": rows}


@pytest.mark.parametrize("kind", ["discrete", "box"])
def test_two_trpo_learners_take_the_natural_gradient_step_of_one(kind, tmp_path):
    """Each rank's gradient, Fisher-vector products and line-search KL and gain are its rows'
    (23 and 23 of 46), all-reduced before conjugate gradient and the line search use them:
    both ranks take one learner's step (a Gaussian policy's too), and its value regression."""
    ranks = on_two_ranks(_trpo_rank, tmp_path, kind)
    space = TRPO_SPACES[kind]
    single = make_trpo(space)
    torch.manual_seed(7)
    rows = [single.update(trpo_batch(space)) for _ in range(2)]
    for key, tensor in single.state_dict()["model"].items():
        got = [rank["state"]["model"][key] for rank in ranks]
        assert torch.equal(got[0], got[1]), key
        torch.testing.assert_close(got[0], tensor, rtol=1e-4, atol=1e-5)
    assert not torch.equal(next(make_trpo(space).model.parameters()),
                           next(single.model.parameters()))  # fmt: skip
    for r, row in enumerate(rows):
        assert row["train/step_fraction"] > 0  # a step was taken, not refused
        for rank in ranks:  # every metric is the whole batch's, on every rank
            for key, value in row.items():
                assert rank["rows"][r][key] == pytest.approx(value, rel=1e-4, abs=1e-6), key


def make_acktr(action_space):
    config = ACKTRConfig(
        env=EnvConfig(num_envs=5), model=ModelConfig(hidden=(16,), backend="torch"),
        num_steps=9, normalize_advantages=True,
    )  # fmt: skip
    torch.manual_seed(0)
    return ACKTRLearner(config, SPACES[0], action_space)


def _acktr_rank(rank, kind):
    space = TRPO_SPACES[kind]
    learner = make_acktr(space)
    split = ACKTRShare(learner, rank, 2)
    torch.manual_seed(7)  # the Fisher draws
    rows = [split.update((trpo_batch(space), 0.25)) for _ in range(2)]
    return {"state": learner.state_dict(), "rows": rows}


@pytest.mark.parametrize("kind", ["discrete", "box"])
def test_two_acktr_learners_take_the_kfac_step_of_one(kind, tmp_path):
    """Each rank's Kronecker factors and gradients are its rows' (23 and 23 of 46) at the
    Fisher draws one learner takes on the whole batch, all-reduced: both ranks take one
    learner's natural-gradient step, twice (the second with running factors and momentum),
    and its trust-region scale; advantages standardized over the whole rollout."""
    ranks = on_two_ranks(_acktr_rank, tmp_path, kind)
    space = TRPO_SPACES[kind]
    single = make_acktr(space)
    torch.manual_seed(7)
    rows = [single.update(trpo_batch(space), 0.25) for _ in range(2)]
    state = single.state_dict()
    for key, tensor in flat_tensors(state):
        got = [dict(flat_tensors(rank["state"]))[key] for rank in ranks]
        assert torch.equal(got[0], got[1]), key
        if key.rsplit(".", 1)[-1] in ("QA", "QG"):  # eigenvectors: signs are arbitrary
            continue
        torch.testing.assert_close(got[0], tensor, rtol=1e-4, atol=1e-5, msg=key)
    assert not torch.equal(next(make_acktr(space).model.parameters()),
                           next(single.model.parameters()))  # fmt: skip
    (w0, first), (w1, second) = (rank["rows"][1] for rank in ranks)
    assert (w0, w1) == (0.5, 0.5)
    for key in ("loss/policy", "loss/value", "train/trust_region_scale"):
        assert w0 * first[key] + w1 * second[key] == pytest.approx(rows[1][key], rel=1e-4), key
