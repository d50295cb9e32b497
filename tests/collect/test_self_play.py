"""Self-play against a snapshot pool: PFSP sampling, Elo ratings and game scoring by hand,
the learner's rows only in its rollout, and the pool in checkpoints (exact resume)."""

import numpy as np
import pytest
import torch
from duel_env import race_factory
from state_helpers import assert_states_equal, metric_rows

import shoal
from shoal.algos.multi_agent.multi_policy import MultiPolicyPPO
from shoal.collect.self_play import SelfPlaySeats, SnapshotPool
from shoal.config import SelfPlayConfig
from shoal.core.errors import ConfigError
from shoal.envs.multi_agent import register_multi_agent_env
from shoal.train.checkpoint import load_checkpoint

TICTACTOE = "pettingzoo:pettingzoo.classic.tictactoe_v3"


def weights(value):
    return {"w": torch.full((2,), float(value))}


def test_pfsp_weights_favour_the_snapshots_the_learner_beats_least():
    pool = SnapshotPool(SelfPlayConfig(pfsp_power=2.0), seed=0)
    for value in range(3):
        pool.add(weights(value))
    for _ in range(3):
        pool.record(0, 1.0)  # snapshot 0: beaten 3 times
    pool.record(1, 0.0)  # snapshot 1: lost to once
    # Smoothed win rates (score + 1) / (games + 2): 4/5, 1/3, 1/2.
    want = np.array([(1 - 4 / 5) ** 2, (1 - 1 / 3) ** 2, (1 - 1 / 2) ** 2])
    np.testing.assert_allclose(pool.probabilities(), want / want.sum())
    uniform = SnapshotPool(SelfPlayConfig(sampling="uniform"), seed=0)
    uniform.add(weights(0))
    uniform.add(weights(1))
    np.testing.assert_allclose(uniform.probabilities(), [0.5, 0.5])
    draws = pool.sample(4000)
    np.testing.assert_allclose(np.bincount(draws, minlength=3) / 4000, want / want.sum(), atol=0.03)


def test_elo_and_the_oldest_snapshot_leaving():
    pool = SnapshotPool(SelfPlayConfig(pool_size=2, elo_k=16.0), seed=0)
    pool.add(weights(0))
    pool.record(0, 1.0)  # equal ratings: expected 0.5, the learner gains 16 * 0.5
    assert pool.learner_elo == pytest.approx(1008.0) and pool.elo[0] == pytest.approx(992.0)
    pool.add(weights(1))  # rated as the learner is now
    assert pool.elo[1] == pytest.approx(1008.0)
    pool.record(1, 0.5)
    assert pool.learner_elo == pytest.approx(1008.0)  # a draw between equals changes nothing
    assert pool.add(weights(2)) == [0] and pool.ids == [1, 2]
    pool.record(0, 1.0)  # a game against a snapshot that left: not recorded
    assert pool.games == {1: 1.0, 2: 0.0}
    clone = SnapshotPool(SelfPlayConfig(pool_size=2), seed=5)
    clone.load_state_dict(pool.state_dict())
    assert clone.ids == [1, 2] and torch.equal(clone.weights[2]["w"], weights(2)["w"])
    np.testing.assert_array_equal(clone.sample(20), pool.sample(20))


def test_games_are_scored_from_the_learners_seat():
    pool = SnapshotPool(SelfPlayConfig(), seed=0)
    pool.add({"weight": torch.zeros(1, 1)})
    seats = SelfPlaySeats(pool, 3, 2, lambda: torch.nn.Linear(1, 1, bias=False))
    seats.sync()
    seats.start(np.arange(3))
    seats.learner_seat[:] = [0, 1, 0]
    np.testing.assert_array_equal(
        seats.opponent_rows(), [[False, True], [True, False], [False, True]]
    )
    rewards = np.array([[1.0, -1.0], [1.0, -1.0], [0.0, 0.0]])
    seats.finish(rewards, np.ones(3, bool), np.ones(3, bool))
    assert seats.drain() == [1.0, 0.0, 0.5]  # a win, a loss (seat 1 lost), a draw
    assert pool.games[0] == 3 and pool.score[0] == 1.5


def small(**extra):
    overrides = {
        "env.id": TICTACTOE,
        "env.num_envs": 8,
        "num_steps": 16,
        "minibatch_size": 64,
        "num_epochs": 2,
        "model.hidden": (16,),
        "self_play.snapshot_every": 2,
        "self_play.pool_size": 3,
        "run.eval_every_steps": 0,
        "run.checkpoint_every_steps": 0,
        "run.console": False,
        "run.tensorboard": False,
    }
    overrides.update(extra)
    return overrides


@pytest.mark.extra("pettingzoo")
def test_the_learner_trains_on_its_own_seat_only():
    algo = MultiPolicyPPO(shoal.build_config("ippo", **small()))
    try:
        seats = algo.seats
        assert len(seats.pool) == 1 and set(seats.models) == {0}
        before = seats.learner_seat.copy()
        algo.runner.sample()
        rollout = algo.acting.rollouts(algo.runner.view)["player"]
        valid = rollout.valid.numpy().reshape(16, 8, 2)
        # The first move of each env's first game is player_1's (seat 0): a training row
        # where the learner has that seat, masked where a snapshot has it.
        first, second = before == 0, before == 1
        assert first.any() and second.any()  # both cases occur in these 8 envs
        assert valid[0, first, 0].all() and not valid[0, second, 0].any()
        assert not valid[0, :, 1].any()  # player_2 waits on the first move
        metrics = {}
        for _ in range(4):
            metrics = algo.train_iteration()
        assert len(seats.pool) == 3 and set(seats.models) == set(seats.pool.ids)  # capped
        assert {"selfplay/elo", "selfplay/pool_size", "selfplay/games"} <= set(metrics)
    finally:
        algo.close()


def test_the_pool_is_checkpointed_and_resume_is_exact(tmp_path):
    """On a game whose envs save their state (tic-tac-toe's PettingZoo env cannot)."""
    register_multi_agent_env("shoal-test/race-v0", race_factory)
    steps = 8 * 16
    overrides = small(**{"env.id": "shoal-test/race-v0", "run.checkpoint_every_steps": steps})
    part = shoal.train("ippo", seed=1, total_steps=3 * steps, run_dir=str(tmp_path / "a"),
                       **overrides)  # fmt: skip
    resumed = shoal.train(resume=part.run_dir, total_steps=6 * steps)
    straight = shoal.train("ippo", seed=1, total_steps=6 * steps, run_dir=str(tmp_path / "b"),
                           **overrides)  # fmt: skip
    got = load_checkpoint(resumed.run_dir).state["algorithm"]
    want = load_checkpoint(straight.run_dir).state["algorithm"]
    assert_states_equal(got, want)
    pool = got["runner"]["acting"]["self_play"]["pool"]
    assert len(pool["weights"]) == 3 and pool["next_id"] == 4  # 6 iterations, a snapshot per 2
    rows = metric_rows(straight.run_dir)
    assert sum(row.get("selfplay/games", 0) for row in rows) > 20
    assert metric_rows(resumed.run_dir) == metric_rows(straight.run_dir)


@pytest.mark.extra("pettingzoo")
def test_self_play_needs_one_policy_playing_every_seat(tmp_path):
    with pytest.raises(ConfigError, match="self_play trains one policy that plays every seat"):
        shoal.train("ippo", run_dir=str(tmp_path / "x"), total_steps=128,
                    **small(**{"env.policy_per_agent": True}))  # fmt: skip
