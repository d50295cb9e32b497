"""The PettingZoo adapter (mpe2 and a tiny custom ParallelEnv) and the two-step matrix game."""

from __future__ import annotations

import functools
import sys
import types
import warnings

import gymnasium as gym
import numpy as np
import pytest

from shoal.config import EnvConfig
from shoal.core.errors import ConfigError, ShoalError, UnsupportedSpaceError
from shoal.envs.make import make_multi_agent_env
from shoal.envs.matrix_games import TWO_STEP_ID, TwoStepGame
from shoal.envs.multi_agent import MultiAgentVectorEnv, agent_names
from shoal.envs.snapshot import EnvStateUnsupported

PZ_REASON = "needs the pettingzoo extra: pip install 'shoal[pettingzoo]'"


def _pettingzoo():
    return pytest.importorskip("pettingzoo", reason=PZ_REASON)


def _parallel_api_test(env, num_cycles):
    _pettingzoo()
    with warnings.catch_warnings():  # pettingzoo.test imports deprecated env modules
        warnings.simplefilter("ignore", DeprecationWarning)
        from pettingzoo.test import parallel_api_test
    parallel_api_test(env, num_cycles=num_cycles)


def _spread():
    pytest.importorskip("pettingzoo", reason=PZ_REASON)
    return pytest.importorskip("mpe2.simple_spread_v3", reason=PZ_REASON)


# --- mpe2 simple_spread ----------------------------------------------------------------


@pytest.mark.parametrize("continuous", [False, True])
def test_simple_spread_matches_direct_pettingzoo(continuous):
    spread = _spread()
    horizon, seed, num_envs = 4, 3, 2
    config = EnvConfig(
        id="pettingzoo:mpe2.simple_spread_v3",
        num_envs=num_envs,
        max_episode_steps=horizon,
        kwargs={"continuous_actions": continuous},
    )
    env = make_multi_agent_env(config)
    assert isinstance(env, MultiAgentVectorEnv)
    assert list(env.groups) == ["agent"]
    group = env.groups["agent"]
    assert group.agents == ("agent_0", "agent_1", "agent_2")
    assert group.observation_space.shape == (18,)
    assert env.state_space.shape == (54,)

    direct = spread.parallel_env(max_cycles=horizon, continuous_actions=continuous)
    direct_obs, _ = direct.reset(seed=seed)
    obs, state = env.reset(seed=seed)
    assert obs["agent"].shape == (num_envs, 3, 18) and state.shape == (num_envs, 54)
    for j, agent in enumerate(group.agents):
        np.testing.assert_allclose(obs["agent"][0, j], direct_obs[agent])
    np.testing.assert_allclose(state[0], direct.state())
    assert not np.allclose(obs["agent"][0], obs["agent"][1])  # env 1 is seeded seed + 1

    rng = np.random.default_rng(0)
    sums = np.zeros(3)
    for t in range(horizon):
        if continuous:
            actions = rng.uniform(0, 1, (num_envs, 3, 5)).astype(np.float32)
        else:
            actions = rng.integers(0, 5, (num_envs, 3))
        step = env.step({"agent": actions})
        direct_obs, rew, term, trunc, _ = direct.step(
            {a: actions[0, j] for j, a in enumerate(group.agents)}
        )
        expected = np.array([rew[a] for a in group.agents])
        np.testing.assert_allclose(step.rewards["agent"][0], expected, rtol=1e-6)
        for j, agent in enumerate(group.agents):
            np.testing.assert_allclose(step.obs["agent"][0, j], direct_obs[agent], rtol=1e-6)
        np.testing.assert_allclose(step.state[0], direct.state(), rtol=1e-6)
        assert step.rewards["agent"].shape == (num_envs, 3)
        assert step.active["agent"].all() and not step.autoreset.any()
        assert not step.terminated["agent"].any()
        sums += expected
        last = t == horizon - 1
        assert step.truncated["agent"].all() == last
        assert [trunc[a] for a in group.agents] == [last] * 3
        if last:
            assert direct.agents == []
            np.testing.assert_array_equal(step.episode_lengths, [horizon] * num_envs)
            for j, agent in enumerate(group.agents):
                assert step.episode_returns[agent].shape == (num_envs,)
                np.testing.assert_allclose(step.episode_returns[agent][0], sums[j], rtol=1e-5)
        else:
            assert step.episode_lengths.size == 0

    # next-step autoreset: actions ignored, nothing real; obs are a fresh episode's
    step = env.step({"agent": actions})
    assert step.autoreset.all()
    assert not step.active["agent"].any()
    assert not step.rewards["agent"].any()
    assert not (step.terminated["agent"].any() or step.truncated["agent"].any())
    direct_obs, _ = direct.reset()
    for j, agent in enumerate(group.agents):
        np.testing.assert_allclose(step.obs["agent"][0, j], direct_obs[agent])
    step = env.step({"agent": actions})
    assert step.active["agent"].all() and not step.autoreset.any()
    with pytest.raises(EnvStateUnsupported):
        env.get_state()
    assert env.render() is None
    env.close()
    direct.close()


