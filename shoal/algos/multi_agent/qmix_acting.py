"""QMIX's acting parts (`shoal.algos.multi_agent.qmix`): the agent network's inputs, built
one way for acting, learning and the deployed policy, and the epsilon-greedy acting side of
the `MultiAgentRunner`; the team it trains, and a runner built in a Ray actor's process."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import gymnasium as gym
import numpy as np
import torch
from torch.nn import functional as F

from shoal.collect.multi_agent import FixedGroups, JointObs, MultiAgentRunner
from shoal.core.errors import ConfigError, UnsupportedSpaceError
from shoal.core.seeding import derive_seed
from shoal.envs.make import make_multi_agent_env
from shoal.envs.multi_agent import MultiAgentStep, MultiAgentVectorEnv
from shoal.envs.shapes import as_discrete, shape_of
from shoal.losses.q_learning import masked_argmax
from shoal.nn.mixers import RecurrentAgent


@dataclass(frozen=True)
class AgentInputs:
    """``[..., N, size]``: the flat own observation, the agent one-hot (``env.agent_id``) and
    the last action one-hot (``last_action``): the layout of `AgentsAsBatch` rows (plus the
    last action), which the deployed `RecurrentQPolicy` sees."""

    obs_shape: tuple[int, ...]
    n_agents: int
    num_actions: int
    agent_id: bool
    last_action: bool

    @property
    def size(self) -> int:
        obs = int(np.prod(self.obs_shape))
        return obs + self.n_agents * self.agent_id + self.num_actions * self.last_action

    def __call__(self, obs: torch.Tensor, last_actions: torch.Tensor | None) -> torch.Tensor:
        lead = obs.shape[: -len(self.obs_shape)]
        parts = [obs.reshape(*lead, -1)]
        if self.agent_id:
            ids = torch.eye(self.n_agents, device=obs.device)
            parts.append(ids.expand(*lead, self.n_agents))
        if self.last_action:
            assert last_actions is not None  # given whenever the inputs hold the last action
            parts.append(F.one_hot(last_actions, self.num_actions).float())
        return torch.cat(parts, -1)


class QMIXActing:
    """The acting side of the `MultiAgentRunner`: the recurrent agent network, epsilon-greedy
    among legal actions. Its GRU state and the last actions run from step to step and restart
    with each episode."""

    def __init__(
        self,
        agent: RecurrentAgent,
        inputs: AgentInputs,
        group: str,
        epsilon: float,
        seed: int,
        opponents: FixedGroups,
    ):
        self.agent, self.inputs, self.group = agent, inputs, group
        self.opponents = opponents
        """Fixed policies of the other groups (`shoal.envs.opponents`)."""
        self.rng = np.random.default_rng(seed)
        self.epsilon = epsilon
        """Exploration's epsilon, set by the learner each iteration."""
        self.hidden: torch.Tensor | None = None
        self.last_actions: np.ndarray | None = None

    def begin(self, view: JointObs) -> None:
        b, n = view.obs[self.group].shape[:2]
        self.hidden = self.agent.initial_state(b * n)
        self.last_actions = np.zeros((b, n), np.int64)

    def _state(self) -> tuple[torch.Tensor, np.ndarray]:
        """The GRU state and last actions (set by `begin` when episodes start)."""
        assert self.hidden is not None and self.last_actions is not None, "begin() comes first"
        return self.hidden, self.last_actions

    @torch.no_grad()
    def act(self, view: JointObs) -> dict[str, np.ndarray]:
        obs = np.asarray(view.obs[self.group], np.float32)
        b, n = obs.shape[:2]
        hidden, last_actions = self._state()
        inputs = self.inputs(torch.from_numpy(obs), torch.from_numpy(last_actions))
        q, self.hidden = self.agent(inputs.reshape(b * n, -1), hidden)
        q = q.view(b, n, -1)
        masks = view.action_mask
        mask = None if masks is None else torch.from_numpy(np.asarray(masks[self.group], bool))
        greedy = masked_argmax(q, mask).numpy()
        noise = torch.from_numpy(self.rng.random(tuple(q.shape), np.float32))
        random = masked_argmax(noise, mask).numpy()
        actions = {self.group: np.where(self.rng.random((b, n)) < self.epsilon, random, greedy)}
        actions.update(self.opponents.act(view))
        return actions

    def observe(self, actions: dict[str, np.ndarray], step: MultiAgentStep) -> None:
        hidden, _ = self._state()
        last_actions = self.last_actions = actions[self.group].copy()
        reset = np.repeat(step.autoreset, last_actions.shape[1])
        hidden[torch.from_numpy(reset)] = 0.0
        last_actions[step.autoreset] = 0

    def set_weights(self, weights: dict[str, torch.Tensor]) -> None:
        self.agent.load_state_dict(weights)

    def get_state(self) -> dict[str, Any]:
        hidden, last_actions = self._state()
        return {
            "hidden": hidden.clone(),
            "last_actions": last_actions.copy(),
            "rng": self.rng.bit_generator.state,
            "opponents": self.opponents.get_state(),
        }

    def set_state(self, state: dict[str, Any]) -> None:
        self.hidden = state["hidden"].clone()
        self.last_actions = np.asarray(state["last_actions"], np.int64).copy()
        self.rng.bit_generator.state = state["rng"]
        self.opponents.set_state(state.get("opponents", {}))


