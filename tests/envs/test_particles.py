"""The vectorized particle worlds: hand-checked physics and rewards, the paper tasks' rules,
episodes and autoreset, batch equivalence with an unbatched reference, snapshots, rendering."""

from __future__ import annotations

import math

import gymnasium as gym
import numpy as np
import pytest

import shoal  # noqa: F401 (registers the envs)
from shoal.config import EnvConfig
from shoal.core.errors import ConfigError
from shoal.envs.make import make_multi_agent_env
from shoal.envs.multi_agent import MultiAgentVectorEnv
from shoal.envs.particles import (
    CooperativeNavigationV2Env,
    PredatorPreyEnv,
    PushForwardEnv,
)

IDS = [
    "shoal/spread-v0",
    "shoal/cn-v1-v0",
    "shoal/cn-v2-v0",
    "shoal/push-forward-v0",
    "shoal/predator-prey-v0",
]
NOOP, LEFT, RIGHT, DOWN, UP = range(5)


def make(env_id: str, num_envs: int = 1, steps: int | None = None, **kwargs):
    config = EnvConfig(id=env_id, num_envs=num_envs, max_episode_steps=steps, kwargs=kwargs)
    env = make_multi_agent_env(config)
    env.reset(seed=0)
    return env


def act(*actions: int, num_envs: int = 1) -> dict[str, np.ndarray]:
    return {"agent": np.tile(np.array(actions), (num_envs, 1))}


def dist(a, b) -> float:
    return math.dist(a, b)


# ----------------------------------------------------------------- physics


def test_single_agent_moves_by_damped_velocity():
    env = make("shoal/spread-v0")
    env.set_positions(0, agent_pos=[[0, 0], [5, 5], [-5, 5]], agent_vel=0.0)
    step = env.step(act(RIGHT, NOOP, NOOP))
    # v = 0 * 0.75 + 5 * 0.1 = 0.5, x = 0.5 * 0.1
    np.testing.assert_allclose(env.agent_vel[0, 0], [0.5, 0.0], atol=1e-6)
    np.testing.assert_allclose(env.agent_pos[0, 0], [0.05, 0.0], atol=1e-6)
    np.testing.assert_allclose(step.obs["agent"][0, 0, :4], [0.5, 0, 0.05, 0], atol=1e-6)
    env.step(act(UP, NOOP, NOOP))
    # v = (0.5 * 0.75, 0.5), position += v * 0.1
    np.testing.assert_allclose(env.agent_vel[0, 0], [0.375, 0.5], atol=1e-6)
    np.testing.assert_allclose(env.agent_pos[0, 0], [0.0875, 0.05], atol=1e-6)
    np.testing.assert_allclose(env.agent_pos[0, 1:], [[5, 5], [-5, 5]], atol=1e-6)


def test_overlapping_agents_are_penalized_and_pushed_apart():
    env = make("shoal/cn-v1-v0")
    env.set_positions(
        0,
        agent_pos=[[-0.05, 0], [0.05, 0], [3, 3]],
        agent_vel=[[2.5, 0], [-2.5, 0], [0, 0]],
        landmark_pos=[[-0.05, 0], [0.05, 0], [3, 3]],
    )
    step = env.step(act(NOOP, NOOP, NOOP))
    # penetration = 1e-3 * log(1 + exp((0.3 - 0.1) / 1e-3)) = 0.2; force = 100 * 0.2 = 20
    # v0 = 2.5 * 0.75 - 20 * 0.1 = -0.125; x0 = -0.05 - 0.0125
    np.testing.assert_allclose(env.agent_vel[0, 0], [-0.125, 0], atol=1e-4)
    np.testing.assert_allclose(env.agent_vel[0, 1], [0.125, 0], atol=1e-4)
    np.testing.assert_allclose(env.agent_pos[0, :2, 0], [-0.0625, 0.0625], atol=1e-5)
    # still overlapping (0.125 < 0.3): -1 for both, shared cover distance 2 * 0.0125
    cover = 2 * 0.0125
    np.testing.assert_allclose(
        step.rewards["agent"][0], [-1 - cover, -1 - cover, -cover], atol=1e-5
    )
    assert env.collisions()[0].tolist() == [1, 1, 0]