def test_simple_adversary_groups_by_prefix_and_parallel_api():
    _pettingzoo()
    adversary = pytest.importorskip("mpe2.simple_adversary_v3", reason=PZ_REASON)
    _parallel_api_test(adversary.parallel_env(max_cycles=5), num_cycles=5)
    env = make_multi_agent_env(EnvConfig(id="pettingzoo:mpe2.simple_adversary_v3", num_envs=2))
    assert list(env.groups) == ["adversary", "agent"]
    assert env.groups["adversary"].agents == ("adversary_0",)
    assert env.groups["agent"].agents == ("agent_0", "agent_1")
    obs, _ = env.reset(seed=0)
    assert obs["adversary"].shape == (2, 1, 8) and obs["agent"].shape == (2, 2, 10)
    assert agent_names(env) == ["adversary_0", "agent_0", "agent_1"]
    env.close()


def test_render_rgb_array_of_the_first_env():
    _spread()
    from shoal.envs.pettingzoo import make_pettingzoo_env

    config = EnvConfig(id="pettingzoo:mpe2.simple_spread_v3", num_envs=2)
    env = make_pettingzoo_env(config, render_mode="rgb_array")
    env.reset(seed=0)
    frame = env.render()
    assert frame.ndim == 3 and frame.shape[2] == 3 and frame.dtype == np.uint8
    env.close()


def test_unknown_module_and_missing_parallel_env(monkeypatch):
    with pytest.raises(ShoalError, match="shoal\\[pettingzoo\\]"):
        make_multi_agent_env(EnvConfig(id="pettingzoo:no_such_pkg_xyz.thing_v0", num_envs=1))
    _spread()
    with pytest.raises(ShoalError, match="simple_spread_v3"):
        make_multi_agent_env(EnvConfig(id="pettingzoo:mpe2.simple_spred_v3", num_envs=1))
    monkeypatch.setitem(sys.modules, "fake_pz_noparallel", types.ModuleType("fake_pz_noparallel"))
    with pytest.raises(ShoalError, match="parallel_env"):
        make_multi_agent_env(EnvConfig(id="pettingzoo:fake_pz_noparallel", num_envs=1))


# --- a tiny custom ParallelEnv ---------------------------------------------------------


def _tiny_env_class():
    pettingzoo = _pettingzoo()

    class Tiny(pettingzoo.ParallelEnv):
        """scout_0 terminates after step 1; at step ``length`` scout_1 terminates and runner_0
        is truncated. Reward = action + 1 + agent index; observation [t, index + base]."""

        metadata = {"name": "tiny_v0", "render_modes": []}

        def __init__(self, masked=False, odd_space=False, length=3):
            self.possible_agents = ["scout_0", "scout_1", "runner_0"]
            self.agents = []
            self.masked, self.odd_space, self.length = masked, odd_space, length

        @functools.cache  # noqa: B019 (the api test wants the same object)
        def observation_space(self, agent):
            dim = 3 if self.odd_space and agent == "scout_1" else 2
            space = gym.spaces.Box(-20.0, 20.0, (dim,), np.float32)
            if self.masked:
                mask = gym.spaces.Box(0, 1, (3,), np.int8)
                return gym.spaces.Dict({"observation": space, "action_mask": mask})
            return space

        @functools.cache  # noqa: B019
        def action_space(self, agent):
            return gym.spaces.Discrete(3)

        def _observe(self, agent):
            index = self.possible_agents.index(agent)
            dim = self.observation_space(agent)
            dim = (dim["observation"] if self.masked else dim).shape[0]
            obs = np.zeros(dim, np.float32)
            obs[:2] = [self.t, index + self.base]
            if not self.masked:
                return obs
            mask = np.ones(3, np.int8)
            mask[(self.t + index) % 3] = 0
            return {"observation": obs, "action_mask": mask}

        def reset(self, seed=None, options=None):
            if seed is not None or not hasattr(self, "rng"):
                self.rng = np.random.default_rng(seed)
            self.agents = list(self.possible_agents)
            self.t = 0
            self.base = float(self.rng.integers(0, 5))
            return {a: self._observe(a) for a in self.agents}, {a: {} for a in self.agents}

        def step(self, actions):
            self.t += 1
            index = self.possible_agents.index
            rewards = {a: float(actions[a]) + 1 + index(a) for a in self.agents}
            end = self.t >= self.length
            terms = {a: a == "scout_0" or (end and a == "scout_1") for a in self.agents}
            truncs = {a: end and a == "runner_0" for a in self.agents}
            obs = {a: self._observe(a) for a in self.agents}
            infos = {a: {} for a in self.agents}
            self.agents = [a for a in self.agents if not (terms[a] or truncs[a])]
            return obs, rewards, terms, truncs, infos

    return Tiny


