"""``shoal/tag-v0``: observations and rewards against mpe2's simple_tag on the same
configurations, the motion of one step by hand, exact state round trips, and both groups
training at once."""

import numpy as np
import pytest

import shoal
from shoal.config import EnvConfig
from shoal.core.errors import ConfigError
from shoal.envs.make import make_multi_agent_env
from shoal.envs.particles.tag import TagEnv, bound

mpe2_tag = pytest.importorskip("mpe2.simple_tag_v3")


def mpe2_world(env: TagEnv, b: int):
    """mpe2's simple_tag with env ``b``'s positions and velocities."""
    ref = mpe2_tag.parallel_env()
    ref.reset(seed=0)
    world = ref.unwrapped.world
    n = env.num_agents
    for i, agent in enumerate(world.agents):
        agent.state.p_pos = env.pos[b, i].astype(np.float64)
        agent.state.p_vel = env.vel[b, i].astype(np.float64)
    for j, landmark in enumerate(world.landmarks):
        landmark.state.p_pos = env.pos[b, n + j].astype(np.float64)
    return ref.unwrapped.scenario, world


def test_observations_and_rewards_match_mpe2():
    env = TagEnv(16, seed=3)
    env.reset(seed=3)
    env.pos[:, :4] *= 0.35  # crowd the agents: some tags
    env.pos[:2, 3] = [0.95, -1.2]  # the prey off the arena in two envs
    env.vel[:] = np.random.default_rng(0).normal(size=env.vel.shape)
    obs, _ = env.observe()
    rewards = env.rewards()
    tagged = 0
    for b in range(16):
        scenario, world = mpe2_world(env, b)
        for i, agent in enumerate(world.agents):
            group, k = ("adversary", i) if i < 3 else ("agent", i - 3)
            np.testing.assert_allclose(obs[group][b, k], scenario.observation(agent, world),
                                       rtol=1e-5, atol=1e-6)  # fmt: skip
            want = scenario.reward(agent, world)
            assert rewards[group][b, k] == pytest.approx(want, rel=1e-5, abs=1e-5)
        tagged += rewards["adversary"][b, 0] > 0
    assert tagged > 0  # the comparison saw tags


def test_bound_penalty():
    np.testing.assert_allclose(
        bound(np.array([0.5, 0.95, 1.5, 3.0])), [0.0, 0.5, np.exp(1.0), 10.0], rtol=1e-6
    )


def test_one_step_of_motion_by_hand():
    env = TagEnv(1, num_obstacles=0)
    env.reset(seed=0)
    env.pos[0, :4] = [[-0.9, -0.9], [0.9, -0.9], [-0.9, 0.9], [0.5, 0.5]]  # far apart
    env.vel[0] = [[0, 0], [2.0, 0], [0, 0], [0, 0]]
    before = env.pos[0, :4].copy()
    env.step({"adversary": np.array([[2, 0, 0]]), "agent": np.array([[4]])})
    # predator 0 pushes +x at 3.0: v = 0.3; predator 1 coasts at 2.0 * 0.75 = 1.5, capped at
    # 1.0; the prey pushes +y at 4.0: v = 0.4.
    np.testing.assert_allclose(env.vel[0], [[0.3, 0], [1.0, 0], [0, 0], [0, 0.4]], atol=1e-6)
    np.testing.assert_allclose(env.pos[0, :4] - before, env.vel[0] * 0.1, atol=1e-6)


def test_state_round_trip_and_episodes():
    env = TagEnv(4, seed=1)
    env.reset(seed=1)
    rng = np.random.default_rng(0)

    def actions():
        return {"adversary": rng.integers(5, size=(4, 3)), "agent": rng.integers(5, size=(4, 1))}

    for _ in range(10):
        env.step(actions())
    saved, chosen = env.get_state(), [actions() for _ in range(30)]
    first = [env.step(a) for a in chosen]
    env.set_state(saved)
    second = [env.step(a) for a in chosen]
    for a, b in zip(first, second, strict=True):
        np.testing.assert_array_equal(a.obs["agent"], b.obs["agent"])
        np.testing.assert_array_equal(a.rewards["adversary"], b.rewards["adversary"])
    lengths = np.concatenate([s.episode_lengths for s in first])
    assert lengths.size == 4 and (lengths == 25).all()


def test_both_groups_learn_at_once(tmp_path):
    seen = []
    shoal.train(
        "mappo",
        run_dir=str(tmp_path / "tag"),
        total_steps=3 * 16 * 25,
        on_iteration=lambda step, metrics: seen.append(metrics),
        **{"env.id": "shoal/tag-v0", "env.num_envs": 16, "num_steps": 25,
           "minibatch_size": 200, "num_epochs": 1, "model.hidden": (16,),
           "run.eval_every_steps": 0, "run.console": False, "run.tensorboard": False},
    )  # fmt: skip
    assert {"loss/adversary/policy", "loss/agent/policy", "episode/return/agent"} <= set(seen[-1])
    env = make_multi_agent_env(EnvConfig(id="shoal/tag-v0", num_envs=2, kwargs={"num_prey": 2}))
    obs, state = env.reset(seed=0)
    assert obs["agent"].shape == (2, 2, 4 + 4 + 2 * 4 + 2) and state.shape == (2, 4 * 5 + 4)


def test_predator_prey_with_a_learning_prey():
    """``shoal/predator-prey-v0 --env.kwargs prey learned``: the preys are a second group."""
    from shoal.envs.particles import PredatorPreyEnv

    env = PredatorPreyEnv(2, prey="learned")
    obs, _ = env.reset(seed=0)
    assert set(env.groups) == {"agent", "prey"} and obs["prey"].shape == (2, 2, 2 + 3 + 1)
    angles = np.deg2rad([90, 210, 330])  # 0.2 from the origin, 0.35 apart: no contact
    around = 0.2 * np.stack([np.cos(angles), np.sin(angles)], 1)
    env.set_positions(agent_pos=around, landmark_pos=[[0.0, 0.0], [1.0, 1.0]])
    before = env.landmark_pos.copy()
    step = env.step({"agent": np.zeros((2, 3), np.int64), "prey": np.array([[0, 2], [0, 2]])})
    moved = env.landmark_pos
    # prey 1 stepped +x by prey_step; prey 0 stood still and was captured (then respawned).
    np.testing.assert_allclose(moved[:, 1], before[:, 1] + [0.1, 0.0], atol=1e-6)
    distance = np.sqrt(((before[0, 0] - env.agent_pos[0]) ** 2).sum(-1)).min()
    assert step.rewards["prey"][0, 0] == pytest.approx(distance - 10.0, abs=1e-5)
    assert step.rewards["agent"][0, 0] > 5.0  # the predators' capture bonus
    obs = step.obs["prey"][0, 1]
    want = np.concatenate([moved[0, 1], np.sqrt(((moved[0, 1] - env.agent_pos[0]) ** 2).sum(-1)),
                           [np.sqrt(((moved[0, 1] - moved[0, 0]) ** 2).sum())]])  # fmt: skip
    np.testing.assert_allclose(obs, want, rtol=1e-5)
    with pytest.raises(ConfigError, match="prey must be 'rule' or 'learned'"):
        PredatorPreyEnv(1, prey="smart")
