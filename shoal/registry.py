"""Names to algorithms and tuned examples."""

from __future__ import annotations

import difflib
from collections.abc import Callable
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

from shoal.algos.continuous import d4pg, ddpg, sac, td3
from shoal.algos.cores import offline as offline_core
from shoal.algos.evolution import ars, cmaes, es, ga
from shoal.algos.multi_agent import ctedd, distributed_maddpg, maddpg, multi_policy, qmix
from shoal.algos.offline import bc, cql, iql, td3_bc
from shoal.algos.planning import alphazero, muzero, planner
from shoal.algos.policy_gradient import a2c, a3c, acer, acktr, appo, ddppo, impala, pg, ppo, trpo
from shoal.algos.value import apex, dqn, r2d2, tabular
from shoal.config import from_dict, read_yaml, replace
from shoal.errors import ConfigError, ShoalError


@dataclass(frozen=True)
class AlgorithmSpec:
    name: str
    config_cls: type
    algorithm_cls: Callable[[Any], Any]
    """Builds the `shoal.interfaces.Algorithm` from a config."""
    build_model: Callable[..., Any]
    """``build_model(config, obs_space, action_space)``: the policy network, for loading."""
    summary: str
    action_spaces: str
    defaults: dict[str, Any] = field(default_factory=dict)
    """Field values that differ from ``config_cls``'s defaults under this name, so that names
    sharing one config class (``q-learning``, ``sarsa``, ... all use `TabularConfig`; ``mappo``
    is PPO with ``env.global_state``) start from their own settings. Dotted keys name fields
    of nested blocks."""
    backends: tuple[str, ...] = ("auto", "torch")
    """The ``model.backend`` values its learner supports (numpy: PPO's and A2C's)."""
    prepare: Callable[[Any], Any] | None = None
    """``prepare(config) -> config``, before anything is built: settings read from outside
    the config (an offline learner's env from its dataset)."""
    runners: bool = False
    """It samples on Ray actors when ``run.runners`` > 0; the training loop refuses
    ``run.runners`` > 0 for an algorithm without this (it would sample in-process)."""
    deploys_search: bool = False
    """Its deployed policy (``shoal.load``) searches at every step, a program around its
    network rather than one network: ``shoal export`` refuses it."""
    match_report: Callable[..., dict[str, Any]] | None = None
    """It plays two-player games: on a game it evaluates by matches against fixed players
    every ``eval_every`` iterations, and ``shoal eval`` reports
    ``match_report(checkpoint, games, seed, progress)`` (AlphaZero, MuZero; ``progress``
    told the count of the ``2 * games`` finished)."""
    deploys: bool = True
    """Its runs hold a policy for ``shoal.load``, ``shoal eval`` and ``shoal export`` (mcts
    plans with the env's own state and holds none)."""
    counts: Callable[[Any], str] | None = None
    """``counts(config)``: what its progress (``env_steps``, which ``run.total_steps`` and the
    cadences count) counts, as a singular noun for summaries ("update" for an offline learner);
    None: "env step"."""

    def unit(self, config: Any) -> str:
        """What the progress of a run of ``config`` counts (see ``counts``)."""
        return "env step" if self.counts is None else self.counts(config)

    def default_config(self, **overrides: Any) -> Any:
        """The config this name starts from: ``config_cls()`` with ``defaults``, then
        ``overrides`` (dotted keys allowed)."""
        return replace(self.config_cls(), **{**self.defaults, **overrides})

    def matches(self, config: Any) -> bool:
        """``config`` is of this name's class (not a subclass: TD3+BC's config extends TD3's)
        and has every one of its default values."""
        return type(config) is self.config_cls and all(
            _dotted(config, key) == value for key, value in self.defaults.items()
        )


def _dotted(config: Any, key: str) -> Any:
    for part in key.split("."):
        config = getattr(config, part)
    return config


NUMPY_BACKENDS = ("auto", "torch", "numpy")
"""The learners with a NumPy path (`shoal.backend`): PPO's (with MAPPO and IPPO) and A2C's."""

ALGORITHMS: dict[str, AlgorithmSpec] = {
    "ppo": AlgorithmSpec(
        "ppo",
        ppo.PPOConfig,
        multi_policy.multi_agent_ppo,  # PPO, or several policies on a multi-agent env
        multi_policy.build_multi_agent_model,
        "Proximal Policy Optimization (clipped surrogate, GAE, adaptive KL)",
        "Discrete, Box, MultiDiscrete, MultiBinary, Tuple, Dict",
        backends=NUMPY_BACKENDS,
        runners=True,
    ),
}

