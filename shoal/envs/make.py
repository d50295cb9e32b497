"""Building an env from an `EnvConfig`: the one factory above the adapters. A Gymnasium id
goes through `shoal.envs.gym` (and `shoal.envs.atari`), a built-in multi-agent id through the
factory it registered (`shoal.envs.multi_agent.register_multi_agent_env`), a
``pettingzoo:<module>.<env>`` id through `shoal.envs.pettingzoo`; `make_env` shows a
multi-agent env to single-agent learners as one row per agent (`AgentsAsBatch`) and adds the
normalization wrappers."""

from __future__ import annotations

import difflib

from shoal.config import EnvConfig
from shoal.core.errors import ConfigError, ShoalError
from shoal.envs.agents_as_batch import AgentsAsBatch
from shoal.envs.base import VectorEnv
from shoal.envs.gym import GymVectorEnv, make_gym_vector_env
from shoal.envs.multi_agent import (
    PETTINGZOO_PREFIX,
    MultiAgentVectorEnv,
    is_multi_agent_id,
    multi_agent_ids,
    registered_factory,
)
from shoal.envs.normalize import NormalizeObservation, NormalizeReward


def make_multi_agent_env(config: EnvConfig, render_mode: str | None = None) -> MultiAgentVectorEnv:
    """A multi-agent vector env: a built-in one by id (``shoal/spread-v0``, ...) or any
    PettingZoo parallel env as ``pettingzoo:<module>.<env>`` (e.g.
    ``pettingzoo:mpe2.simple_spread_v3``). Built-in envs render without a render mode;
    PettingZoo envs are created with ``render_mode``."""
    if config.id.startswith(PETTINGZOO_PREFIX):
        from shoal.envs.pettingzoo import make_pettingzoo_env

        return make_pettingzoo_env(config, render_mode=render_mode)
    factory = registered_factory(config.id)
    if factory is None:
        close = difflib.get_close_matches(config.id, multi_agent_ids(), n=3)
        hint = f" Did you mean {', '.join(close)}?" if close else ""
        raise ShoalError(
            f"unknown multi-agent env {config.id!r}.{hint} Built-in: "
            f"{', '.join(multi_agent_ids())}; PettingZoo: {PETTINGZOO_PREFIX}<module>.<env>"
        )
    return factory(config)


def make_env(
    config: EnvConfig, seed: int | None = None, render_mode: str | None = None
) -> VectorEnv:
    """Build the vector env described by ``config``, normalized as asked, and reset it.
    Multi-agent env ids (`shoal.envs.multi_agent`) come as one row per (env, agent) pair."""
    if is_multi_agent_id(config.id):
        if config.wrappers or config.vector_wrappers or config.frame_stack > 1:
            raise ConfigError(
                "EnvConfig.wrappers, vector_wrappers and frame_stack apply to Gymnasium envs, "
                f"not to the multi-agent env {config.id!r}"
            )
        if config.policy_map or config.policy_per_agent:
            raise ConfigError(
                "env.policy_map and env.policy_per_agent choose the policies of mappo and "
                "ippo, which train several policies at once; this learner trains one group "
                "(env.group)"
            )
        env: VectorEnv = AgentsAsBatch(
            make_multi_agent_env(config, render_mode),
            config.group,
            config.agent_id,
            config.global_state,
            config.opponents,
        )
    else:
        if config.opponents or config.policy_map or config.policy_per_agent:
            raise ConfigError(
                "EnvConfig.opponents, policy_map and policy_per_agent apply to multi-agent "
                f"envs, not to {config.id!r}"
            )
        env = GymVectorEnv(
            make_gym_vector_env(config, render_mode),
            config.action_mask,
            episode_info=config.atari == "deepmind",
        )
    if config.normalize_obs:
        env = NormalizeObservation(env, clip=config.clip_obs)
    if config.normalize_reward:
        env = NormalizeReward(env, gamma=config.gamma, clip=config.clip_reward)
    return env
