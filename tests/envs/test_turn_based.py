"""PettingZoo turn-based (AEC) envs through `shoal.envs.pettingzoo.TurnBasedParallel`:
tic-tac-toe with legal moves only, turn order, rewards at the end, and shared-weight
self-play that learns to beat a random player."""

import numpy as np
import pytest

import shoal
from shoal.config import EnvConfig
from shoal.envs import make_env
from shoal.envs.make import make_multi_agent_env
from shoal.envs.multi_agent import episode_ended

pytest.importorskip("pettingzoo.classic", reason="needs pettingzoo[classic]")
from pettingzoo.classic import tictactoe_v3  # noqa: E402
from pettingzoo.test import api_test, parallel_api_test  # noqa: E402

from shoal.envs.turn_based import TurnBasedParallel  # noqa: E402

TICTACTOE = "pettingzoo:pettingzoo.classic.tictactoe_v3"


def test_the_adapter_passes_pettingzoos_api_tests():
    api_test(tictactoe_v3.env(), num_cycles=20)
    parallel_api_test(TurnBasedParallel(tictactoe_v3.env()), num_cycles=50)


def random_legal(masks, rng):
    return np.where(masks.any(-1), np.where(masks, rng.random(masks.shape), -1).argmax(-1), 0)


def test_turn_order_legal_moves_and_rewards_at_the_end():
    env = make_multi_agent_env(EnvConfig(id=TICTACTOE, num_envs=3))
    assert list(env.groups) == ["player"] and env.groups["player"].agents == (
        "player_1",
        "player_2",
    )
    env.reset(seed=0)
    rng = np.random.default_rng(0)
    to_move = np.zeros(3, np.int64)  # player_1 opens every game
    over = np.zeros(3, bool)  # the game just ended: the next step resets it
    finished = 0
    for _ in range(200):
        masks = env.action_mask["player"]
        # Only the player to move has legal moves; the waiting one has an empty mask.
        for i in np.flatnonzero(~over):
            assert masks[i, to_move[i]].any() and not masks[i, 1 - to_move[i]].any()
        result = env.step({"player": random_legal(masks, rng)})
        active = result.active["player"]
        for i in range(3):
            if result.autoreset[i]:
                assert not active[i].any()
                to_move[i], over[i] = 0, False
                continue
            assert active[i].tolist() == [to_move[i] == 0, to_move[i] == 1]
            rewards, done = result.rewards["player"][i], result.terminated["player"][i]
            if done.any():
                assert done.all()  # the game ends for both players at once
                # A win pays +1 to the mover and -1 to the player waiting; a draw pays 0.
                assert rewards.tolist() in ([0.0, 0.0], [1.0, -1.0], [-1.0, 1.0])
                if rewards.any():
                    assert rewards[to_move[i]] == 1.0
                finished += 1
                over[i] = True
            else:
                assert not rewards.any()
                to_move[i] = 1 - to_move[i]
    assert finished > 20
    returns = result.episode_returns
    assert set(returns) == {"player_1", "player_2"}


def play_against_random(policy, first: bool, games: int = 200) -> np.ndarray:
    """Returns of ``policy`` playing one side against a random player."""
    mine, theirs = ("player_1", "player_2") if first else ("player_2", "player_1")
    env = make_env(
        EnvConfig(
            id=TICTACTOE,
            num_envs=50,
            kwargs={"agent_groups": f"{mine}:me,{theirs}:them"},
            group="me",
            opponents={"them": "random"},
        )
    )
    obs, results = env.reset(seed=7), []
    while len(results) < games:
        actions = policy.act(obs, action_mask=env.action_mask, deterministic=True)
        result = env.step(actions)
        results += list(result.episode_returns)
        obs = result.obs
    env.close()
    return np.array(results[:games])


