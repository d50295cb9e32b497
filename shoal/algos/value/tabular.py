"""Tabular TD control: Q-learning, SARSA, Expected SARSA, SARSA(lambda) and Watkins's Q(lambda).

Section numbers refer to Sutton & Barto, *Reinforcement Learning: An Introduction*, 2nd ed.
(2018), "S&B". One float64 Q table ``[S, A]`` is shared by ``B`` environments stepped as a batch;
every update is a numpy array program over the batch, so the ``B`` transitions of one step update
the table together, each with a TD error computed from the table before that step.
Observations must be ``Discrete`` (they index the table), and so must actions.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal, NamedTuple

import gymnasium as gym
import numpy as np
import torch
from torch import nn

from shoal.algos.spec import AlgorithmSpec
from shoal.config import EnvConfig, RunConfig, check, check_choices, check_positive
from shoal.config.usage import NO_COMPILE
from shoal.core.errors import ConfigError, UnsupportedSpaceError
from shoal.core.seeding import derive_seed
from shoal.core.types import EpisodeStats
from shoal.envs import env_spec, make_env
from shoal.envs.shapes import as_discrete
from shoal.envs.snapshot import EnvStateUnsupported
from shoal.nn.policy import ActorPolicy
from shoal.optim.schedules import linear

Method = Literal["q_learning", "sarsa", "expected_sarsa", "sarsa_lambda", "q_lambda"]

METHODS: dict[str, tuple[str | None, str]] = {
    "q-learning": ("q_learning", "Tabular Q-learning: off-policy one-step TD control"),
    "sarsa": ("sarsa", "Tabular SARSA: on-policy one-step TD control"),
    "expected-sarsa": ("expected_sarsa", "Tabular Expected SARSA (expectation over next actions)"),
    "sarsa-lambda": ("sarsa_lambda", "Tabular SARSA(lambda), accumulating or replacing traces"),
    "q-lambda": ("q_lambda", "Tabular Watkins's Q(lambda), traces cut after exploration"),
    "tabular": (None, "Tabular TD control; choose the update rule with --method"),
}
"""Registry name -> (``TabularConfig.method`` it sets, or None to keep the default; summary)."""

LAMBDA_METHODS = ("sarsa_lambda", "q_lambda")


@dataclass(frozen=True)
class TabularConfig:
    """Tabular TD control. The defaults suit the Gymnasium toy-text envs (CliffWalking,
    FrozenLake, Taxi); the tuned examples hold faster settings for specific ones."""

    run: RunConfig = field(default_factory=RunConfig)
    # CliffWalking registers no time limit: without one, a greedy evaluation of a policy that
    # walks into a wall would never end. 200 steps is Taxi's and FrozenLake8x8's own limit.
    env: EnvConfig = field(
        default_factory=lambda: EnvConfig(id="CliffWalking-v1", max_episode_steps=200)
    )
    method: Method = "q_learning"
    """Update rule: q_learning, sarsa, expected_sarsa, sarsa_lambda or q_lambda (Watkins's)."""
    alpha: float = 0.1
    """Step size (learning rate) of every update."""
    gamma: float = 0.99
    """Discount factor."""
    epsilon_start: float = 1.0
    """Exploration rate of the epsilon-greedy behaviour policy at the start."""
    epsilon_end: float = 0.05
    """Exploration rate after epsilon_decay_steps."""
    epsilon_decay_steps: int = 20_000
    """Env steps of the linear decay from epsilon_start to epsilon_end (0: epsilon_end)."""
    # Replacing by default: accumulating traces grow past 1/alpha when an early, random
    # episode loops through a state, and the update then overshoots.
    trace: Literal["accumulating", "replacing"] = "replacing"
    """Traces of the lambda methods: accumulating adds 1 per visit, replacing sets 1."""
    trace_lambda: float = 0.9
    """Trace decay lambda of sarsa_lambda and q_lambda: 0 is one-step, 1 is Monte-Carlo."""
    q_init: float = 0.0
    """Initial value of every Q entry; values above the true returns explore (S&B 2.6)."""
    steps_per_iteration: int = 128
    """Vector steps per training iteration (each is env.num_envs env steps)."""

    UNUSED: ClassVar[dict[str, str]] = NO_COMPILE

    def __post_init__(self) -> None:
        check_choices(self)
        check(
            self.run,
            "device",
            self.run.device in ("auto", "cpu"),
            "tabular methods compute on the CPU: use auto or cpu",
        )
        check(self, "alpha", 0.0 < self.alpha <= 1.0, "must be in (0, 1]")
        for name in ("gamma", "epsilon_start", "epsilon_end", "trace_lambda"):
            check(self, name, 0.0 <= getattr(self, name) <= 1.0, "must be in [0, 1]")
        check(self, "epsilon_decay_steps", self.epsilon_decay_steps >= 0, "must be >= 0")
        check_positive(self, "steps_per_iteration")
        allowed = "tabular methods index the Q table with the raw discrete observation"
        check(self.env, "normalize_obs", not self.env.normalize_obs, allowed)


# --- the policy network: a Q table with an action distribution ---------------------------------


class EpsilonGreedy:
    """The epsilon-greedy action distribution over rows ``q_s [B, A]`` of a Q table."""

    def __init__(self, q_s: torch.Tensor, epsilon: float):
        self.q_s = q_s
        self.epsilon = epsilon

    def mode(self) -> torch.Tensor:
        """``[B]`` greedy actions; ties go to the lowest index, so evaluation is reproducible."""
        return self.q_s.argmax(-1)

    def sample(self) -> torch.Tensor:
        """``[B]`` actions of the epsilon-greedy policy that was trained (ties broken at random)."""
        best = self.q_s == self.q_s.max(-1, keepdim=True).values
        greedy = torch.where(best, torch.rand_like(self.q_s), -1.0).argmax(-1)
        explore = torch.rand(greedy.shape) < self.epsilon
        return torch.where(explore, torch.randint_like(greedy, self.q_s.shape[-1]), greedy)


class QTable(nn.Module):
    """The Q table as a torch module, so that checkpoints, ``shoal.load`` and `ActorPolicy`
    treat it like any other policy network. ``epsilon`` is the exploration rate at the time of
    the snapshot, used by ``sample()`` (``shoal eval --stochastic``)."""

    q: torch.Tensor
    epsilon: torch.Tensor

    def __init__(self, num_states: int, num_actions: int, q_init: float = 0.0):
        super().__init__()
        table = torch.full((num_states, num_actions), q_init, dtype=torch.float64)
        self.register_buffer("q", table)
        self.register_buffer("epsilon", torch.zeros((), dtype=torch.float64))

    def distribution(self, obs: torch.Tensor) -> EpsilonGreedy:
        return EpsilonGreedy(self.q[obs.long()], float(self.epsilon))

    def greedy_actions(self) -> np.ndarray:
        """The greedy policy as an ``[S]`` int64 array: the action to take in each state."""
        return self.q.argmax(-1).numpy()


def build_model(config: TabularConfig, obs_space: gym.Space, action_space: gym.Space) -> QTable:
    for kind, space in (("observation", obs_space), ("action", action_space)):
        if not isinstance(space, gym.spaces.Discrete) or space.start != 0:
            # A Box's repr lists every bound; its shape says enough.
            shown = f"{type(space).__name__}{space.shape or ''}"
            shown = repr(space) if isinstance(space, gym.spaces.Discrete) else shown
            raise UnsupportedSpaceError(
                f"tabular methods need a Discrete {kind} space starting at 0 (it indexes the Q "
                f"table), got {kind} space {shown}; use ppo for other spaces"
            )
    return QTable(int(as_discrete(obs_space).n), int(as_discrete(action_space).n), config.q_init)


# --- pure update rules ---------------------------------------------------------------------------


class TabularStep(NamedTuple):
    """One vector step, ``[B]`` arrays: from ``s_tm1`` action ``a_tm1`` gave ``r_t`` and led to
    ``s_t``, where the behaviour policy then chose ``a_t`` (SARSA's next action)."""

    s_tm1: np.ndarray
    a_tm1: np.ndarray
    r_t: np.ndarray
    s_t: np.ndarray
    a_t: np.ndarray
    terminated: np.ndarray
    """No bootstrap: the value after a terminal state is 0."""
    truncated: np.ndarray
    """A time limit ended the episode: bootstrap from ``s_t``, the true final observation."""
    valid: np.ndarray
    """False on autoreset steps (``s_t`` starts a new episode), which are not learned from."""


def epsilon_greedy_probs(q_s: np.ndarray, epsilon: float) -> np.ndarray:
    """``[B, A]`` probabilities of the epsilon-greedy policy of ``q_s [B, A]`` (S&B 2.2),
    greedy mass split evenly between tied actions, matching `epsilon_greedy`'s tie-breaking."""
    best = q_s == q_s.max(-1, keepdims=True)
    return epsilon / q_s.shape[-1] + (1.0 - epsilon) * best / best.sum(-1, keepdims=True)


def epsilon_greedy(q_s: np.ndarray, epsilon: float, rng: np.random.Generator) -> np.ndarray:
    """``[B]`` actions: uniform with probability epsilon, else greedy. Ties are broken at random:
    with a constant initial table, lowest-index tie-breaking would keep choosing action 0."""
    batch, num_actions = q_s.shape
    best = q_s == q_s.max(-1, keepdims=True)
    greedy = np.argmax(np.where(best, rng.random((batch, num_actions)), -1.0), axis=-1)
    explore = rng.random(batch) < epsilon
    return np.where(explore, rng.integers(num_actions, size=batch), greedy)


def td_target(
    q: np.ndarray, step: TabularStep, method: str, gamma: float, epsilon: float
) -> np.ndarray:
    """``[B]`` one-step targets ``r_t + gamma * v(s_t)``, with v(s_t) = 0 on termination."""
    q_t = q[step.s_t]
    if method in ("q_learning", "q_lambda"):
        v_t = q_t.max(-1)  # S&B (6.8); Watkins's Q(lambda), S&B 12.10
    elif method in ("sarsa", "sarsa_lambda"):
        v_t = q_t[np.arange(len(q_t)), step.a_t]  # S&B (6.7); SARSA(lambda), S&B 12.7
    else:
        v_t = (epsilon_greedy_probs(q_t, epsilon) * q_t).sum(-1)  # S&B (6.9)
    return step.r_t + gamma * np.where(step.terminated, 0.0, v_t)


def sequential_weights(alpha: float, z: np.ndarray) -> np.ndarray:
    """Step sizes ``alpha * z_b * prod_{b' > b} (1 - alpha * z_b')`` for per-env updates
    ``alpha * z_b * delta_b`` (``z [B, ...]``): the effect of applying them one env after
    another, each shrinking the share of the earlier ones, as a single agent's incremental rule
    would. Summing them instead multiplies the step of an entry that k envs share by k, which
    diverged on CliffWalking (16 envs on the start state, alpha 0.5)."""
    after = np.ones_like(z)
    after[:-1] = np.cumprod(1.0 - alpha * z[:0:-1], axis=0)[::-1]
    return alpha * z * after


def td_update(
    q: np.ndarray,
    traces: np.ndarray | None,
    step: TabularStep,
    config: TabularConfig,
    epsilon: float,
) -> np.ndarray:
    """Apply one batched update to ``q [S, A]`` (and ``traces [B, S, A]``) in place; returns
    the ``[B]`` TD errors (0 on autoreset steps).

    Every env's TD error counts, with `sequential_weights` where envs share an entry (for
    one-step methods an env's ``z`` is 1 at its own (s, a) pair, so ``k`` envs on one pair get
    ``alpha * (1 - alpha) ** later``, accumulated with `np.add.at`). The lambda methods follow
    S&B 12.7's SARSA(lambda) box: bump the trace of (s_tm1, a_tm1), move every entry by
    ``alpha * delta * trace``, then decay the traces by gamma * lambda; traces reset at episode
    ends, and Watkins's Q(lambda) also cuts them after an exploratory ``a_t``, from which on
    the max target no longer follows the behaviour (S&B 12.10).
    """
    rows = np.arange(len(step.s_tm1))
    target = td_target(q, step, config.method, config.gamma, epsilon)
    delta = np.where(step.valid, target - q[step.s_tm1, step.a_tm1], 0.0)
    if traces is None:
        key = np.where(step.valid, step.s_tm1 * q.shape[1] + step.a_tm1, -1)
        later = np.triu((key[:, None] == key[None, :]) & step.valid, 1).sum(-1)
        alpha = config.alpha * (1.0 - config.alpha) ** later
        np.add.at(q, (step.s_tm1, step.a_tm1), alpha * delta)
        return delta
    decay = np.where(step.terminated | step.truncated, 0.0, config.gamma * config.trace_lambda)
    if config.method == "q_lambda":
        q_t = q[step.s_t]  # before the update, as in S&B's pseudocode
        exploratory = q_t[rows, step.a_t] < q_t.max(-1)  # an action tied for the max is greedy
        decay = np.where(exploratory, 0.0, decay)
    b = rows[step.valid]
    if config.trace == "replacing":
        # S&B 12.5's replacing trace, with Singh & Sutton's (1996) control variant that also
        # clears the state's other actions: traces stay <= 1 however often an episode loops.
        traces[b, step.s_tm1[b]] = 0.0
        traces[b, step.s_tm1[b], step.a_tm1[b]] = 1.0
    else:
        traces[b, step.s_tm1[b], step.a_tm1[b]] += 1.0
    q += np.tensordot(delta, sequential_weights(config.alpha, traces), axes=1)
    traces *= decay[:, None, None]
    return delta


# --- the algorithm -------------------------------------------------------------------------------


class Tabular:
    """Steps ``env.num_envs`` environments with an epsilon-greedy policy and updates the shared
    Q table after every vector step."""

    def __init__(self, config: TabularConfig):
        self.config = config
        spec = env_spec(config.env.id)
        if config.env.max_episode_steps is None and spec.max_episode_steps is None:
            raise ConfigError(
                f"{config.env.id} has no time limit, so a greedy policy that never reaches a "
                "terminal state would make evaluation run forever: set env.max_episode_steps "
                "(e.g. --env.max-episode-steps 200)"
            )
        self.env = make_env(config.env)
        self.model = build_model(config, self.env.observation_space, self.env.action_space)
        # A numpy view of the model's buffer: updates are numpy, checkpoints and policies torch.
        self.q = self.model.q.numpy()
        shape = (self.env.num_envs, *self.q.shape)
        self.traces = np.zeros(shape) if config.method in LAMBDA_METHODS else None
        self.rng = np.random.default_rng(derive_seed(config.run.seed, "explore"))
        self.env_steps = 0
        self.iteration = 0
        self._start_episodes(self.env.reset(seed=derive_seed(config.run.seed, "env", 0)))

    def epsilon(self) -> float:
        cfg = self.config
        progress = self.env_steps / cfg.epsilon_decay_steps if cfg.epsilon_decay_steps else 1.0
        return linear(cfg.epsilon_start, cfg.epsilon_end, progress)

    def _start_episodes(self, obs: np.ndarray) -> None:
        self.obs = obs
        self.actions = epsilon_greedy(self.q[obs], self.epsilon(), self.rng)
        if self.traces is not None:
            self.traces[:] = 0.0

    def train_iteration(self) -> dict[str, float]:
        returns, lengths = [], []
        abs_delta, updates = 0.0, 0
        for _ in range(self.config.steps_per_iteration):
            result = self.env.step(self.actions)
            self.env_steps += self.env.num_envs
            epsilon = self.epsilon()
            next_actions = epsilon_greedy(self.q[result.obs], epsilon, self.rng)
            step = TabularStep(
                self.obs,
                self.actions,
                result.reward.astype(np.float64),
                result.obs,
                next_actions,
                result.terminated,
                result.truncated,
                ~result.autoreset,
            )
            delta = td_update(self.q, self.traces, step, self.config, epsilon)
            abs_delta += float(np.abs(delta).sum())
            updates += int(step.valid.sum())
            self.obs, self.actions = result.obs, next_actions
            returns.append(result.episode_returns)
            lengths.append(result.episode_lengths)
        self.iteration += 1
        metrics = {
            "train/epsilon": self.epsilon(),
            "train/abs_td_error": abs_delta / max(updates, 1),
            "train/q_mean": float(self.q.mean()),
        }
        episodes = EpisodeStats(np.concatenate(returns), np.concatenate(lengths))
        metrics.update(episodes.metrics())
        return metrics

    def greedy_actions(self) -> np.ndarray:
        """The greedy policy as an ``[S]`` int64 array (see `QTable.greedy_actions`)."""
        return self.model.greedy_actions()

    def policy(self) -> ActorPolicy:
        self.model.epsilon.fill_(self.epsilon())
        return ActorPolicy(copy.deepcopy(self.model))

    def state_dict(self) -> dict[str, Any]:
        self.model.epsilon.fill_(self.epsilon())
        try:
            env_state = self.env.get_state()
        except EnvStateUnsupported:
            env_state = None
        return {
            "policy": {"model": self.model.state_dict(), "obs_stats": None},
            "traces": None if self.traces is None else self.traces.copy(),
            "rng": self.rng.bit_generator.state,
            "env": env_state,
            "obs": self.obs.copy(),
            "actions": self.actions.copy(),
            "counters": {"env_steps": self.env_steps, "iteration": self.iteration},
        }

    def load_state_dict(self, state: dict[str, Any]) -> bool:
        """Restore; returns False when the envs could not be restored mid-episode."""
        self.model.load_state_dict(state["policy"]["model"])  # copies in place: self.q follows
        self.rng.bit_generator.state = state["rng"]
        self.env_steps = state["counters"]["env_steps"]
        self.iteration = state["counters"]["iteration"]
        if state["env"] is None:
            fallback = derive_seed(self.config.run.seed, "env-restart", self.iteration)
            self._start_episodes(self.env.reset(seed=fallback))
            return False
        self.env.set_state(state["env"])
        self.obs = np.asarray(state["obs"]).copy()
        self.actions = np.asarray(state["actions"]).copy()
        if self.traces is not None:
            self.traces[:] = state["traces"]
        return True

    def close(self) -> None:
        self.env.close()


# One config class, one name per update rule (``spec.defaults`` sets the method), plus the
# generic ``tabular`` that takes the method from ``--method``.
SPECS = tuple(
    AlgorithmSpec(
        name,
        TabularConfig,
        Tabular,
        build_model,
        summary,
        "Discrete (Discrete obs)",
        {"method": method} if method else {},
        gradients=False,
    )
    for name, (method, summary) in METHODS.items()
)
"""The names this module registers (`shoal.algos.spec`, `shoal.registry`)."""