# Multi-agent PPO: shared weights over an agent group (each agent is a row of the batch, see
# `shoal.envs.agents_as_batch`), with a centralized (MAPPO) or an own-observation (IPPO) critic.
ALGORITHMS["mappo"] = AlgorithmSpec(
    "mappo",
    ppo.PPOConfig,
    multi_policy.multi_agent_ppo,
    multi_policy.build_multi_agent_model,
    "Multi-agent PPO, shared weights, centralized value function on the global state",
    "Discrete, Box (multi-agent envs)",
    {"env.global_state": True, "env.agent_id": True},
    NUMPY_BACKENDS,
    runners=True,
)
ALGORITHMS["ippo"] = AlgorithmSpec(
    "ippo",
    ppo.PPOConfig,
    multi_policy.multi_agent_ppo,
    multi_policy.build_multi_agent_model,
    "Independent PPO, shared weights, each agent's critic on its own observation",
    "Discrete, Box (multi-agent envs)",
    {"env.global_state": False, "env.agent_id": True},
    NUMPY_BACKENDS,
    runners=True,
)

ALGORITHMS["maddpg"] = AlgorithmSpec(
    "maddpg",
    maddpg.MADDPGConfig,
    maddpg.MADDPG,
    maddpg.build_model,
    "MADDPG: decentralized actors, centralized critics, Gumbel-softmax, prioritized replay",
    "Discrete, Box (multi-agent envs)",
)

ALGORITHMS["ctedd"] = AlgorithmSpec(
    "ctedd",
    ctedd.CTEDDConfig,
    ctedd.CTEDD,
    ctedd.build_model,
    "CTEDD: global policies with learned exploration, distilled into message-passing local ones",
    "Box (multi-agent envs with a global state)",
)

ALGORITHMS["pg"] = AlgorithmSpec(
    "pg",
    pg.PGConfig,
    pg.PG,
    pg.build_model,
    "REINFORCE: vanilla policy gradient on full-episode returns, optional learned baseline",
    "Discrete, Box, MultiDiscrete, MultiBinary, Tuple, Dict",
    runners=True,
)
ALGORITHMS["a2c"] = AlgorithmSpec(
    "a2c",
    a2c.A2CConfig,
    a2c.A2C,
    a2c.build_model,
    "A2C: synchronous advantage actor-critic (n-step/GAE, RMSProp or Adam)",
    "Discrete, Box, MultiDiscrete, MultiBinary, Tuple, Dict",
    backends=NUMPY_BACKENDS,
    runners=True,
)

ALGORITHMS["acer"] = AlgorithmSpec(
    "acer",
    acer.ACERConfig,
    acer.ACER,
    acer.build_model,
    "ACER: actor-critic with experience replay (Retrace, truncated IS, trust region)",
    "Discrete, Box",
    runners=True,
)

ALGORITHMS["acktr"] = AlgorithmSpec(
    "acktr",
    acktr.ACKTRConfig,
    acktr.ACKTR,
    acktr.build_model,
    "ACKTR: A2C with K-FAC natural-gradient steps in a KL trust region",
    "Discrete, Box, MultiDiscrete, MultiBinary, Tuple, Dict",
    runners=True,
)

ALGORITHMS["trpo"] = AlgorithmSpec(
    "trpo",
    trpo.TRPOConfig,
    trpo.TRPO,
    trpo.build_model,
    "Trust Region Policy Optimization (conjugate-gradient natural step, KL line search, GAE)",
    "Discrete, Box, MultiDiscrete, MultiBinary, Tuple, Dict",
    runners=True,
)


# The value-based family: one learner, three names for its value heads.
for _name, _head, _summary in (
    (
        "dqn",
        "q",
        "DQN with switches for every Rainbow part (double, dueling, n-step, PER, noisy, C51)",
    ),
    ("qrdqn", "quantile", "QR-DQN: distributional DQN by quantile regression"),
    ("rem", "rem", "REM: DQN with a random convex mixture of Q-heads"),
):
    ALGORITHMS[_name] = AlgorithmSpec(
        _name,
        dqn.DQNConfig,
        dqn.DQN,
        dqn.build_model,
        _summary,
        "Discrete",
        {"value_head": _head} if _head != "q" else {},
    )