def _install_tiny(monkeypatch, **defaults):
    tiny = _tiny_env_class()
    module = types.ModuleType("fake_pz_tiny")
    module.parallel_env = lambda **kw: tiny(**{**defaults, **kw})
    monkeypatch.setitem(sys.modules, "fake_pz_tiny", module)
    return tiny


def test_tiny_env_passes_parallel_api_test():
    tiny = _tiny_env_class()
    _parallel_api_test(tiny(), num_cycles=10)
    _parallel_api_test(tiny(masked=True), num_cycles=10)


def test_early_termination_is_masked_not_dropped(monkeypatch):
    _install_tiny(monkeypatch)
    env = make_multi_agent_env(EnvConfig(id="pettingzoo:fake_pz_tiny", num_envs=2))
    assert list(env.groups) == ["scout", "runner"]
    assert env.groups["scout"].agents == ("scout_0", "scout_1")
    assert env.state_space is None
    obs, state = env.reset(seed=10)
    assert state is None and obs["scout"].shape == (2, 2, 2) and obs["runner"].shape == (2, 1, 2)
    actions = {"scout": np.array([[2, 1], [0, 0]]), "runner": np.array([[1], [2]])}

    step = env.step(actions)  # scout_0 terminates
    np.testing.assert_array_equal(step.rewards["scout"], [[3, 3], [1, 2]])
    np.testing.assert_array_equal(step.rewards["runner"], [[4], [5]])
    np.testing.assert_array_equal(step.terminated["scout"], [[True, False]] * 2)
    assert step.active["scout"].all() and step.active["runner"].all()
    frozen = step.obs["scout"][:, 0].copy()
    np.testing.assert_array_equal(frozen[:, 0], [1, 1])

    step = env.step(actions)  # scout_0 is masked, the others act
    np.testing.assert_array_equal(step.active["scout"], [[False, True]] * 2)
    np.testing.assert_array_equal(step.rewards["scout"], [[0, 3], [0, 2]])
    assert not step.terminated["scout"][:, 0].any()
    np.testing.assert_array_equal(step.obs["scout"][:, 0], frozen)
    np.testing.assert_array_equal(step.obs["scout"][:, 1, 0], [2, 2])

    step = env.step(actions)  # the episode ends
    np.testing.assert_array_equal(step.terminated["scout"], [[False, True]] * 2)
    np.testing.assert_array_equal(step.truncated["runner"], [[True]] * 2)
    np.testing.assert_array_equal(step.episode_lengths, [3, 3])
    np.testing.assert_array_equal(step.episode_returns["scout_0"], [3, 1])
    np.testing.assert_array_equal(step.episode_returns["scout_1"], [9, 6])
    np.testing.assert_array_equal(step.episode_returns["runner_0"], [12, 15])

    step = env.step(actions)  # next-step autoreset
    assert step.autoreset.all() and not step.active["scout"].any()
    assert not step.rewards["runner"].any()
    np.testing.assert_array_equal(step.obs["scout"][:, :, 0], 0)  # t = 0 again
    step = env.step(actions)
    assert step.active["scout"].all() and not step.autoreset.any()


def test_max_episode_steps_enforced_without_max_cycles(monkeypatch):
    _install_tiny(monkeypatch, length=50)
    config = EnvConfig(id="pettingzoo:fake_pz_tiny", num_envs=1, max_episode_steps=2)
    env = make_multi_agent_env(config)  # Tiny takes no max_cycles: the adapter truncates
    env.reset(seed=0)
    actions = {"scout": np.zeros((1, 2), int), "runner": np.zeros((1, 1), int)}
    env.step(actions)
    step = env.step(actions)
    np.testing.assert_array_equal(step.truncated["scout"], [[False, True]])
    np.testing.assert_array_equal(step.truncated["runner"], [[True]])
    np.testing.assert_array_equal(step.episode_lengths, [2])
    assert env.step(actions).autoreset.all()


