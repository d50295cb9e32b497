"""A tiny vectorized multi-agent env for tests of the multi-agent plumbing.

Two agents walk right on a line of cells 0..4 (Discrete(2): stay or step right). An agent that
reaches cell 4 gets reward 1 and terminates; it is then inactive (masked) while the other walks
on. The episode ends when both have terminated or after ``max_steps`` steps (truncated). The
global state holds both positions. Next-step autoreset, as `shoal.envs.multi_agent` describes.
"""

import gymnasium as gym
import numpy as np

from shoal.envs.multi_agent import AgentGroup, EpisodeTracker, MultiAgentStep

GOAL = 4


class MALine:
    def __init__(self, num_envs: int, max_steps: int = 6, groups: int = 1, state: bool = True):
        self.num_envs, self.max_steps = num_envs, max_steps
        obs_space = gym.spaces.Box(0.0, 1.0, (1,), np.float32)
        names = ["agent", "other"][:groups]
        self.groups = {
            name: AgentGroup(name, (f"{name}_0", f"{name}_1"), obs_space, gym.spaces.Discrete(2))
            for name in names
        }
        self.state_space = gym.spaces.Box(0.0, 1.0, (2,), np.float32) if state else None
        self.pos = np.zeros((num_envs, 2), np.int64)
        self.active = np.ones((num_envs, 2), bool)
        self.t = np.zeros(num_envs, np.int64)
        self.needs_reset = np.zeros(num_envs, bool)
        self.tracker = EpisodeTracker(num_envs, {"agent": self.groups[names[0]]})

    def _obs(self):
        obs = (self.pos / GOAL).astype(np.float32)[..., None]
        state = (self.pos / GOAL).astype(np.float32) if self.state_space is not None else None
        return {name: obs.copy() for name in self.groups}, state

    def reset(self, seed=None):
        self.pos[:] = 0
        self.active[:] = True
        self.t[:] = 0
        self.needs_reset[:] = False
        return self._obs()

    def step(self, actions):
        move = np.asarray(actions[next(iter(self.groups))]).astype(np.int64)
        resetting = self.needs_reset.copy()
        acting = self.active & ~resetting[:, None]
        self.pos += move * acting
        self.pos = np.minimum(self.pos, GOAL)
        arrived = acting & (self.pos == GOAL)
        rewards = arrived.astype(np.float32)
        self.t += ~resetting
        self.active &= ~arrived
        ended = ~resetting & (~self.active.any(axis=1) | (self.t >= self.max_steps))
        truncated = acting & ~arrived & ended[:, None]
        self.active &= ~truncated
        # Next-step autoreset: envs that ended last step restart now.
        self.pos[resetting] = 0
        self.active[resetting] = True
        self.t[resetting] = 0
        self.needs_reset = ended
        returns, lengths = self.tracker.update({"agent": rewards}, ~resetting, ended)
        obs, state = self._obs()
        group = {name: None for name in self.groups}
        return MultiAgentStep(
            obs=obs,
            rewards={name: rewards for name in group},
            terminated={name: arrived for name in group},
            truncated={name: truncated for name in group},
            active={name: acting for name in group},
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
            "active": self.active.copy(),
            "t": self.t.copy(),
            "needs_reset": self.needs_reset.copy(),
            "tracker": self.tracker.state_dict(),
        }

    def set_state(self, state):
        self.pos[:] = state["pos"]
        self.active[:] = state["active"]
        self.t[:] = state["t"]
        self.needs_reset[:] = state["needs_reset"]
        self.tracker.load_state_dict(state["tracker"])

    def close(self):
        pass


def factory(config):
    kwargs = dict(config.kwargs)
    return MALine(
        config.num_envs,
        max_steps=config.max_episode_steps or 6,
        groups=int(kwargs.get("groups", 1)),
        state=bool(kwargs.get("state", True)),
    )