# ----------------------------------------------------------------- spread


def test_spread_reward_and_observation_by_hand():
    env = make("shoal/spread-v0")
    agents = [[0, 0], [1, 0], [0, 1]]
    landmarks = [[0, 0.5], [1, 1], [-1, 0]]
    env.set_positions(0, agent_pos=agents, agent_vel=0.0, landmark_pos=landmarks)
    step = env.step(act(NOOP, NOOP, NOOP))
    cover = 0.5 + 1.0 + 1.0
    np.testing.assert_allclose(step.rewards["agent"][0], [-0.5 * cover] * 3, atol=1e-6)
    obs = step.obs["agent"][0, 1]  # agent 1 at (1, 0)
    expected = [0, 0, 1, 0, -1, 0.5, 0, 1, -2, 0, -1, 0, -1, 1]
    np.testing.assert_allclose(obs, expected, atol=1e-6)
    assert step.state.shape == (1, 24)

    # local_ratio: collisions weigh local_ratio, the cover distance 1 - local_ratio
    env = make("shoal/spread-v0", local_ratio=0.25)
    env.set_positions(
        0,
        agent_pos=[[0, 0], [0.2, 0], [0, 5]],
        agent_vel=[[1.3, 0], [-1.3, 0], [0, 0]],  # closing in against the contact force
        landmark_pos=agents,
    )
    r = env.step(act(NOOP, NOOP, NOOP)).rewards["agent"][0]
    x = env.agent_pos[0]
    cover = sum(min(dist(a, lm) for a in x) for lm in agents)
    np.testing.assert_allclose(r, [-0.75 * cover - 0.25 * k for k in (1, 1, 0)], atol=1e-5)


# ----------------------------------------------------------------- paper tasks


def test_cn_v1_observes_distances_only():
    env = make("shoal/cn-v1-v0")
    agents = [[0, 0], [1, 0], [0, 2]]
    landmarks = [[3, 4], [1, 1], [0, -1]]
    env.set_positions(0, agent_pos=agents, agent_vel=[[0.3, 0.1]] * 3, landmark_pos=landmarks)
    obs, state = env.observe()
    assert obs["agent"].shape == (1, 3, 5)
    np.testing.assert_allclose(
        obs["agent"][0, 2], [2, math.sqrt(5), math.sqrt(13), math.sqrt(2), 3], atol=1e-6
    )
    assert env.groups["agent"].observation_space.shape == (5,)
    # velocities never appear: same distances, other velocities -> same observation
    env.set_positions(0, agent_vel=0.0)
    np.testing.assert_array_equal(env.observe()[0]["agent"], obs["agent"])
    assert not np.array_equal(env.observe()[1], state)
    env = make("shoal/cn-v1-v0", continuous=True, message_dim=3)
    assert env.groups["agent"].observation_space.shape == (5 + 2 * 3,)


@pytest.mark.parametrize("third, penalized", [([1.5, 1.0], True), ([-0.5, 1.0], False)])
def test_cn_v2_wrong_split_penalty(third, penalized):
    env = make("shoal/cn-v2-v0")
    assert isinstance(env, CooperativeNavigationV2Env)
    agents = [[0.1, 0], [1.8, 0], third]
    # landmark 0 is primary (closest agent at 0.1 < 0.2); agent 2 decides the split
    env.set_positions(0, agent_pos=agents, agent_vel=0.0, landmark_pos=[[0, 0], [2, 0]])
    assert env.wrong_split()[0] == penalized
    r = env.step(act(NOOP, NOOP, NOOP)).rewards["agent"][0]
    expected = -(0.1 + 0.2) - (10.0 if penalized else 0.0)
    np.testing.assert_allclose(r, [expected] * 3, atol=1e-5)


