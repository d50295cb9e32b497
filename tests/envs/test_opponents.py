"""Fixed policies for the groups a shared-weight learner does not train (``env.opponents``,
`shoal.envs.opponents`)."""

import gymnasium as gym
import numpy as np
import pytest

import shoal
from shoal.config import EnvConfig
from shoal.core.errors import ConfigError
from shoal.envs import make_env
from shoal.envs.opponents import RandomOpponent
from tests.envs.test_pettingzoo_and_matrix import _install_tiny
from tests.opponent_policies import Constant

QUIET = {"run.console": False, "run.tensorboard": False}


def test_random_opponent_is_legal_seeded_and_resumable():
    opponent = RandomOpponent(gym.spaces.Box(-1, 1, (2,)), gym.spaces.Discrete(4), seed=1)
    mask = np.zeros((50, 3, 4), bool)
    mask[..., 1] = mask[..., 3] = True
    actions = opponent.act(np.zeros((50, 3, 2)), mask)
    assert actions.shape == (50, 3) and set(np.unique(actions)) == {1, 3}
    state = opponent.get_state()
    first = opponent.act(np.zeros((4, 3, 2)), None)
    opponent.set_state(state)
    np.testing.assert_array_equal(opponent.act(np.zeros((4, 3, 2)), None), first)
    again = RandomOpponent(gym.spaces.Box(-1, 1, (2,)), gym.spaces.Discrete(4))
    again.reset(1)
    np.testing.assert_array_equal(again.act(np.zeros((50, 3, 2)), mask), actions)


def _checked(monkeypatch, tiny):
    """Record every joint action the env receives, and whether it was legal."""
    seen = []
    original = tiny.step

    def step(self, actions):
        for agent, action in actions.items():
            legal = self._observe(agent)["action_mask"][int(action)] if self.masked else True
            seen.append((agent, int(action), bool(legal)))
        return original(self, actions)

    monkeypatch.setattr(tiny, "step", step)
    return seen


def test_opponents_act_for_the_other_groups(monkeypatch):
    tiny = _install_tiny(monkeypatch, masked=True, length=4)
    seen = _checked(monkeypatch, tiny)
    config = EnvConfig(
        id="pettingzoo:fake_pz_tiny", num_envs=3, group="scout", opponents={"runner": "random"}
    )
    env = make_env(config)
    assert env.agent_names == ("scout_0", "scout_1")  # the learner's rows only
    env.reset(seed=0)
    for _ in range(20):
        legal = env.action_mask.argmax(-1)  # a legal action for each scout row
        env.step(legal)
    runners = [entry for entry in seen if entry[0] == "runner_0"]
    assert len(runners) > 20 and all(legal for _, _, legal in runners)
    assert len({action for _, action, _ in runners}) > 1  # random, not constant
    env.close()


def test_a_scripted_opponent_by_import_path(monkeypatch):
    tiny = _install_tiny(monkeypatch, length=4)
    seen = _checked(monkeypatch, tiny)
    Constant.calls = 0
    config = EnvConfig(
        id="pettingzoo:fake_pz_tiny",
        num_envs=2,
        opponents={"runner": "tests.opponent_policies:Constant(value=2)"},
    )
    env = make_env(config)  # the only group left without an opponent learns: scout
    env.reset(seed=0)
    for _ in range(6):
        env.step(np.zeros(env.num_envs, np.int64))
    assert Constant.calls == 6
    assert {action for agent, action, _ in seen if agent == "runner_0"} == {2}
    env.close()


@pytest.mark.parametrize(
    ("opponents", "group", "message"),
    [
        ({}, "scout", "--env.opponents runner random"),
        ({"runner": "random", "ghost": "random"}, "scout", r"names groups \['ghost'\]"),
        ({"scout": "random", "runner": "random"}, "scout", "gives the learning group 'scout'"),
        ({"runner": "smart"}, "scout", r"no built-in opponent .smart. \(built-in: random\)"),
        ({"runner": "tests.nope:Policy"}, "scout", "cannot import module 'tests.nope'"),
    ],
)
def test_bad_opponents_are_named(opponents, group, message, monkeypatch):
    _install_tiny(monkeypatch)
    config = EnvConfig(id="pettingzoo:fake_pz_tiny", num_envs=1, group=group, opponents=opponents)
    with pytest.raises(ConfigError, match=message):
        make_env(config)


def test_opponents_only_where_they_apply(tmp_path):
    with pytest.raises(ConfigError, match="apply to multi-agent envs"):
        make_env(EnvConfig(id="CartPole-v1", opponents={"x": "random"}))
    with pytest.raises(ConfigError, match="MADDPG trains every agent group of its env"):
        shoal.build_config("maddpg", env="shoal/spread-v0", **{"env.opponents": {"x": "random"}})


@pytest.mark.learning
def test_mappo_trains_agents_against_a_random_adversary(tmp_path):
    """mpe2's simple_adversary: the two agents learn while the adversary acts at random.
    Random agents average about 4 per episode against it (40 episodes of random actions)."""
    pytest.importorskip("mpe2")
    result = shoal.train(
        "mappo",
        env="pettingzoo:mpe2.simple_adversary_v3",
        seed=0,
        total_steps=20_480,
        run_dir=str(tmp_path / "run"),
        **{
            "env.group": "agent",
            "env.opponents": {"adversary": "random"},
            "run.eval_every_steps": 20_480,
            "run.eval_episodes": 20,
            **QUIET,
        },
    )
    assert result.eval_return >= 10.0  # 14.0 here; random agents about 4