def self_play(tmp_path, steps):
    """PPO with one policy for both players (the tuned example ppo-tictactoe's settings):
    self-play against its current self."""
    result = shoal.train(
        "ppo",
        env=TICTACTOE,
        seed=0,
        total_steps=steps,
        run_dir=str(tmp_path / "run"),
        **{
            "env.num_envs": 16,
            "num_steps": 64,
            "minibatch_size": 256,
            "num_epochs": 4,
            "ent_coef": 0.01,
            "model.hidden": (128, 128),
            "run.eval_every_steps": 0,
            "run.console": False,
            "run.tensorboard": False,
        },
    )
    return shoal.load(result.run_dir)


@pytest.mark.learning
def test_self_play_learns_to_beat_a_random_player(tmp_path, monkeypatch):
    illegal = []
    original = TurnBasedParallel.step

    def checked(self, actions):
        actor = self.env.agent_selection
        if not self.env.observe(actor)["action_mask"][int(actions[actor])]:
            illegal.append((actor, int(actions[actor])))
        return original(self, actions)

    monkeypatch.setattr(TurnBasedParallel, "step", checked)
    # A random first player wins about 58% of games against a random second player. Over
    # seeds 0-4 (make test-learning-seeds) the first player won 84%, 78%, 79%, 73.5% and
    # 84.5%: the check asks 70% (it asked 75%, which seed 3 missed), 3 standard deviations
    # of 200 games above random play.
    policy = self_play(tmp_path, 150_000)
    assert illegal == []  # the masks keep every training move legal
    wins = (play_against_random(policy, first=True) > 0).mean()
    assert wins >= 0.70, wins


@pytest.mark.slow
def test_self_play_wins_nine_games_in_ten_as_first_player(tmp_path):
    policy = self_play(tmp_path, 400_000)
    assert (play_against_random(policy, first=True) > 0).mean() >= 0.9


@pytest.mark.learning
def test_pool_self_play_learns_both_seats_against_a_random_player(tmp_path):
    """CI-sized: the tuned ippo-tictactoe-selfplay (one policy, a PFSP pool of its past
    snapshots as opponents) for 100k env steps, about 30 s on one core (measured: 97% of
    games won as the first player and 73.5% as the second; a random first player wins about
    58%, a random second about 29%)."""
    result = shoal.train(
        tuned="ippo-tictactoe-selfplay",
        seed=0,
        total_steps=100_000,
        run_dir=str(tmp_path / "run"),
        **{"run.console": False, "run.tensorboard": False},
    )
    policy = shoal.load(result.run_dir)
    env = make_multi_agent_env(EnvConfig(id=TICTACTOE, num_envs=200))
    first = evaluate_wins(policy.with_fixed({"player_2": "random"}, env.groups), env, seat=0)
    second = evaluate_wins(policy.with_fixed({"player_1": "random"}, env.groups), env, seat=1)
    env.close()
    assert first >= 0.85 and second >= 0.55, (first, second)


@pytest.mark.slow
def test_pool_self_play_wins_nine_games_in_ten_as_first_player(tmp_path):
    """The tuned example ippo-tictactoe-selfplay: self-play against a PFSP pool of past
    snapshots (measured: 92.5% of games won as the first player, 75% as the second)."""
    result = shoal.train(
        tuned="ippo-tictactoe-selfplay",
        seed=0,
        run_dir=str(tmp_path / "run"),
        **{"run.console": False, "run.tensorboard": False},
    )
    policy = shoal.load(result.run_dir)
    env = make_multi_agent_env(EnvConfig(id=TICTACTOE, num_envs=200))
    first = policy.with_fixed({"player_2": "random"}, env.groups)
    wins = evaluate_wins(first, env, seat=0)
    env.close()
    assert wins >= 0.9, wins


def evaluate_wins(policy, env, seat: int) -> float:
    """The share of games (the first of each env) that ``seat`` wins."""
    obs, state = env.reset(seed=2024)
    mask = env.action_mask
    total = np.zeros(env.num_envs)
    running = np.ones(env.num_envs, bool)
    while running.any():
        step = env.step(policy.act(obs, state=state, action_mask=mask))
        real = running & ~step.autoreset
        total[real] += step.rewards["player"][real, seat]
        running &= ~episode_ended(step)
        obs, state, mask = step.obs, step.state, step.action_mask
    return float(np.mean(total > 0))