def test_cn_v2_primary_is_either_landmark():
    env = make("shoal/cn-v2-v0")
    # landmark 1 primary (0.05 < 0.1): two agents must be nearer landmark 1
    env.set_positions(0, agent_pos=[[0.1, 0], [1.95, 0], [1.5, -1]], landmark_pos=[[0, 0], [2, 0]])
    assert not env.wrong_split()[0]
    env.set_positions(0, agent_pos=[[0.1, 0], [1.95, 0], [-0.5, 1]])
    assert env.wrong_split()[0]


def test_push_forward_push_moves_landmarks_right():
    env = make("shoal/push-forward-v0")
    assert isinstance(env, PushForwardEnv) and env.max_episode_steps == 50
    landmarks = np.array([[0, 0], [1, 0], [0, 1]], np.float32)
    env.set_positions(0, agent_pos=landmarks[[1, 2, 0]], agent_vel=0.0, landmark_pos=landmarks)
    step = env.step(act(RIGHT, RIGHT, RIGHT))
    # each agent moved 0.05 right, each landmark too: distances 0, +10 for all
    np.testing.assert_allclose(env.landmark_pos[0], landmarks + [0.05, 0], atol=1e-6)
    np.testing.assert_allclose(env.landmark_vel[0], [[0.5, 0]] * 3, atol=1e-5)
    np.testing.assert_allclose(step.rewards["agent"][0], [10.0] * 3, atol=1e-5)

    # one agent does not move right: no push, landmarks stay
    env.set_positions(0, agent_pos=landmarks, agent_vel=0.0, landmark_pos=landmarks)
    step = env.step(act(RIGHT, NOOP, RIGHT))
    np.testing.assert_allclose(env.landmark_pos[0], landmarks, atol=1e-6)
    np.testing.assert_allclose(step.rewards["agent"][0], [-0.1] * 3, atol=1e-5)

    # two agents in the same landmark's zone (third zone empty): no push
    agents = np.array([[0, -0.1], [0, 0.2], [0, 1]], np.float32)
    env.set_positions(0, agent_pos=agents, agent_vel=0.0, landmark_pos=landmarks)
    step = env.step(act(RIGHT, RIGHT, RIGHT))
    assert (env.agent_pos[0, :, 0] > agents[:, 0]).all()
    np.testing.assert_allclose(env.landmark_pos[0], landmarks, atol=1e-6)
    assert (step.rewards["agent"][0] < 0).all()


def test_predator_prey_evasion_and_capture():
    env = make("shoal/predator-prey-v0")
    assert isinstance(env, PredatorPreyEnv) and env.max_episode_steps == 50
    # agents to the left, symmetric about the x axis: the prey steps 0.1 along +x
    env.set_positions(
        0,
        agent_pos=[[-1, 0], [-1, 0.5], [-1, -0.5]],
        agent_vel=0.0,
        landmark_pos=[[0, 0], [1.5, 1.5]],
    )
    step = env.step(act(NOOP, NOOP, NOOP))
    np.testing.assert_allclose(env.landmark_pos[0, 0], [0.1, 0], atol=1e-6)
    assert np.all(np.abs(env.landmark_pos[0]) <= 1.5)
    cover = 1.1 + min(dist(a, env.landmark_pos[0, 1]) for a in env.agent_pos[0])
    np.testing.assert_allclose(step.rewards["agent"][0], [-cover] * 3, atol=1e-5)

    # prey 0 surrounded at 0.18 (agents 0.31 apart, no collision): caught whatever it does
    angles = np.array([90, 210, 330]) * np.pi / 180
    ring = np.stack([np.cos(angles), np.sin(angles)], 1) * 0.18
    env.set_positions(0, agent_pos=ring, agent_vel=0.0, landmark_pos=[[0, 0], [1.4, -1.4]])
    step = env.step(act(NOOP, NOOP, NOOP))
    r = step.rewards["agent"][0]
    # +10, minus the cover distance of the moved prey 0 (< 0.28 after its 0.1 step)
    far = min(dist(a, env.landmark_pos[0, 1]) for a in env.agent_pos[0])
    assert np.allclose(r, r[0]) and 10 - far - 0.28 < r[0] < 10 - far - 0.08
    # the captured prey respawned in [-1, 1]^2, away from the ring
    assert np.all(np.abs(env.landmark_pos[0, 0]) <= 1.0)