# The off-policy actor-critics for continuous control.
for _name, _module, _config, _algorithm, _summary, _spaces in (
    (
        "ddpg",
        ddpg,
        ddpg.DDPGConfig,
        ddpg.DDPG,
        "DDPG: deterministic actor, Q critic, target networks, Gaussian or OU exploration",
        "Box (bounded)",
    ),
    (
        "td3",
        td3,
        td3.TD3Config,
        td3.TD3,
        "TD3: DDPG with twin critics, delayed policy updates and target policy smoothing",
        "Box (bounded)",
    ),
    (
        "sac",
        sac,
        sac.SACConfig,
        sac.SAC,
        "Soft Actor-Critic with automatic entropy tuning; discrete-action variant",
        "Box (bounded), Discrete",
    ),
    (
        "d4pg",
        d4pg,
        d4pg.D4PGConfig,
        d4pg.D4PG,
        "D4PG: DDPG with a categorical (C51) critic and n-step returns",
        "Box (bounded)",
    ),
):
    ALGORITHMS[_name] = AlgorithmSpec(
        _name, _config, _algorithm, _module.build_model, _summary, _spaces
    )


# Learning from a dataset (`shoal collect` writes one); ``iql`` is the multi-agent
# independent Q-learning below, so implicit Q-learning is ``iql-offline``.
for _name, _data_module, _data_config, _data_algorithm, _summary, _spaces in (
    ("bc", bc, bc.BCConfig, bc.BC, "Behaviour cloning of a dataset's actions",
     "Box (bounded), Discrete"),
    ("cql", cql, cql.CQLConfig, cql.CQL,
     "CQL: SAC with a conservative penalty on unseen actions (offline, then online)",
     "Box (bounded), Discrete"),
    ("iql-offline", iql, iql.IQLConfig, iql.IQL,
     "Implicit Q-learning: expectile values, advantage-weighted policy (offline, then online)",
     "Box (bounded), Discrete"),
    ("td3-bc", td3_bc, td3_bc.TD3BCConfig, td3_bc.TD3BC,
     "TD3+BC: TD3 whose actor also clones the dataset's actions (offline)", "Box (bounded)"),
):  # fmt: skip
    ALGORITHMS[_name] = AlgorithmSpec(
        _name, _data_config, _data_algorithm, _data_module.build_model, _summary, _spaces,
        prepare=offline_core.prepare, counts=offline_core.counts,
    )  # fmt: skip


# Tabular TD control: one config class, one name per update rule (``spec.defaults`` sets the
# method), plus the generic ``tabular`` that takes the method from ``--method``.
for _name, (_method, _summary) in tabular.METHODS.items():
    ALGORITHMS[_name] = AlgorithmSpec(
        _name,
        tabular.TabularConfig,
        tabular.Tabular,
        tabular.build_model,
        _summary,
        "Discrete (Discrete obs)",
        {"method": _method} if _method else {},
    )


# Value decomposition for cooperative teams: one learner, three mixers.
for _name, _mixer, _summary in (
    ("qmix", "qmix", "QMIX: recurrent agents, monotonic hypernetwork mixer on the global state"),
    ("vdn", "vdn", "VDN: recurrent agents, team Q-value as the sum of the agents' Q-values"),
    ("iql", "none", "IQL: independent recurrent Q-learners with shared weights, no mixer"),
):
    ALGORITHMS[_name] = AlgorithmSpec(
        _name,
        qmix.QMIXConfig,
        qmix.QMIX,
        qmix.build_model,
        _summary,
        "Discrete (multi-agent envs)",
        {"mixer": _mixer} if _mixer != "qmix" else {},
    )