def team_group(env: MultiAgentVectorEnv, config: Any) -> str:
    """The cooperative team QMIX trains: the env's only group without a fixed policy."""
    names = list(env.groups)
    team = [name for name in names if name not in config.env.opponents]
    group = config.env.group or (team[0] if len(team) == 1 else None)
    if group is None or group not in team or len(team) != 1:
        guess = config.env.group if config.env.group in names else names[0]
        spec = " ".join(f"{name} random" for name in names if name != guess)
        raise ConfigError(
            f"env.group {config.env.group!r}: qmix/vdn/iql train one cooperative team, and "
            f"this env has groups {names}; choose the team with env.group and give the "
            f"others a fixed policy (--env.group {guess} --env.opponents {spec}, or a "
            "scripted module:Class), or train every group with mappo, ippo or maddpg"
        )
    learners = env.groups[group]
    if not isinstance(learners.action_space, gym.spaces.Discrete):
        raise UnsupportedSpaceError(
            f"qmix/vdn/iql need Discrete actions, got {learners.action_space}"
        )
    if not isinstance(learners.observation_space, gym.spaces.Box):
        raise UnsupportedSpaceError(
            f"qmix/vdn/iql need Box observations, not {learners.observation_space}"
        )
    if config.mixer == "qmix" and env.state_space is None:
        raise ConfigError("mixer = 'qmix' needs an env with a global state; use vdn or none")
    return group


def agent_inputs(config: Any, env: MultiAgentVectorEnv, group: str) -> AgentInputs:
    """The agent network's inputs for ``group`` of ``env`` under ``config`` (a `QMIXConfig`)."""
    spec = env.groups[group]
    num_actions = int(as_discrete(spec.action_space).n)
    obs_shape = shape_of(spec.observation_space)
    return AgentInputs(obs_shape, spec.size, num_actions, config.env.agent_id, config.last_action)


def build_acting(
    config: Any, env: MultiAgentVectorEnv, group: str, agent: RecurrentAgent, index: int
) -> QMIXActing:
    """Runner ``index``'s acting side with ``agent``: its exploration seeded
    ``derive_seed(run.seed, "explore", index)``, the fixed groups' policies seeded from
    ``run.seed`` on runner 0 (the in-process runner) and from a seed of their own elsewhere."""
    seed = config.run.seed
    opponents = FixedGroups.for_runner(config.env.opponents, env.groups, seed, index)
    inputs = agent_inputs(config, env, group)
    explore = derive_seed(seed, "explore", index)
    return QMIXActing(agent, inputs, group, config.epsilon_start, explore, opponents)


def build_runner(config: Any, index: int) -> MultiAgentRunner:
    """Runner ``index`` of a run on Ray runners: its own env, seeded as env ``index`` of the
    run, and its own copy of the agent network (weights from every ``set_weights``)."""
    env = make_multi_agent_env(config.env)
    group = team_group(env, config)
    inputs = agent_inputs(config, env, group)
    model = config.model
    agent = RecurrentAgent(
        inputs.size, model.hidden, config.rnn_hidden, inputs.num_actions, model.activation
    ).requires_grad_(False)
    acting = build_acting(config, env, group, agent, index)
    seed = derive_seed(config.run.seed, "env", index)
    return MultiAgentRunner(env, acting, config.rollout_steps, seed)
