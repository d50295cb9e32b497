"""PettingZoo parallel envs as shoal multi-agent vector envs.

``make_multi_agent_env`` sends ids of the form ``pettingzoo:<module>`` here, where ``<module>``
is an importable PettingZoo env module with a ``parallel_env()`` constructor, e.g.
``pettingzoo:mpe2.simple_spread_v3`` or ``pettingzoo:pettingzoo.butterfly.cooperative_pong_v5``.
``EnvConfig.num_envs`` copies are stepped one after the other in Python (PettingZoo envs are
not vectorized).

*Groups.* Agents are grouped by their id without its trailing ``_<number>``
(``adversary_0, adversary_1, agent_0`` -> groups ``adversary`` and ``agent``), or by an explicit
mapping in ``EnvConfig.kwargs["agent_groups"]``, written ``"adversary_0:red,adversary_1:red,
agent_0:blue"`` (config kwargs are scalars). Agents of a group must share their spaces; within a
group they keep the order of ``possible_agents``.

*Observations.* Observation spaces with a shape and dtype (Box, Discrete, MultiDiscrete,
MultiBinary) are supported. A Dict observation with keys ``"observation"`` and
``"action_mask"`` (the PettingZoo convention) is split: the group's observations are the
``"observation"`` part and ``MultiAgentStep.action_mask`` holds the masks (``[B, N, A]`` bool,
for the groups that have masks). The global state comes from ``env.state()`` when the env
declares a ``state_space`` (the MPE envs do).

*Turn-based (AEC) envs.* A module with an ``env()`` constructor and no ``parallel_env()``
(PettingZoo's classic board games: ``pettingzoo:pettingzoo.classic.tictactoe_v3``,
``connect_four_v3``) is stepped through `TurnBasedParallel`: at each step only the agent whose
turn it is acts (``active``), the others wait (``active`` False, their actions ignored). Unlike
agents that are done, waiting agents receive the rewards the step gives them (a player loses
on the opponent's move), so returns count them and advantage estimates credit them to that
agent's last move. Board games report legal moves through their masked observations, and a
waiting player's mask is empty.

*Episodes.* An agent that leaves ``env.agents`` while others play on stays in the arrays with
``active`` False, reward 0 and its last observation frozen. An env's episode ends when no agent
is left (or every remaining one is terminated or truncated) or when ``max_episode_steps`` is
reached (the adapter truncates the remaining agents itself if the env does not take
``max_cycles``); its next ``step`` resets it (next-step autoreset).
"""

from __future__ import annotations

import difflib
import importlib
import inspect
import pkgutil
import re
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import gymnasium as gym
import numpy as np

from shoal.core.errors import ConfigError, ShoalError, UnsupportedSpaceError
from shoal.envs.multi_agent import PETTINGZOO_PREFIX, AgentGroup, EpisodeTracker, MultiAgentStep
from shoal.envs.snapshot import EnvStateUnsupported
from shoal.envs.turn_based import TurnBasedParallel

if TYPE_CHECKING:
    from shoal.config import EnvConfig

__all__ = ["PettingZooVectorEnv", "make_pettingzoo_env", "parse_agent_groups"]

INSTALL_HINT = (
    "install the PettingZoo extra: pip install 'shoal[pettingzoo]' (it brings pettingzoo and "
    "the MPE envs of mpe2); other families need their own extras, e.g. "
    "pip install 'pettingzoo[butterfly]'"
)
_NUMBERED = re.compile(r"^(.+)_(\d+)$")


def parse_agent_groups(spec: str | Mapping[str, str]) -> dict[str, str]:
    """``"a_0:red,a_1:red,b_0:blue"`` (or a dict) -> ``{agent id: group name}``."""
    if isinstance(spec, Mapping):
        return {str(agent): str(group) for agent, group in spec.items()}
    mapping: dict[str, str] = {}
    for entry in str(spec).split(","):
        if not entry.strip():
            continue
        agent, sep, group = (part.strip() for part in entry.partition(":"))
        if not sep or not agent or not group:
            raise ConfigError(
                f"agent_groups entry {entry.strip()!r} is invalid: write agent:group pairs "
                "separated by commas, e.g. 'adversary_0:red,adversary_1:red,agent_0:blue'"
            )
        if agent in mapping:
            raise ConfigError(f"agent_groups maps agent {agent!r} twice")
        mapping[agent] = group
    if not mapping:
        raise ConfigError("agent_groups is empty: write e.g. 'adversary_0:red,agent_0:blue'")
    return mapping


