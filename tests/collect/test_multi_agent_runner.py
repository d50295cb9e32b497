"""The multi-agent runner: its rollouts against a hand-stepped reference (one group and two
groups with different spaces), episode statistics per agent and per group, checkpoints."""

import numpy as np
import pytest
from duel_env import Duel
from ma_line import MALine

from shoal.collect.multi_agent import JointObs, MultiAgentEpisodes, MultiAgentRunner
from shoal.core.errors import ConfigError


def duel_actions(obs):
    """A scripted policy of both groups: red runs toward the runners' mean, each runner away
    from red."""
    red = np.clip(obs["red"][:, :, 1:2] - obs["red"][:, :, 0:1], -1, 1)
    blue = np.where(obs["blue"][:, :, 0] > obs["blue"][:, :, 1], 2, 0)
    return {"red": red.astype(np.float32), "blue": blue}


def line_actions(obs):
    return {"agent": (obs["agent"][:, :, 0] < 0.6).astype(np.int64)}


class Scripted:
    def __init__(self, policy):
        self.policy = policy
        self.begun = 0
        self.observed = []

    def act(self, view: JointObs):
        return self.policy(view.obs)

    def begin(self, view: JointObs):
        self.begun += 1

    def observe(self, actions, step):
        self.observed.append(step.autoreset.copy())


CASES = {
    "one group": (lambda n: MALine(n, max_steps=4), line_actions),
    "two groups": (lambda n: Duel(n, max_steps=3), duel_actions),
}


@pytest.mark.parametrize("case", list(CASES))
def test_rollouts_match_a_hand_stepped_env(case):
    make, policy = CASES[case]
    steps, envs = 4, 3
    acting = Scripted(policy)
    runner = MultiAgentRunner(make(envs), acting, steps, seed=7)
    reference = make(envs)
    obs, state = reference.reset(seed=7)
    returns = {agent: [] for g in reference.groups.values() for agent in g.agents}
    lengths = []
    for _ in range(3):  # rollouts continue one another
        rollout = runner.sample()
        assert rollout.num_steps == steps and rollout.num_envs == envs
        for t in range(steps):
            for g, group in reference.groups.items():
                np.testing.assert_array_equal(rollout.obs[g][t], obs[g])
                assert rollout.obs[g].shape == (steps + 1, envs, group.size, *obs[g].shape[2:])
            np.testing.assert_array_equal(rollout.state[t], state)
            actions = policy(obs)
            step = reference.step(actions)
            for g in reference.groups:
                np.testing.assert_array_equal(rollout.actions[g][t], actions[g])
                np.testing.assert_array_equal(rollout.rewards[g][t], step.rewards[g])
                np.testing.assert_array_equal(rollout.terminated[g][t], step.terminated[g])
                np.testing.assert_array_equal(rollout.truncated[g][t], step.truncated[g])
                np.testing.assert_array_equal(rollout.active[g][t], step.active[g])
                np.testing.assert_array_equal(rollout.step(t).obs[g], step.obs[g])
            np.testing.assert_array_equal(rollout.autoreset[t], step.autoreset)
            for agent in returns:
                returns[agent].append(step.episode_returns[agent])
            lengths.append(step.episode_lengths)
            obs, state = step.obs, step.state
        for g in reference.groups:  # the observation after the last step, for bootstraps
            np.testing.assert_array_equal(rollout.obs[g][steps], obs[g])
    got = rollout.episodes  # the last rollout's episodes: those of its steps
    last = slice(len(lengths) - steps, None)
    np.testing.assert_array_equal(got.lengths, np.concatenate(lengths[last]))
    for agent, r in returns.items():
        np.testing.assert_allclose(got.returns[agent], np.concatenate(r[last]))
    assert acting.begun == 1 and len(acting.observed) == 3 * steps


def test_episode_metrics_per_agent_and_per_group():
    runner = MultiAgentRunner(Duel(4, max_steps=3), Scripted(duel_actions), 4, seed=0)
    episodes = runner.sample().episodes
    metrics = episodes.metrics()
    assert episodes.count == 4  # every env ended once in 4 steps of 3-step episodes
    red, blue = episodes.returns["red_0"], episodes.group_returns("blue")
    assert blue.shape == (4, 2)
    assert metrics["episode/return/red_0"] == pytest.approx(red.mean())
    assert metrics["episode/return/blue"] == pytest.approx(blue.mean())
    assert metrics["episode/return/blue_1"] == pytest.approx(blue[:, 1].mean())
    everything = np.concatenate([red, blue.ravel()])
    assert metrics["episode/return"] == pytest.approx(everything.mean())
    merged = MultiAgentEpisodes.concat([episodes, episodes])
    assert merged.count == 8 and merged.metrics()["episode/return"] == metrics["episode/return"]
    one_group = MultiAgentRunner(MALine(2), Scripted(line_actions), 8, seed=0).sample()
    assert "episode/return/agent" not in one_group.episodes.metrics()  # the group is the run


def test_state_round_trip_continues_exactly():
    a = MultiAgentRunner(Duel(3), Scripted(duel_actions), 4, seed=1)
    a.sample()
    saved = a.get_state()
    want = a.sample()
    b = MultiAgentRunner(Duel(3), Scripted(duel_actions), 4, seed=99)
    assert b.set_state(saved, fallback_seed=5)
    got = b.sample()
    for field in ("obs", "actions", "rewards", "truncated"):
        for g in ("red", "blue"):
            np.testing.assert_array_equal(getattr(got, field)[g], getattr(want, field)[g])
    np.testing.assert_array_equal(got.state, want.state)


def test_an_env_without_state_restarts_its_episodes():
    class NoState(Duel):
        def get_state(self):
            from shoal.envs.snapshot import EnvStateUnsupported

            raise EnvStateUnsupported("no")

    acting = Scripted(duel_actions)
    runner = MultiAgentRunner(NoState(2), acting, 2, seed=1)
    runner.sample()
    saved = runner.get_state()
    assert saved["env"] is None
    assert not runner.set_state(saved, fallback_seed=3)
    assert acting.begun == 2  # the acting side heard of the restart
    fresh = Duel(2)
    obs, _ = fresh.reset(seed=3)
    np.testing.assert_array_equal(runner.view.obs["red"], obs["red"])


def test_actions_for_every_group_are_required():
    red_only = Scripted(lambda obs: {"red": duel_actions(obs)["red"]})
    runner = MultiAgentRunner(Duel(2), red_only, 2, seed=0)
    with pytest.raises(ConfigError, match=r"no actions for groups \['blue'\]"):
        runner.sample()