ALGORITHMS["impala"] = AlgorithmSpec(
    "impala",
    impala.IMPALAConfig,
    impala.IMPALA,
    impala.build_model,
    "IMPALA: asynchronous actor-learner with V-trace off-policy correction (Ray runners)",
    "Discrete, Box, MultiDiscrete, MultiBinary, Tuple, Dict",
    runners=True,
)
ALGORITHMS["a3c"] = AlgorithmSpec(
    "a3c",
    a3c.A3CConfig,
    a3c.A3C,
    a3c.build_model,
    "A3C: asynchronous advantage actor-critic, gradients from Ray workers applied on arrival",
    "Discrete, Box, MultiDiscrete, MultiBinary, Tuple, Dict",
    runners=True,
)
ALGORITHMS["ddppo"] = AlgorithmSpec(
    "ddppo",
    ddppo.DDPPOConfig,
    ddppo.DDPPO,
    ddppo.build_model,
    "DD-PPO: decentralized data-parallel PPO, gradients all-reduced over Ray learner processes",
    "Discrete, Box, MultiDiscrete, MultiBinary, Tuple, Dict",
)
ALGORITHMS["appo"] = AlgorithmSpec(
    "appo",
    appo.APPOConfig,
    appo.APPO,
    appo.build_model,
    "APPO: PPO sampling in a thread during the update, fixed policy lag, clip or V-trace",
    "Discrete, Box, MultiDiscrete, MultiBinary, Tuple, Dict",
    backends=NUMPY_BACKENDS,
    runners=True,
)
ALGORITHMS["r2d2"] = AlgorithmSpec(
    "r2d2",
    r2d2.R2D2Config,
    r2d2.R2D2,
    r2d2.build_model,
    "R2D2: recurrent replay DQN (LSTM, burn-in, stored state, h-rescaled n-step double Q)",
    "Discrete",
    runners=True,
)

ALGORITHMS["apex-dqn"] = AlgorithmSpec(
    "apex-dqn",
    apex.ApexDQNConfig,
    apex.Apex,
    apex.build_model,
    "Ape-X DQN: Ray actors with per-actor epsilon, sharded prioritized replay, n-step double DQN",
    "Discrete",
    runners=True,
)
ALGORITHMS["apex-ddpg"] = AlgorithmSpec(
    "apex-ddpg",
    apex.ApexDDPGConfig,
    apex.Apex,
    apex.build_model,
    "Ape-X DPG: Ray actors with per-actor noise, sharded prioritized replay, n-step DDPG",
    "Box (bounded)",
    runners=True,
)
ALGORITHMS["apex-r2d2"] = AlgorithmSpec(
    "apex-r2d2",
    apex.ApexR2D2Config,
    apex.Apex,
    apex.build_model,
    "Distributed R2D2: recurrent Ray actors with the epsilon ladder, sharded sequence replay",
    "Discrete",
    runners=True,
)

ALGORITHMS["maddpg-distributed"] = AlgorithmSpec(
    "maddpg-distributed",
    distributed_maddpg.DistributedMADDPGConfig,
    distributed_maddpg.DistributedMADDPG,
    distributed_maddpg.build_model,
    "Distributed MADDPG: Ray collectors, asynchronous learners, last-writer-wins parameter server",
    "Discrete, Box (multi-agent envs)",
    runners=True,
)


ALGORITHMS["es"] = AlgorithmSpec(
    "es",
    es.ESConfig,
    es.ES,
    es.build_model,
    "Evolution strategies: antithetic noise-table perturbations, centered ranks, Adam",
    "Discrete, Box, MultiDiscrete, MultiBinary",
    runners=True,
)
ALGORITHMS["ars"] = AlgorithmSpec(
    "ars",
    ars.ARSConfig,
    ars.ARS,
    ars.build_model,
    "Augmented random search: linear policies, top-b directions, return-std step",
    "Discrete, Box",
    runners=True,
)
ALGORITHMS["ga"] = AlgorithmSpec(
    "ga",
    ga.GAConfig,
    ga.GA,
    ga.build_model,
    "Genetic algorithm: truncation selection, Gaussian mutation, elite, seed-chain individuals",
    "Discrete, Box, MultiDiscrete, MultiBinary",
    runners=True,
)
ALGORITHMS["cmaes"] = AlgorithmSpec(
    "cmaes",
    cmaes.CMAESConfig,
    cmaes.CMAES,
    cmaes.build_model,
    "CMA-ES (the cma package) over a small policy's parameters",
    "Discrete, Box, MultiDiscrete, MultiBinary",
    runners=True,
)
ALGORITHMS["alphazero"] = AlgorithmSpec(
    "alphazero",
    alphazero.AlphaZeroConfig,
    alphazero.AlphaZero,
    alphazero.build_model,
    "AlphaZero: self-play with batched MCTS on a game's rules, policy-value network, arena",
    "Discrete (two-player turn-based games)",
    runners=True,
    match_report=alphazero.evaluate_run,
)
ALGORITHMS["muzero"] = AlgorithmSpec(
    "muzero",
    muzero.MuZeroConfig,
    muzero.MuZero,
    muzero.build_model,
    "MuZero: search in a learned model, unrolled dynamics, two-hot values, prioritized replay",
    "Discrete",
    runners=True,
    match_report=muzero.evaluate_run,
    deploys_search=True,
)
ALGORITHMS["mcts"] = AlgorithmSpec(
    "mcts",
    planner.PlannerConfig,
    planner.Planner,
    planner.build_model,
    "MCTS planning with a Gymnasium env's true dynamics (exact snapshots), no learning",
    "Discrete (pure-Python envs)",
    deploys=False,
)