def default_group(agent: str) -> str:
    """The agent id without a trailing ``_<number>`` (the id itself when it has none)."""
    match = _NUMBERED.match(agent)
    return match.group(1) if match else agent


def _is_masked_dict(space: gym.Space) -> bool:
    return isinstance(space, gym.spaces.Dict) and {"observation", "action_mask"} <= set(
        space.spaces
    )


def _array_spec(space: gym.Space, what: str, agents: Sequence[str]) -> tuple[tuple, np.dtype]:
    if space.shape is None or space.dtype is None or isinstance(space, gym.spaces.Dict):
        raise UnsupportedSpaceError(
            f"{what} space {space} of agents {', '.join(agents)} is not supported: PettingZoo "
            "envs need Box, Discrete, MultiDiscrete or MultiBinary spaces (or a Dict with "
            "'observation' and 'action_mask')"
        )
    return tuple(space.shape), np.dtype(space.dtype)


class PettingZooVectorEnv:
    """``num_envs`` copies of a PettingZoo ``ParallelEnv`` behind `MultiAgentVectorEnv`.

    ``env_fn(index)`` builds the copy ``index`` (the first one may get a render mode).
    ``agent_groups``: ``{agent id: group}`` or its string form; default: by id prefix.
    ``max_episode_steps``: truncate episodes after that many steps (None: the env's own limit).
    """

    def __init__(
        self,
        env_fn: Callable[[int], Any],
        num_envs: int,
        agent_groups: str | Mapping[str, str] | None = None,
        max_episode_steps: int | None = None,
        render_mode: str | None = None,
    ):
        if num_envs < 1:
            raise ConfigError(f"num_envs = {num_envs} is invalid: must be >= 1")
        self.num_envs = num_envs
        self.render_mode = render_mode
        self.max_episode_steps = max_episode_steps
        self.envs = [env_fn(index) for index in range(num_envs)]
        env = self.envs[0]
        possible = getattr(env, "possible_agents", None)
        if not possible:
            raise ShoalError(
                f"{type(env).__name__} has no possible_agents: shoal needs the full list of "
                "agents of a PettingZoo parallel env before reset"
            )
        self.possible_agents: tuple[str, ...] = tuple(possible)
        self.groups = self._make_groups(env, agent_groups)
        self._where = {
            agent: (name, index)
            for name, group in self.groups.items()
            for index, agent in enumerate(group.agents)
        }
        self._masked = {
            name: _is_masked_dict(env.observation_space(group.agents[0]))
            for name, group in self.groups.items()
        }
        self.state_space: gym.Space | None = getattr(env, "state_space", None)
        self.turn_based = isinstance(env, TurnBasedParallel)
        """A turn-based game (an AEC env): evaluation reports each seat's wins, draws and
        losses."""

        b = num_envs
        self._obs: dict[str, np.ndarray] = {}
        self._masks: dict[str, np.ndarray] = {}
        for name, group in self.groups.items():
            shape, dtype = _array_spec(group.observation_space, "observation", group.agents)
            self._obs[name] = np.zeros((b, group.size, *shape), dtype)
            if self._masked[name]:
                mask_space = env.observation_space(group.agents[0])["action_mask"]
                self._masks[name] = np.ones((b, group.size, *mask_space.shape), bool)
            _array_spec(group.action_space, "action", group.agents)
        self._state: np.ndarray | None = None
        if self.state_space is not None:
            shape, dtype = _array_spec(self.state_space, "state", ["(global state)"])
            self._state = np.zeros((b, *shape), dtype)
        self._alive = {name: np.zeros((b, g.size), bool) for name, g in self.groups.items()}
        self._needs_reset = np.zeros(b, bool)
        self._steps = np.zeros(b, np.int64)
        self._tracker = EpisodeTracker(b, self.groups)

    # --- construction -----------------------------------------------------------------

    def _make_groups(
        self, env: Any, agent_groups: str | Mapping[str, str] | None
    ) -> dict[str, AgentGroup]:
        if agent_groups is None:
            mapping = {agent: default_group(agent) for agent in self.possible_agents}
        else:
            mapping = parse_agent_groups(agent_groups)
            unknown = [agent for agent in mapping if agent not in self.possible_agents]
            missing = [agent for agent in self.possible_agents if agent not in mapping]
            if unknown:
                raise ConfigError(
                    f"agent_groups names unknown agents {', '.join(unknown)}; the env's agents "
                    f"are {', '.join(self.possible_agents)}"
                )
            if missing:
                raise ConfigError(
                    f"agent_groups leaves out agents {', '.join(missing)}: map every agent of "
                    f"{', '.join(self.possible_agents)} to a group"
                )
        members: dict[str, list[str]] = {}
        for agent in self.possible_agents:
            members.setdefault(mapping[agent], []).append(agent)
        groups: dict[str, AgentGroup] = {}
        for name, agents in members.items():
            obs_spaces = [env.observation_space(agent) for agent in agents]
            act_spaces = [env.action_space(agent) for agent in agents]
            for what, spaces in (("observation", obs_spaces), ("action", act_spaces)):
                different = [a for a, s in zip(agents, spaces, strict=True) if s != spaces[0]]
                if different:
                    raise UnsupportedSpaceError(
                        f"agents of group {name!r} must share {what} spaces, but "
                        f"{agents[0]} has {spaces[0]} and {', '.join(different)} "
                        f"{'has' if len(different) == 1 else 'have'} "
                        f"{spaces[agents.index(different[0])]}; put them in different groups "
                        "with EnvConfig.kwargs agent_groups, e.g. "
                        f"'{agents[0]}:{name}_a,{different[0]}:{name}_b,...'"
                    )
            obs_space = obs_spaces[0]
            if _is_masked_dict(obs_space):
                obs_space = obs_space["observation"]
            groups[name] = AgentGroup(name, tuple(agents), obs_space, act_spaces[0])
        return groups

    # --- helpers ----------------------------------------------------------------------

    def _write_obs(self, i: int, obs: Mapping[str, Any]) -> None:
        for agent, value in obs.items():
            where = self._where.get(agent)
            if where is None:
                continue  # extra keys (e.g. "common") are not agents
            name, j = where
            if self._masked[name]:
                self._masks[name][i, j] = np.asarray(value["action_mask"], bool)
                value = value["observation"]
            self._obs[name][i, j] = value

    def _write_state(self, i: int) -> None:
        if self._state is not None:
            self._state[i] = self.envs[i].state()

    def _reset_env(self, i: int, seed: int | None) -> None:
        env = self.envs[i]
        obs, _ = env.reset(seed=seed)
        for name in self.groups:
            self._obs[name][i] = 0
            self._alive[name][i] = False
            if self._masked[name]:
                self._masks[name][i] = True
        for agent in env.agents:
            if agent in self._where:
                name, j = self._where[agent]
                self._alive[name][i, j] = True
        self._write_obs(i, obs)
        self._write_state(i)
        self._needs_reset[i] = False
        self._steps[i] = 0

    def _is_alive(self, i: int, agent: str) -> bool:
        name, j = self._where[agent]
        return bool(self._alive[name][i, j])

    def _action(self, space: gym.Space, value: np.ndarray) -> Any:
        if isinstance(space, gym.spaces.Discrete):
            return np.int64(value)
        return np.asarray(value, space.dtype).reshape(space.shape)

    def _copy_obs(self) -> dict[str, np.ndarray]:
        return {name: obs.copy() for name, obs in self._obs.items()}

    def _copy_masks(self) -> dict[str, np.ndarray] | None:
        return {name: m.copy() for name, m in self._masks.items()} if self._masks else None

    # --- protocol ---------------------------------------------------------------------

    def reset(self, seed: int | None = None) -> tuple[dict[str, np.ndarray], np.ndarray | None]:
        for i in range(self.num_envs):
            self._reset_env(i, None if seed is None else seed + i)
        self._tracker = EpisodeTracker(self.num_envs, self.groups)
        return self._copy_obs(), None if self._state is None else self._state.copy()

    @property
    def action_mask(self) -> dict[str, np.ndarray] | None:
        """``[B, N, A]`` legal actions at the current observations, for groups with masks."""
        return self._copy_masks()

    def step(self, actions: dict[str, np.ndarray]) -> MultiAgentStep:
        b = self.num_envs
        shape = {name: (b, g.size) for name, g in self.groups.items()}
        rewards = {name: np.zeros(s, np.float32) for name, s in shape.items()}
        terminated = {name: np.zeros(s, bool) for name, s in shape.items()}
        truncated = {name: np.zeros(s, bool) for name, s in shape.items()}
        active = {name: np.zeros(s, bool) for name, s in shape.items()}
        autoreset = self._needs_reset.copy()
        ended = np.zeros(b, bool)
        group_actions = {name: np.asarray(a) for name, a in actions.items()}
        for i, env in enumerate(self.envs):
            if autoreset[i]:
                self._reset_env(i, None)
                continue
            acting = [a for a in env.agents if a in self._where and self._is_alive(i, a)]
            action_dict = {}
            for agent in acting:
                name, j = self._where[agent]
                action_dict[agent] = self._action(
                    self.groups[name].action_space, group_actions[name][i, j]
                )
                active[name][i, j] = True
            obs, rew, term, trunc, _ = env.step(action_dict)
            turn_based = isinstance(env, TurnBasedParallel)
            if turn_based:  # only the agent whose turn it was acted; the others waited
                for agent in acting:
                    name, j = self._where[agent]
                    active[name][i, j] = agent == env.last_actor
            self._steps[i] += 1
            self._write_obs(i, obs)
            self._write_state(i)
            remaining = set(env.agents)
            for agent in acting:
                name, j = self._where[agent]
                rewards[name][i, j] = rew.get(agent, 0.0)
                terminated[name][i, j] = bool(term.get(agent, False))
                truncated[name][i, j] = bool(trunc.get(agent, False))
            for agent in self.possible_agents:
                name, j = self._where[agent]
                done = terminated[name][i, j] or truncated[name][i, j]
                self._alive[name][i, j] = agent in remaining and not done
            still = [agent for agent in acting if self._is_alive(i, agent)]
            if (
                still
                and self.max_episode_steps is not None
                and self._steps[i] >= self.max_episode_steps
            ):
                for agent in still:
                    name, j = self._where[agent]
                    truncated[name][i, j] = True
                    self._alive[name][i, j] = False
                still = []
            if not any(self._alive[name][i].any() for name in self.groups):
                ended[i] = True
                self._needs_reset[i] = True
        returns, lengths = self._tracker.update(rewards, ~autoreset, ended)
        return MultiAgentStep(
            obs=self._copy_obs(),
            rewards=rewards,
            terminated=terminated,
            truncated=truncated,
            active=active,
            autoreset=autoreset,
            state=None if self._state is None else self._state.copy(),
            episode_returns=returns,
            episode_lengths=lengths,
            action_mask=self._copy_masks(),
        )

    def render(self) -> np.ndarray | None:
        if self.render_mode != "rgb_array":
            return None
        frame = self.envs[0].render()
        return None if frame is None else np.asarray(frame)

    def get_state(self) -> dict[str, Any]:
        raise EnvStateUnsupported(
            "PettingZoo envs cannot be snapshotted: their state lives in arbitrary objects "
            "(often native simulators); checkpoints of runs on them do not include the envs"
        )

    def set_state(self, state: dict[str, Any]) -> None:
        raise EnvStateUnsupported("PettingZoo envs cannot be restored from a snapshot")

    def close(self) -> None:
        for env in self.envs:
            env.close()