# ----------------------------------------------------------------- episodes


def test_truncation_then_next_step_autoreset_and_returns():
    env = make("shoal/cn-v1-v0", num_envs=4)
    rewards = []
    for t in range(1, 26):
        step = env.step(act(RIGHT, LEFT, UP, num_envs=4))
        rewards.append(step.rewards["agent"])
        assert step.active["agent"].all() and not step.autoreset.any()
        assert not step.terminated["agent"].any()
        assert step.truncated["agent"].all() == (t == 25)
    assert step.episode_lengths.tolist() == [25] * 4
    total = np.sum(rewards, axis=0)
    for i in range(3):
        np.testing.assert_allclose(step.episode_returns[f"agent_{i}"], total[:, i], rtol=1e-5)
    final = step.obs["agent"]
    step = env.step(act(RIGHT, LEFT, UP, num_envs=4))
    assert step.autoreset.all() and not step.active["agent"].any()
    assert not step.truncated["agent"].any() and (step.rewards["agent"] == 0).all()
    assert len(step.episode_lengths) == 0 and not np.array_equal(step.obs["agent"], final)
    assert (env.t == 0).all() and (env.agent_vel == 0).all()
    step = env.step(act(RIGHT, LEFT, UP, num_envs=4))
    assert step.active["agent"].all() and (env.t == 1).all()


def test_max_episode_steps_override_and_registry():
    env = make("shoal/push-forward-v0", num_envs=2, steps=3)
    for _ in range(3):
        step = env.step(act(NOOP, NOOP, NOOP, num_envs=2))
    assert step.truncated["agent"].all()
    for env_id in IDS:
        env = make(env_id, num_envs=2)
        assert isinstance(env, MultiAgentVectorEnv)
        group = env.groups["agent"]
        assert group.agents == ("agent_0", "agent_1", "agent_2")
        assert group.action_space == gym.spaces.Discrete(5)
        obs, state = env.reset(seed=1)
        assert obs["agent"].shape == (2, 3, *group.observation_space.shape)
        assert obs["agent"].dtype == np.float32 and state.shape == (2, env.state_dim)
    with pytest.raises(ConfigError):
        make("shoal/spread-v0", message_dim=1)  # messages need continuous actions
    with pytest.raises(ConfigError):
        make("shoal/cn-v1-v0", capture_radius=1.0)
    assert make("shoal/predator-prey-v0", capture_radius=0.5).capture_radius == 0.5


def test_reset_is_deterministic():
    a, b, c = (make("shoal/spread-v0", num_envs=3) for _ in range(3))
    oa, sa = a.reset(seed=7)
    ob, sb = b.reset(seed=7)
    oc, _ = c.reset(seed=8)
    np.testing.assert_array_equal(oa["agent"], ob["agent"])
    np.testing.assert_array_equal(sa, sb)
    assert not np.array_equal(oa["agent"], oc["agent"])


# ----------------------------------------------------------------- actions and messages