def get_algorithm(name: str) -> AlgorithmSpec:
    if not isinstance(name, str):
        raise ConfigError(f"algo must name an algorithm (e.g. ppo), not {name!r}")
    key = name.lower()
    if key not in ALGORITHMS:
        close = difflib.get_close_matches(key, list(ALGORITHMS), n=3)
        hint = f" Did you mean {', '.join(close)}?" if close else ""
        raise ShoalError(f"unknown algorithm {name!r}.{hint} Known: {', '.join(ALGORITHMS)}")
    return ALGORITHMS[key]


def algorithm_for_config(config: Any) -> AlgorithmSpec:
    """The spec of ``config``'s class whose ``defaults`` it matches, the most specific one
    where several do (a `TabularConfig` with method sarsa is ``sarsa``, not ``tabular``)."""
    matches = [spec for spec in ALGORITHMS.values() if spec.matches(config)]
    if matches:
        return max(matches, key=lambda spec: len(spec.defaults))
    raise ShoalError(f"{type(config).__name__} is not the config of a registered algorithm")


@dataclass(frozen=True)
class TunedExample:
    name: str
    algo: str
    description: str
    expected: str
    config: dict[str, Any]
    """Overrides of the algorithm's default config, as in the YAML file."""

    def build_config(self) -> Any:
        spec = get_algorithm(self.algo)
        return from_dict(spec.config_cls, self.config, path=self.name, base=spec.default_config())


def tuned_dir() -> Path:
    return Path(str(resources.files("shoal") / "tuned"))


def tuned_examples() -> dict[str, TunedExample]:
    return {p.stem: read_tuned(p) for p in sorted(tuned_dir().glob("*.yaml"))}


def read_tuned(path: str | Path) -> TunedExample:
    """A tuned example from a YAML file with keys algo, description, expected, config."""
    path = Path(path)
    data = read_yaml(path)
    if not isinstance(data, dict) or "algo" not in data:
        raise ConfigError(f"{path} must be a mapping with at least an 'algo' key")
    unknown = set(data) - {"algo", "description", "expected", "config", "callbacks"}
    if unknown:
        raise ConfigError(f"{path}: unknown top-level keys {sorted(unknown)}")
    get_algorithm(data["algo"])
    config = data.get("config") or {}
    if not isinstance(config, dict):
        raise ConfigError(f"{path}: config must be a mapping of fields, got {config!r}")
    config = dict(config)
    if "callbacks" in data:  # a top-level shorthand for run.callbacks
        callbacks = data["callbacks"]
        if isinstance(callbacks, str) or not isinstance(callbacks, list):
            raise ConfigError(f"{path}: callbacks must be a list of names, got {callbacks!r}")
        config["run"] = {**dict(config.get("run") or {}), "callbacks": list(callbacks)}
    return TunedExample(
        name=path.stem,
        algo=data["algo"],
        description=str(data.get("description", "")),
        expected=str(data.get("expected", "")),
        config=config,
    )


def find_tuned(name_or_path: str) -> TunedExample:
    """A tuned example by name (``ppo-cartpole``) or by YAML path."""
    path = Path(name_or_path)
    if path.suffix in (".yaml", ".yml"):
        if not path.exists():
            raise ConfigError(f"config file {path} does not exist")
        return read_tuned(path)
    file = tuned_dir() / f"{name_or_path}.yaml"  # one file read, not every example's
    if "/" in name_or_path or not file.is_file():
        names = sorted(p.stem for p in tuned_dir().glob("*.yaml"))
        close = difflib.get_close_matches(name_or_path, names, n=3)
        hint = f" Did you mean {', '.join(close)}?" if close else ""
        raise ConfigError(f"unknown tuned example {name_or_path!r}.{hint}")
    return read_tuned(file)