def _import_env_module(path: str) -> Any:
    try:
        return importlib.import_module(path)
    except ModuleNotFoundError as exc:
        missing = exc.name or path
        hint = ""
        parent, _, leaf = path.rpartition(".")
        if missing == path and parent:
            try:
                package = importlib.import_module(parent)
                names = [m.name for m in pkgutil.iter_modules(getattr(package, "__path__", []))]
                close = difflib.get_close_matches(leaf, names, n=3)
                if close:
                    hint = f" Did you mean {', '.join(f'{parent}.{c}' for c in close)}?"
            except ImportError:
                pass
        if not hint:
            hint = f" To {INSTALL_HINT}."
        raise ShoalError(
            f"cannot import PettingZoo env module {path!r}: no module named {missing!r}.{hint}"
        ) from exc
    except ImportError as exc:
        raise ShoalError(
            f"cannot import PettingZoo env module {path!r}: {exc}. To {INSTALL_HINT}."
        ) from exc


def _accepts(fn: Callable[..., Any], keyword: str) -> bool | None:
    """Whether ``fn`` takes ``keyword``; None when its signature does not say (``**kwargs``)."""
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return None
    if keyword in params:
        return True
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return None
    return False


def make_pettingzoo_env(
    env_config: EnvConfig, render_mode: str | None = None
) -> PettingZooVectorEnv:
    """Build `PettingZooVectorEnv` for ``env_config.id == "pettingzoo:<module>"``.

    ``env_config.kwargs`` go to the module's ``parallel_env()``, except ``agent_groups`` (see
    the module doc). ``max_episode_steps`` becomes ``max_cycles`` when the env takes it, and is
    enforced by the adapter either way. ``render_mode`` goes to the first env only.
    """
    if not env_config.id.startswith(PETTINGZOO_PREFIX):
        raise ShoalError(f"{env_config.id!r} is not a PettingZoo id ({PETTINGZOO_PREFIX}<module>)")
    path = env_config.id[len(PETTINGZOO_PREFIX) :]
    if not path:
        raise ShoalError(
            f"{env_config.id!r} names no module: write e.g. "
            f"{PETTINGZOO_PREFIX}mpe2.simple_spread_v3"
        )
    module = _import_env_module(path)
    constructor = getattr(module, "parallel_env", None)
    if not callable(constructor) and callable(getattr(module, "env", None)):
        aec = module.env  # a turn-based (AEC) env: stepped one move at a time

        def constructor(**kwargs: Any) -> TurnBasedParallel:
            return TurnBasedParallel(aec(**kwargs))

    if not callable(constructor):
        raise ShoalError(
            f"module {path!r} has no parallel_env() or env(): a PettingZoo id names an env "
            f"module, e.g. {PETTINGZOO_PREFIX}mpe2.simple_spread_v3 or "
            f"{PETTINGZOO_PREFIX}pettingzoo.classic.tictactoe_v3"
        )
    kwargs: dict[str, Any] = dict(env_config.kwargs)
    agent_groups = kwargs.pop("agent_groups", None)
    if render_mode is None:
        render_mode = kwargs.pop("render_mode", None)
    else:
        kwargs.pop("render_mode", None)
    max_steps = env_config.max_episode_steps
    if max_steps is not None and _accepts(constructor, "max_cycles") is not False:
        kwargs["max_cycles"] = max_steps

    def build(index: int) -> Any:
        extra = {"render_mode": render_mode} if index == 0 and render_mode is not None else {}
        try:
            return constructor(**kwargs, **extra)
        except TypeError as exc:
            if "max_cycles" in kwargs and "max_cycles" in str(exc):
                # The env has no max_cycles; the adapter enforces max_episode_steps itself.
                del kwargs["max_cycles"]
                return constructor(**kwargs, **extra)
            raise ShoalError(f"{path}.parallel_env({kwargs}) failed: {exc}") from exc

    return PettingZooVectorEnv(
        build,
        env_config.num_envs,
        agent_groups=agent_groups,
        max_episode_steps=max_steps,
        render_mode=render_mode,
    )
