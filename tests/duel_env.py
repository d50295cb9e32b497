"""A tiny vectorized two-group env for tests of several learning groups.

A chaser (group ``red``, one agent, continuous 1-D action) and two runners (group ``blue``,
Discrete(3): left, stay, right) move on a line. Red is rewarded for being close to the
runners, blue for being far from red: a small competitive game with different spaces per
group. Every episode lasts ``max_steps`` steps (truncated). Start positions are random,
drawn from the env's own generator, and every env saves its state exactly. Next-step
autoreset, as `shoal.envs.multi_agent` describes.
"""

import gymnasium as gym
import numpy as np

from shoal.envs.multi_agent import AgentGroup, EpisodeTracker, MultiAgentStep


class Duel:
    def __init__(self, num_envs: int, max_steps: int = 5):
        self.num_envs, self.max_steps = num_envs, max_steps
        self.groups = {
            "red": AgentGroup(
                "red",
                ("red_0",),
                gym.spaces.Box(-np.inf, np.inf, (3,), np.float32),
                gym.spaces.Box(-1.0, 1.0, (1,), np.float32),
            ),
            "blue": AgentGroup(
                "blue",
                ("blue_0", "blue_1"),
                gym.spaces.Box(-np.inf, np.inf, (2,), np.float32),
                gym.spaces.Discrete(3),
            ),
        }
        self.state_space = gym.spaces.Box(-np.inf, np.inf, (3,), np.float32)
        self.rng = np.random.default_rng(0)
        self.red = np.zeros(num_envs)
        self.blue = np.zeros((num_envs, 2))
        self.t = np.zeros(num_envs, np.int64)
        self.needs_reset = np.zeros(num_envs, bool)
        self.tracker = EpisodeTracker(num_envs, self.groups)

    def _start(self, rows: np.ndarray) -> None:
        self.red[rows] = self.rng.uniform(-1, 1, rows.size)
        self.blue[rows] = self.rng.uniform(-1, 1, (rows.size, 2))
        self.t[rows] = 0

    def _obs(self):
        progress = self.t / self.max_steps
        red = np.stack([self.red, self.blue.mean(1), progress], -1)[:, None].astype(np.float32)
        blue = np.stack([self.blue, np.repeat(self.red[:, None], 2, 1)], -1).astype(np.float32)
        state = np.concatenate([self.red[:, None], self.blue], 1).astype(np.float32)
        return {"red": red, "blue": blue}, state

    def reset(self, seed=None):
        if seed is not None:
            self.rng = np.random.default_rng(seed)
        self._start(np.arange(self.num_envs))
        self.needs_reset[:] = False
        self.tracker = EpisodeTracker(self.num_envs, self.groups)
        return self._obs()

    def step(self, actions):
        resetting = self.needs_reset.copy()
        real = ~resetting
        red_move = np.clip(np.asarray(actions["red"], np.float64)[:, 0, 0], -1, 1) * 0.2
        blue_move = (np.asarray(actions["blue"]).astype(np.int64) - 1) * 0.2
        self.red += red_move * real
        self.blue += blue_move * real[:, None]
        self.t += real
        gap = np.abs(self.blue - self.red[:, None])
        rewards = {
            "red": (-gap.mean(1, keepdims=True) * real[:, None]).astype(np.float32),
            "blue": (np.minimum(gap, 1.0) * real[:, None]).astype(np.float32),
        }
        ended = real & (self.t >= self.max_steps)
        self._start(np.flatnonzero(resetting))
        self.needs_reset = ended
        returns, lengths = self.tracker.update(rewards, real, ended)
        obs, state = self._obs()
        return MultiAgentStep(
            obs=obs,
            rewards=rewards,
            terminated={g: np.zeros((self.num_envs, s.size), bool) for g, s in self.groups.items()},
            truncated={g: np.repeat(ended[:, None], s.size, 1) for g, s in self.groups.items()},
            active={g: np.repeat(real[:, None], s.size, 1) for g, s in self.groups.items()},
            autoreset=resetting,
            state=state,
            episode_returns=returns,
            episode_lengths=lengths,
        )

    def render(self):
        return None

    def get_state(self):
        return {
            "rng": self.rng.bit_generator.state,
            "red": self.red.copy(),
            "blue": self.blue.copy(),
            "t": self.t.copy(),
            "needs_reset": self.needs_reset.copy(),
            "tracker": self.tracker.state_dict(),
        }

    def set_state(self, state):
        self.rng.bit_generator.state = state["rng"]
        self.red[:] = state["red"]
        self.blue[:] = state["blue"]
        self.t[:] = state["t"]
        self.needs_reset[:] = state["needs_reset"]
        self.tracker.load_state_dict(state["tracker"])

    def close(self):
        pass