def test_continuous_matches_discrete_and_messages_reach_the_others():
    discrete = make("shoal/spread-v0", num_envs=2)
    cont = make("shoal/spread-v0", num_envs=2, continuous=True, message_dim=3)
    assert cont.groups["agent"].action_space == gym.spaces.Box(-1, 1, (5,), np.float32)
    assert cont.groups["agent"].observation_space.shape == (14 + 2 * 3,)
    cont.set_state({**discrete.get_state(), "messages": np.zeros((2, 3, 3), np.float32)})
    actions = np.zeros((2, 3, 5), np.float32)
    actions[:, 0, 0] = 1.0  # agent 0: right, like discrete action 2
    actions[:, 1, 1] = -3.0  # agent 1: down, clipped to -1
    actions[:, 0, 2:] = [0.1, -0.2, 5.0]  # agent 0's message (clipped to 1)
    a = discrete.step(act(RIGHT, DOWN, NOOP, num_envs=2))
    b = cont.step({"agent": actions})
    np.testing.assert_allclose(b.obs["agent"][..., :14], a.obs["agent"], atol=1e-6)
    np.testing.assert_allclose(b.rewards["agent"], a.rewards["agent"], atol=1e-6)
    # agent 1 sees others [0, 2]: agent 0's message first; agent 0 does not see its own
    np.testing.assert_allclose(b.obs["agent"][:, 1, 14:17], [[0.1, -0.2, 1.0]] * 2, atol=1e-6)
    np.testing.assert_allclose(b.obs["agent"][:, 2, 14:17], [[0.1, -0.2, 1.0]] * 2, atol=1e-6)
    assert (b.obs["agent"][:, 0, 14:] == 0).all()
    np.testing.assert_allclose(b.state[:, 24:27], [[0.1, -0.2, 1.0]] * 2, atol=1e-6)


# ----------------------------------------------------------------- batch equivalence


def reference_step(env, b, pos, vel, lms, actions):
    """One env, plain loops over entities, float64, from the module doc's formulas.
    Returns new agent positions, velocities, landmark positions, rewards (before any
    predator-prey respawn) and the captured preys."""
    n, m = len(pos), len(lms)
    pos, vel, lms = [list(p) for p in pos], [list(v) for v in vel], [list(p) for p in lms]
    force = []
    for i in range(n):
        if env.continuous:
            u = [min(max(float(x), -1.0), 1.0) for x in actions[i][:2]]
        else:
            u = [[0, 0], [-1, 0], [1, 0], [0, -1], [0, 1]][int(actions[i])]
        force.append([5.0 * u[0], 5.0 * u[1]])
    for i in range(n):
        for j in range(n):
            if i == j:
                continue
            d = dist(pos[i], pos[j])
            k = 1e-3
            pen = k * np.logaddexp(0, -(d - 0.3) / k)
            for c in range(2):
                force[i][c] += 100.0 * pen * (pos[i][c] - pos[j][c]) / d
    old = [p[:] for p in pos]
    for i in range(n):
        for c in range(2):
            vel[i][c] = vel[i][c] * 0.75 + force[i][c] * 0.1
            pos[i][c] += vel[i][c] * 0.1
    bonus = 0.0
    caught = []
    if isinstance(env, PushForwardEnv):
        import itertools

        zones = any(
            all(dist(old[i], lms[p[i]]) <= 0.25 for i in range(n))
            for p in itertools.permutations(range(m), n)
        )
        if zones and all(pos[i][0] > old[i][0] for i in range(n)):
            bonus = 10.0
            for lm in lms:
                lm[0] += 0.05
    if isinstance(env, PredatorPreyEnv):
        for lm in lms:
            best, best_total = None, -1.0
            for a in range(16):
                cand = [
                    lm[0] + 0.1 * math.cos(a * math.pi / 8),
                    lm[1] + 0.1 * math.sin(a * math.pi / 8),
                ]
                cand = [min(max(x, -1.5), 1.5) for x in cand]
                total = sum(dist(cand, p) for p in pos)
                if total > best_total:
                    best, best_total = cand, total
            lm[:] = best
        caught = [all(dist(p, lm) <= 0.3 for p in pos) for lm in lms]
        bonus = 10.0 * sum(caught)
    cover = sum(min(dist(p, lm) for p in pos) for lm in lms)
    hits = [sum(dist(pos[i], pos[j]) < 0.3 for j in range(n) if j != i) for i in range(n)]
    if env.env_id == "shoal/spread-v0":
        rewards = [-0.5 * cover - 0.5 * h for h in hits]
    else:
        rewards = [-cover - h + bonus for h in hits]
    if isinstance(env, CooperativeNavigationV2Env):
        d = [[dist(p, lm) for lm in lms] for p in pos]
        primary = int(np.argmin([min(d[i][k] for i in range(n)) for k in range(m)]))
        secondary = sum(int(np.argmin(d[i])) != primary for i in range(n))
        rewards = [r - 10.0 * (secondary >= 2) for r in rewards]
    return pos, vel, lms, rewards, caught


