"""The vector-environment protocol every sampler steps."""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

import gymnasium as gym
import numpy as np

from shoal.core.errors import ShoalError
from shoal.core.types import StepResult


@runtime_checkable
class VectorEnv(Protocol):
    """A batch of ``num_envs`` environments stepped together.

    Spaces describe one environment; arrays carry a leading ``[num_envs]`` axis. Autoreset
    follows Gymnasium's next-step convention, described on `shoal.core.types.StepResult`.
    Multi-agent environments (`shoal.envs.multi_agent`) enter as `AgentsAsBatch`, one row per
    (env, agent) pair.
    """

    # Read-only members (properties), so an env may hold any narrower type in them.
    @property
    def num_envs(self) -> int: ...

    @property
    def observation_space(self) -> gym.Space: ...

    @property
    def action_space(self) -> gym.Space: ...

    @property
    def action_mask(self) -> np.ndarray | None:
        """``[B, A]`` bool legal actions at the latest observation, None when the env has
        none."""
        ...

    @property
    def agents_per_env(self) -> int:
        """Rows per environment: 1, or the agents of a multi-agent env seen as a batch of
        agents (`shoal.envs.agents_as_batch`), whose ``num_envs`` counts (env, agent) rows."""
        ...

    @property
    def agent_names(self) -> tuple[str, ...] | None:
        """Names of the agents of each environment's rows (None for single-agent envs)."""
        ...

    def reset(self, seed: int | None = None) -> np.ndarray: ...

    def step(self, actions: np.ndarray) -> StepResult: ...

    def get_state(self) -> dict[str, Any]:
        """Everything needed to continue mid-episode after a restart (for exact resume).
        Raises `shoal.envs.snapshot.EnvStateUnsupported` when that cannot be captured."""
        ...

    def set_state(self, state: dict[str, Any]) -> None: ...

    def render(self) -> np.ndarray | None: ...

    def close(self) -> None: ...


class VectorEnvWrapper:
    """Base for wrappers: forwards everything to the wrapped env unless overridden."""

    def __init__(self, env: VectorEnv):
        self.env = env
        self.num_envs = env.num_envs
        self.observation_space = env.observation_space
        self.action_space = env.action_space
        self.agents_per_env = getattr(env, "agents_per_env", 1)
        self.agent_names = getattr(env, "agent_names", None)

    @property
    def action_mask(self) -> np.ndarray | None:
        return self.env.action_mask

    def reset(self, seed: int | None = None) -> np.ndarray:
        return self.env.reset(seed=seed)

    def step(self, actions: np.ndarray) -> StepResult:
        return self.env.step(actions)

    def get_state(self) -> dict[str, Any]:
        return {"inner": self.env.get_state()}

    def set_state(self, state: dict[str, Any]) -> None:
        self.env.set_state(state["inner"])

    def render(self) -> np.ndarray | None:
        return self.env.render()

    def close(self) -> None:
        self.env.close()


def find_wrapper(env: VectorEnv, cls: type) -> Any:
    """The outermost wrapper of type ``cls`` around ``env`` (or ``env`` itself), else None."""
    current: Any = env
    while isinstance(current, (VectorEnvWrapper, cls)):
        if isinstance(current, cls):
            return current
        assert isinstance(current, VectorEnvWrapper)
        current = current.env
    return None


def set_env_attr(env: Any, name: str, value: Any) -> None:
    """Set attribute ``name`` to ``value`` in every environment behind ``env`` (a shoal vector
    env, its wrappers included): through Gymnasium's ``set_attr`` for Sync and Async vector
    envs (each sub-env, on the innermost wrapper that has the attribute, in its own process
    for Async), or on the env object itself for vectorized implementations that hold every
    env in one object (Gymnasium's native vector envs, shoal's particle world). Raises
    `ShoalError` when no env has the attribute, so a typo does not pass silently."""
    current = env
    while not hasattr(current, "set_attr") and hasattr(current, "env"):
        current = current.env
    if hasattr(current, "set_attr"):
        try:
            current.get_attr(name)
        except AttributeError:
            raise ShoalError(f"the environments have no attribute {name!r} to set") from None
        current.set_attr(name, value)
        return
    if not hasattr(current, name):
        raise ShoalError(
            f"the environment ({type(current).__name__}) has no attribute {name!r} to set"
        )
    setattr(current, name, value)