def factory(config):
    return Duel(config.num_envs, max_steps=config.max_episode_steps or 5)


class Race:
    """A symmetric two-seat game with saveable state, for self-play tests: both players of
    group ``player`` step (1) or wait (0) at once; the first to reach ``goal`` wins (+1, the
    other -1), both at once is a draw, and a game lasts at most ``max_steps``."""

    def __init__(self, num_envs: int, goal: int = 3, max_steps: int = 6):
        self.num_envs, self.goal, self.max_steps = num_envs, goal, max_steps
        self.groups = {
            "player": AgentGroup(
                "player",
                ("player_0", "player_1"),
                gym.spaces.Box(0.0, 1.0, (2,), np.float32),
                gym.spaces.Discrete(2),
            )
        }
        self.state_space = gym.spaces.Box(0.0, 1.0, (2,), np.float32)
        self.pos = np.zeros((num_envs, 2), np.int64)
        self.t = np.zeros(num_envs, np.int64)
        self.needs_reset = np.zeros(num_envs, bool)
        self.tracker = EpisodeTracker(num_envs, self.groups)

    def _obs(self):
        mine = self.pos / self.goal
        obs = np.stack([mine, mine[:, ::-1]], -1).astype(np.float32)  # own, then the other
        return {"player": obs}, mine.astype(np.float32)

    def reset(self, seed=None):
        self.pos[:] = 0
        self.t[:] = 0
        self.needs_reset[:] = False
        self.tracker = EpisodeTracker(self.num_envs, self.groups)
        return self._obs()

    def step(self, actions):
        resetting = self.needs_reset.copy()
        real = ~resetting
        self.pos += np.asarray(actions["player"]).astype(np.int64) * real[:, None]
        self.t += real
        arrived = (self.pos >= self.goal) & real[:, None]
        won = arrived & ~arrived[:, ::-1]
        rewards = (won.astype(np.float32) - won[:, ::-1].astype(np.float32)) * real[:, None]
        over = real & (arrived.any(1) | (self.t >= self.max_steps))
        self.pos[resetting] = 0
        self.t[resetting] = 0
        self.needs_reset = over
        returns, lengths = self.tracker.update({"player": rewards}, real, over)
        obs, state = self._obs()
        terminated = np.repeat((over & arrived.any(1))[:, None], 2, 1)
        return MultiAgentStep(
            obs=obs,
            rewards={"player": rewards},
            terminated={"player": terminated},
            truncated={"player": np.repeat(over[:, None], 2, 1) & ~terminated},
            active={"player": np.repeat(real[:, None], 2, 1)},
            autoreset=resetting,
            state=state,
            episode_returns=returns,
            episode_lengths=lengths,
        )

    def render(self):
        return None

    def get_state(self):
        return {
            "pos": self.pos.copy(),
            "t": self.t.copy(),
            "needs_reset": self.needs_reset.copy(),
            "tracker": self.tracker.state_dict(),
        }

    def set_state(self, state):
        self.pos[:] = state["pos"]
        self.t[:] = state["t"]
        self.needs_reset[:] = state["needs_reset"]
        self.tracker.load_state_dict(state["tracker"])

    def close(self):
        pass


def race_factory(config):
    return Race(config.num_envs)