def test_explicit_agent_groups_and_errors(monkeypatch):
    _install_tiny(monkeypatch)
    kwargs = {"agent_groups": "scout_0:red, runner_0:red ,scout_1:blue"}
    env = make_multi_agent_env(EnvConfig(id="pettingzoo:fake_pz_tiny", num_envs=1, kwargs=kwargs))
    assert list(env.groups) == ["red", "blue"]
    assert env.groups["red"].agents == ("scout_0", "runner_0")  # possible_agents order
    assert env.groups["blue"].agents == ("scout_1",)
    obs, _ = env.reset(seed=0)
    assert obs["red"].shape == (1, 2, 2)

    for bad, match in [
        ("scout_0:red,scout_1", "agent:group"),
        ("scout_0:red,scout_1:red", "leaves out agents runner_0"),
        ("scout_0:a,scout_1:a,runner_0:b,ghost_0:b", "unknown agents ghost_0"),
    ]:
        config = EnvConfig(id="pettingzoo:fake_pz_tiny", num_envs=1, kwargs={"agent_groups": bad})
        with pytest.raises(ConfigError, match=match):
            make_multi_agent_env(config)


def test_mismatched_spaces_in_a_group(monkeypatch):
    _install_tiny(monkeypatch, odd_space=True)
    with pytest.raises(UnsupportedSpaceError, match="scout_0.*scout_1.*agent_groups"):
        make_multi_agent_env(EnvConfig(id="pettingzoo:fake_pz_tiny", num_envs=1))
    kwargs = {"agent_groups": "scout_0:a,runner_0:a,scout_1:b"}
    env = make_multi_agent_env(EnvConfig(id="pettingzoo:fake_pz_tiny", num_envs=1, kwargs=kwargs))
    assert env.groups["b"].observation_space.shape == (3,)


def test_action_masks_from_dict_observations(monkeypatch):
    _install_tiny(monkeypatch, masked=True)
    env = make_multi_agent_env(EnvConfig(id="pettingzoo:fake_pz_tiny", num_envs=2))
    assert env.groups["scout"].observation_space.shape == (2,)
    obs, _ = env.reset(seed=0)
    assert obs["scout"].shape == (2, 2, 2)
    # index 0 -> action 0 illegal at t = 0, index 1 -> action 1, runner (index 2) -> action 2
    masks = env.action_mask
    assert masks["scout"].dtype == bool and masks["scout"].shape == (2, 2, 3)
    np.testing.assert_array_equal(masks["scout"][0], [[False, True, True], [True, False, True]])
    np.testing.assert_array_equal(masks["runner"][0], [[True, True, False]])
    actions = {"scout": np.array([[1, 0]] * 2), "runner": np.array([[0]] * 2)}
    step = env.step(actions)  # t = 1
    np.testing.assert_array_equal(
        step.action_mask["scout"][1], [[True, False, True], [True, True, False]]
    )
    np.testing.assert_array_equal(step.action_mask["runner"][1], [[False, True, True]])


# --- the two-step game -----------------------------------------------------------------


def _two_step(num_envs=1, **kwargs):
    return make_multi_agent_env(EnvConfig(id=TWO_STEP_ID, num_envs=num_envs, kwargs=kwargs))


S1, S2A, S2B, TERMINAL = [1, 0, 0], [0, 1, 0], [0, 0, 1], [0, 0, 0]