@pytest.mark.parametrize("env_id", IDS)
@pytest.mark.parametrize("continuous", [False, True])
def test_batch_matches_unbatched_reference(env_id, continuous):
    kwargs = {"continuous": True, "message_dim": 1} if continuous else {}
    env = make(env_id, num_envs=8, **kwargs)
    rng = np.random.default_rng(3)
    # crowd the agents a little so that collisions happen
    env.set_positions(agent_pos=env.agent_pos * 0.4)
    for _ in range(6):
        if continuous:
            actions = rng.uniform(-1.2, 1.2, (8, 3, 3)).astype(np.float32)
        else:
            actions = rng.integers(0, 5, (8, 3))
        before = [a.copy() for a in (env.agent_pos, env.agent_vel, env.landmark_pos)]
        step = env.step({"agent": actions})
        for b in (0, 5):
            pos, vel, lms, rewards, caught = reference_step(
                env, b, before[0][b], before[1][b], before[2][b], actions[b]
            )
            np.testing.assert_allclose(env.agent_pos[b], pos, atol=1e-4)
            np.testing.assert_allclose(env.agent_vel[b], vel, atol=1e-3)
            np.testing.assert_allclose(step.rewards["agent"][b], rewards, atol=1e-3)
            for lm in range(len(lms)):
                if not (caught and caught[lm]):
                    np.testing.assert_allclose(env.landmark_pos[b, lm], lms[lm], atol=1e-4)
            if continuous:
                np.testing.assert_allclose(env.messages[b, :, 0], np.clip(actions[b, :, 2], -1, 1))


# ----------------------------------------------------------------- snapshots, rendering


@pytest.mark.parametrize("env_id", ["shoal/spread-v0", "shoal/predator-prey-v0"])
def test_get_set_state_continues_identically(env_id):
    env = make(env_id, num_envs=4, steps=5)
    rng = np.random.default_rng(0)
    actions = [{"agent": rng.integers(0, 5, (4, 3))} for _ in range(16)]
    for a in actions[:3]:
        env.step(a)
    snapshot = env.get_state()
    first = [env.step(a) for a in actions[3:]]  # crosses episode ends: autoreset draws
    other = make(env_id, num_envs=4, steps=5)
    other.set_state(snapshot)
    second = [other.step(a) for a in actions[3:]]
    for x, y in zip(first, second, strict=True):
        np.testing.assert_array_equal(x.obs["agent"], y.obs["agent"])
        np.testing.assert_array_equal(x.rewards["agent"], y.rewards["agent"])
        np.testing.assert_array_equal(x.state, y.state)
        np.testing.assert_array_equal(x.autoreset, y.autoreset)
        for agent in ("agent_0", "agent_1", "agent_2"):
            np.testing.assert_array_equal(x.episode_returns[agent], y.episode_returns[agent])
    assert any(s.autoreset.any() for s in first)


@pytest.mark.parametrize("env_id", IDS)
def test_render_frame(env_id):
    env = make(env_id, num_envs=2)
    frame = env.render()
    assert frame.shape == (250, 250, 3) and frame.dtype == np.uint8
    agent_color = np.all(frame == [89, 89, 217], axis=2)
    assert agent_color.sum() > 100 and (frame != 255).any(axis=2).sum() > agent_color.sum()
    env.set_positions(0, agent_pos=[[3, 0], [-3, 0], [0, 2.5]])  # view grows to show them
    assert np.all(env.render() == [89, 89, 217], axis=2).sum() > 100
    env.close()
