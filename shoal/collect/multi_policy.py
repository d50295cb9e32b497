"""Several policies acting in one multi-agent env: the acting side of MAPPO and IPPO with a
policy map (`shoal.envs.policy_map`).

Each learned policy sees its agents as rows of its own batch, in `AgentRows`' layout (own
observation, agent one-hot, critic-only global state), and fills its own `RolloutStorage`
``[T, B * N_p, ...]`` while the `MultiAgentRunner` steps the env: a rollout of the runner is
one PPO rollout per policy. Groups with fixed policies (``env.opponents``) act through
`shoal.envs.opponents`. An agent that is done while its env goes on fills masked rows (marked
like autoreset steps: not real transitions), as `AgentsAsBatch` does for one group.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import gymnasium as gym
import numpy as np
import torch

from shoal.collect.multi_agent import FixedGroups, JointObs
from shoal.collect.self_play import SelfPlaySeats
from shoal.core.types import Rollout, StepResult
from shoal.data.rollout import RolloutStorage
from shoal.envs.agents_as_batch import AgentRows
from shoal.envs.multi_agent import AgentGroup, MultiAgentStep, episode_ended
from shoal.envs.policy_map import PolicyAgents, empty_actions
from shoal.envs.shapes import shape_of
from shoal.fast import backend

_NO_EPISODES = np.zeros(0)


def policy_rows(
    policies: Mapping[str, PolicyAgents],
    state_space: gym.Space | None,
    agent_id: bool,
    global_state: bool,
) -> dict[str, AgentRows]:
    """Each policy's row layout (the agent one-hot counts the policy's own agents)."""
    return {
        name: AgentRows(p.observation_space, p.size, state_space, agent_id, global_state)
        for name, p in policies.items()
    }


class MultiPolicyActing:
    """The `MultiAgentRunner`'s acting side for several PPO-style policies.

    Args:
        groups: the env's groups.
        policies: the learned policies' agents.
        rows: each policy's row layout (`policy_rows`).
        models: each policy's acting network (a CPU copy; `set_weights` loads into it).
        opponents: the fixed policies of the other groups.
        num_steps, num_envs: the rollout's ``T`` and ``B``.
        masked: the env reports legal actions (stored with the rollouts, used in acting).
        acting: the ``model.backend`` the networks act with (`shoal.fast.backend.actor`).
    """

    def __init__(
        self,
        groups: Mapping[str, AgentGroup],
        policies: Mapping[str, PolicyAgents],
        rows: Mapping[str, AgentRows],
        models: Mapping[str, Any],
        opponents: FixedGroups,
        num_steps: int,
        num_envs: int,
        masked: bool,
        acting: str = "auto",
        self_play: tuple[str, SelfPlaySeats] | None = None,
    ):
        self.groups, self.policies, self.rows = groups, policies, rows
        self.models, self.opponents = models, opponents
        self.num_envs, self.masked = num_envs, masked
        self.actors = {
            name: backend.actor(m, "torch" if masked else acting) for name, m in models.items()
        }
        self.storage = {
            name: RolloutStorage(
                num_steps,
                num_envs * p.size,
                rows[name].observation_space,
                p.action_space,
                action_mask=masked,
            )
            for name, p in policies.items()
        }
        self.t = 0
        self._pending: dict[str, Any] = {}
        self.self_play = self_play
        """``(policy, seats)``: that policy plays one seat per env, snapshots the others."""

    def _obs_rows(self, name: str, view: JointObs) -> np.ndarray:
        return self.rows[name].rows(self.policies[name].gather(view.obs), view.state)

    def act(self, view: JointObs) -> dict[str, np.ndarray]:
        t, actions = self.t, empty_actions(self.groups, self.num_envs)
        masks = view.action_mask
        with torch.inference_mode():
            for name, policy in self.policies.items():
                storage, obs = self.storage[name], self._obs_rows(name, view)
                if self.masked:
                    assert masks is not None  # a masked run's env reports legal actions
                    legal = policy.gather(masks).reshape(obs.shape[0], -1)
                    tensor = storage.write_obs(t, obs)
                    mask = storage.write_action_mask(t, legal)
                    out = self.models[name].act(tensor, action_mask=mask)
                else:
                    out = self.actors[name].act(storage.write_obs_array(t, obs))
                self._pending[name] = out
                shape = shape_of(policy.action_space)
                chosen = np.asarray(out.actions).reshape(self.num_envs, policy.size, *shape)
                if self.self_play is not None and self.self_play[0] == name:
                    legal_rows = None
                    if self.masked and masks is not None:
                        legal_rows = policy.gather(masks).reshape(obs.shape[0], -1)
                    chosen = self._snapshot_moves(chosen, obs, legal_rows, self.self_play[1])
                policy.scatter(chosen, actions)
        actions.update(self.opponents.act(view))
        return actions

    def _snapshot_moves(
        self,
        chosen: np.ndarray,
        obs: np.ndarray,
        legal: np.ndarray | None,
        seats: SelfPlaySeats,
    ) -> np.ndarray:
        """``chosen`` ``[B, seats, ...]`` with the opponents' seats played by their envs'
        snapshots (sampled actions; ``obs`` and ``legal`` are the policy's rows)."""
        chosen = np.array(chosen, copy=True)
        theirs = seats.opponent_rows()
        for sid in np.unique(seats.opponent):
            envs, seat = np.nonzero(theirs & (seats.opponent == sid)[:, None])
            rows = envs * seats.seats + seat
            x = torch.as_tensor(obs[rows])
            model: Any = seats.models[int(sid)]  # an acting network (act)
            if legal is None:
                out = model.act(x)
            else:
                out = model.act(x, action_mask=torch.as_tensor(legal[rows]))
            chosen[envs, seat] = np.asarray(out.actions).reshape(chosen[envs, seat].shape)
        return chosen

    def observe(self, actions: dict[str, np.ndarray], step: MultiAgentStep) -> None:
        for name, policy in self.policies.items():

            def flat(arrays: dict[str, np.ndarray], p: PolicyAgents = policy) -> np.ndarray:
                return p.gather(arrays).reshape(-1)

            masked_rows = ~flat(step.active)
            if self.self_play is not None and self.self_play[0] == name:
                masked_rows = masked_rows | self.self_play[1].opponent_rows().reshape(-1)
            result = StepResult(
                obs=None,  # type: ignore[arg-type]  # storage writes rewards and flags only
                reward=flat(step.rewards).astype(np.float32, copy=False),
                terminated=flat(step.terminated),
                truncated=flat(step.truncated),
                autoreset=masked_rows,
                episode_returns=_NO_EPISODES,
                episode_lengths=_NO_EPISODES,
            )
            self.storage[name].write_step(self.t, self._pending[name], result)
        if self.self_play is not None:
            name, seats = self.self_play
            rewards = self.policies[name].gather(step.rewards)
            seats.finish(rewards, ~step.autoreset, episode_ended(step))
        self.t += 1

    def rollouts(self, view: JointObs) -> dict[str, Rollout]:
        """Each policy's rollout of the steps since the last call, bootstrapped from
        ``view`` (the observations after the last step)."""
        out = {}
        with torch.inference_mode():
            for name, storage in self.storage.items():
                last = np.asarray(self._obs_rows(name, view), dtype=storage.obs_dtype)
                values = self.actors[name].value(last)
                if not isinstance(values, torch.Tensor):
                    values = torch.from_numpy(np.asarray(values, dtype=np.float32))
                out[name] = storage.rollout(last_values=values)
        self.t = 0
        return out

    def set_weights(self, weights: Mapping[str, dict[str, torch.Tensor]]) -> None:
        for name, state in weights.items():
            self.models[name].load_state_dict(state)

    def get_state(self) -> dict[str, Any]:
        state: dict[str, Any] = {"opponents": self.opponents.get_state()}
        if self.self_play is not None:
            state["self_play"] = self.self_play[1].state_dict()
        return state

    def set_state(self, state: dict[str, Any]) -> None:
        self.opponents.set_state(state["opponents"])
        if self.self_play is not None:
            self.self_play[1].load_state_dict(state["self_play"])

    def begin(self, view: JointObs) -> None:
        self.t = 0