@pytest.mark.parametrize(
    ("first", "second", "state", "payoff"),
    [
        ((0, 0), (0, 0), S2A, 7),
        ((0, 1), (1, 0), S2A, 7),
        ((0, 0), (1, 1), S2A, 7),
        ((1, 0), (0, 0), S2B, 0),
        ((1, 1), (0, 1), S2B, 1),
        ((1, 0), (1, 0), S2B, 1),
        ((1, 1), (1, 1), S2B, 8),
    ],
)
def test_two_step_transitions(first, second, state, payoff):
    env = _two_step()
    assert isinstance(env, TwoStepGame) and isinstance(env, MultiAgentVectorEnv)
    assert env.groups["agent"].agents == ("agent_0", "agent_1")
    obs, glob = env.reset(seed=0)
    np.testing.assert_array_equal(obs["agent"], [[S1, S1]])
    np.testing.assert_array_equal(glob, [S1])

    step = env.step({"agent": np.array([first])})
    np.testing.assert_array_equal(step.obs["agent"], [[state, state]])
    np.testing.assert_array_equal(step.state, [state])
    np.testing.assert_array_equal(step.rewards["agent"], [[0, 0]])
    assert not step.terminated["agent"].any() and step.active["agent"].all()
    assert step.episode_lengths.size == 0

    step = env.step({"agent": np.array([second])})
    np.testing.assert_array_equal(step.rewards["agent"], [[payoff, payoff]])
    assert step.rewards["agent"].dtype == np.float32
    assert step.terminated["agent"].all() and not step.truncated["agent"].any()
    np.testing.assert_array_equal(step.obs["agent"], [[TERMINAL, TERMINAL]])
    np.testing.assert_array_equal(step.episode_returns["agent_0"], [payoff])
    np.testing.assert_array_equal(step.episode_returns["agent_1"], [payoff])
    np.testing.assert_array_equal(step.episode_lengths, [2])

    step = env.step({"agent": np.array([[1, 1]])})  # autoreset ignores the actions
    assert step.autoreset.all() and not step.active["agent"].any()
    np.testing.assert_array_equal(step.rewards["agent"], [[0, 0]])
    np.testing.assert_array_equal(step.obs["agent"], [[S1, S1]])
    assert env.render() is None


def test_two_step_batch_agent_id_and_state_roundtrip():
    env = _two_step(num_envs=4, agent_id=True)
    obs, _ = env.reset()
    assert obs["agent"].shape == (4, 2, 5)
    np.testing.assert_array_equal(obs["agent"][0], [S1 + [1, 0], S1 + [0, 1]])
    env.step({"agent": np.array([[0, 0], [1, 0], [1, 1], [1, 0]])})
    snapshot = env.get_state()
    step = env.step({"agent": np.array([[1, 0], [1, 1], [0, 1], [0, 0]])})
    np.testing.assert_array_equal(step.rewards["agent"][:, 0], [7, 8, 1, 0])
    np.testing.assert_array_equal(step.episode_returns["agent_0"], [7, 8, 1, 0])

    restored = _two_step(num_envs=4, agent_id=True)
    restored.reset()
    restored.set_state(snapshot)
    again = restored.step({"agent": np.array([[1, 0], [1, 1], [0, 1], [0, 0]])})
    for a, b in zip(step, again, strict=True):
        if isinstance(a, dict):
            assert a.keys() == b.keys()
            for key in a:
                np.testing.assert_array_equal(a[key], b[key])
        elif a is not None:
            np.testing.assert_array_equal(a, b)


def test_two_step_max_episode_steps_and_bad_kwargs():
    config = EnvConfig(id=TWO_STEP_ID, num_envs=2, max_episode_steps=1)
    env = make_multi_agent_env(config)
    env.reset()
    step = env.step({"agent": np.array([[1, 0], [0, 0]])})
    assert step.truncated["agent"].all() and not step.terminated["agent"].any()
    np.testing.assert_array_equal(step.obs["agent"][:, 0], [S2B, S2A])
    with pytest.raises(ConfigError, match="agent_id"):
        _two_step(bad=1)


def test_shared_weight_ppo_trains_with_the_masks_the_observations_carry(monkeypatch, tmp_path):
    """Masked-dict observations (the PettingZoo convention) reach PPO's rollouts: every
    action a scout takes is legal, in training and in evaluation."""
    tiny = _install_tiny(monkeypatch, masked=True, length=4)
    illegal = []
    original = tiny.step

    def checked_step(self, actions):
        for agent, action in actions.items():
            if not self._observe(agent)["action_mask"][int(action)]:
                illegal.append((agent, self.t, int(action)))
        return original(self, actions)

    monkeypatch.setattr(tiny, "step", checked_step)
    import shoal

    overrides = {
        "env.kwargs": {"agent_groups": "scout_0:all,scout_1:all,runner_0:all"},
        "env.num_envs": 4,
        "num_steps": 16,
        "minibatch_size": 32,
        "run.eval_every_steps": 128,
        "run.eval_episodes": 2,
        "run.console": False,
        "run.tensorboard": False,
    }
    result = shoal.train(
        "ippo", env="pettingzoo:fake_pz_tiny", total_steps=256, run_dir=str(tmp_path / "r"),
        **overrides,
    )  # fmt: skip
    assert result.env_steps >= 256
    assert illegal == []
