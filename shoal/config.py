"""Shared config blocks and the helpers every algorithm config uses.

Configs are frozen dataclasses with a docstring per field (tyro turns them into CLI help) and
validate themselves in ``__post_init__`` so that a bad value fails before any work starts, with a
message naming the field and its allowed range.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import importlib.util
import types
import typing
import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal, NamedTuple, TypeVar

import numpy as np

from shoal.device import DEVICE_NAMES, valid_device_name
from shoal.errors import ConfigError, UnknownFieldError

T = TypeVar("T")


def check(owner: object, name: str, ok: bool, allowed: str) -> None:
    """Raise a `ConfigError` naming ``owner.name`` and the allowed range unless ``ok``."""
    if not ok:
        value = getattr(owner, name)
        raise ConfigError(f"{type(owner).__name__}.{name} = {value!r} is invalid: {allowed}")


def check_multi_agent_learner(config: Any, algo: str, opponents: bool = False) -> None:
    """What the multi-agent learners with networks of their own refuse instead of ignoring:
    an image or custom ``model.encoder`` (their agent-batched networks read flat
    observations through MLPs), ``env.opponents`` unless they take fixed opponents
    (``opponents``; MADDPG and CTEDD train every group they step) and the policy maps of
    MAPPO and IPPO."""
    check(
        config.model,
        "encoder",
        config.model.encoder == "mlp",
        f"{algo}'s agent-batched networks read flat observations through MLPs; image and "
        "custom encoders serve the single-agent families",
    )
    check(
        config.env,
        "opponents",
        opponents or not config.env.opponents,
        f"{algo} trains every agent group of its env; env.opponents serves MAPPO, IPPO and "
        "QMIX/VDN/IQL",
    )
    check(
        config.env,
        "policy_map",
        not config.env.policy_map and not config.env.policy_per_agent,
        f"{algo} has its own networks per agent; env.policy_map and env.policy_per_agent "
        "choose the policies of MAPPO and IPPO",
    )


def check_positive(owner: object, *names: str) -> None:
    for name in names:
        check(owner, name, getattr(owner, name) > 0, "must be > 0")


def check_choices(owner: object) -> None:
    """Check every ``Literal``-typed field against its choices (the type hint alone checks
    nothing outside the CLI, e.g. for YAML files and Python callers)."""
    for name, choices in _literal_fields(type(owner)).items():
        allowed = "must be one of " + ", ".join(map(repr, choices))
        check(owner, name, getattr(owner, name) in choices, allowed)


@functools.cache
def _literal_fields(cls: type) -> dict[str, tuple[Any, ...]]:
    hints = typing.get_type_hints(cls)
    return {
        f.name: typing.get_args(hints[f.name])
        for f in dataclasses.fields(cls)
        if typing.get_origin(hints[f.name]) is Literal
    }


@dataclass(frozen=True)
class RunConfig:
    """How long to train, where to write, how to seed: shared by every algorithm."""

    seed: int = 0
    """One seed derives every environment, worker and torch generator seed."""
    total_steps: int = 100_000
    """Stop after this many environment steps (summed over parallel environments)."""
    target_return: float | None = None
    """Stop as soon as the evaluation mean return reaches this value."""
    max_wall_s: float | None = None
    """Stop after this many seconds of wall-clock time."""
    run_dir: str | None = None
    """Directory for logs and checkpoints; default runs/<algo>-<env>-<date>-<time>."""
    callbacks: tuple[str, ...] = ()
    """Training callbacks (`shoal.train.callbacks`) by name, each ``module:Class`` or a
    built-in (EarlyStopping, SaveBest), with optional literal keyword arguments:
    ``EarlyStopping(patience=3)``. Recorded with the run, so a resume has them again."""
    eval_every_steps: int = 10_000
    """Evaluate the deterministic policy every this many environment steps (0 disables)."""
    eval_episodes: int = 10
    """Episodes per evaluation, run in parallel on separate environments."""
    checkpoint_every_steps: int = 50_000
    """Save a checkpoint every this many environment steps (0: only at the end)."""
    keep_checkpoints: int = 3
    """How many of the newest checkpoints to keep on disk."""
    torch_threads: int = 1
    """Intra-op threads for torch and NumPy's BLAS (`shoal.threads`); one is fastest for
    the small networks of control tasks. Image encoders on the CPU gain from one per core:
    ppo-pong trains 1.6-1.8x the frames/s with 2 than with 1 on two cores."""
    device: str = "auto"
    """Where the learner computes: auto (CUDA when this process sees a GPU, else the CPU), cpu,
    cuda or cuda:N. Networks, optimizer state and batches live there; samplers act on the CPU
    with a copy of the weights. The small MLPs of control tasks train faster on the CPU."""
    compile: bool = False
    """Compile the learner's networks (forward and backward) and the samplers' acting networks
    with torch.compile: faster steps on large networks and GPUs after a start-up of seconds to
    minutes (see benchmarks/README.md). Implies model.backend torch."""
    runners: int = 0
    """Sampling workers as Ray actors, each with its own env.num_envs environments (0: sample
    in the learner's process, no Ray). Algorithms without distributed sampling refuse > 0."""
    ray_address: str | None = None
    """Join the Ray cluster at HOST:PORT (or 'auto'); unset: start a local Ray when needed."""
    max_worker_restarts: int = 100
    """Restart failed Ray workers (killed, or raised in an env) up to this many times per run."""
    console: bool = True
    """Show the live progress line."""
    tensorboard: bool = True
    """Write TensorBoard event files under <run_dir>/tb."""
    wandb: str | None = None
    """Also log to Weights & Biases, in this project (offline unless WANDB_MODE or an API key
    says otherwise; extra shoal[wandb])."""
    mlflow: str | None = None
    """Also log to MLflow at this tracking URI ('local': a file store beside the run
    directory; extra shoal[mlflow])."""

    def __post_init__(self) -> None:
        check(self, "seed", self.seed >= 0, "must be >= 0")
        check_positive(self, "total_steps", "eval_episodes", "keep_checkpoints", "torch_threads")
        check(self, "eval_every_steps", self.eval_every_steps >= 0, "must be >= 0")
        check(self, "runners", self.runners >= 0, "must be >= 0 (0: no Ray)")
        for tracker, module, extra in (("wandb", "wandb", "wandb"), ("mlflow", "mlflow", "mlflow")):
            if getattr(self, tracker) is not None and importlib.util.find_spec(module) is None:
                raise ConfigError(
                    f"RunConfig.{tracker} needs the {module} package: pip install 'shoal[{extra}]'"
                )
        check(self, "max_worker_restarts", self.max_worker_restarts >= 0, "must be >= 0")
        check(self, "checkpoint_every_steps", self.checkpoint_every_steps >= 0, "must be >= 0")
        if self.max_wall_s is not None:
            check(self, "max_wall_s", self.max_wall_s > 0, "must be > 0 seconds")
        check(self, "device", valid_device_name(self.device), f"must be {DEVICE_NAMES}")


@dataclass(frozen=True)
class EnvConfig:
    """Which environment to train on and how to vectorize and normalize it."""

    id: str = "CartPole-v1"
    """A Gymnasium environment id (e.g. CartPole-v1, Pendulum-v1)."""
    num_envs: int = 8
    """Environments stepped in parallel as one batch."""
    vectorization: Literal["auto", "native", "sync", "async"] = "auto"
    """auto: the env's own vectorized implementation when it has one, else sync."""
    normalize_obs: bool = False
    """Normalize observations by running mean and std (statistics saved in checkpoints)."""
    normalize_reward: bool = False
    """Scale rewards by the running std of the discounted return."""
    clip_obs: float = 10.0
    """Clip normalized observations to [-clip_obs, clip_obs]."""
    clip_reward: float = 10.0
    """Clip scaled rewards to [-clip_reward, clip_reward]."""
    gamma: float = 0.99
    """Discount used by reward normalization (algorithms copy their own gamma here)."""
    max_episode_steps: int | None = None
    """Override the env's time limit."""
    kwargs: dict[str, bool | int | float | str] = dataclasses.field(default_factory=dict)
    """Extra keyword arguments for the env's constructor (e.g. is_slippery: false)."""
    wrappers: tuple[str, ...] = ()
    """Gymnasium wrappers applied in order to each env before vectorization, by name with
    keyword arguments: ClipAction, "FrameStackObservation(stack_size=4)",
    "TimeLimit(max_episode_steps=200)", or your own as "module:Class(key=value)"
    (`shoal.envs.wrappers`)."""
    vector_wrappers: tuple[str, ...] = ()
    """Gymnasium vector wrappers applied in order to the vector env, after vectorization
    (any vectorization, native included), by name with keyword arguments:
    "ClipReward(min_reward=-1, max_reward=1)", "DtypeObservation(dtype='float32')", or your
    own as "module:Class(key=value)" (`shoal.envs.wrappers`)."""
    frame_stack: int = 1
    """Stack the last N observations (Gymnasium's FrameStackObservation, after wrappers);
    1: no stacking. Atari ids stack frames with env.atari instead."""
    action_mask: Literal["none", "info", "obs"] = "none"
    """Where the env reports legal actions: info["action_mask"] (e.g. Taxi-v3), or a Dict
    observation with keys "observation" and "action_mask" (the PettingZoo convention)."""
    group: str | None = None
    """Multi-agent envs: the agent group a shared-weight learner trains (None: the only one
    without an opponent)."""
    opponents: dict[str, str] = dataclasses.field(default_factory=dict)
    """Multi-agent envs: fixed policies for the groups a shared-weight learner does not
    train, {group: random or module:Class(key=value)} (`shoal.envs.opponents`)."""
    policy_map: dict[str, str] = dataclasses.field(default_factory=dict)
    """Multi-agent envs, MAPPO and IPPO: {group or agent id: policy name} for every agent of
    the learning groups; agents mapped to one name share a policy (`shoal.envs.policy_map`).
    Empty: one policy per group (or per agent with policy_per_agent)."""
    policy_per_agent: bool = False
    """Multi-agent envs, MAPPO and IPPO: one policy per agent instead of one per group."""
    agent_id: bool = False
    """Multi-agent envs: append a one-hot agent index to each agent's observation, so a
    shared policy can still act differently per agent."""
    global_state: bool = False
    """Multi-agent envs: give the value function the env's global state (a centralized
    critic, MAPPO) instead of the agent's own observation (IPPO); the policy never sees it."""
    atari: Literal["none", "deepmind", "ref001-stack", "ref001-diff"] = "none"
    """Atari frame preprocessing for ALE ids (needs the atari extra; `shoal.envs.atari`).
    deepmind: no-op and FIRE resets, frame skip 4 with max-pooling, 84x84 grayscale, 4 frames
    stacked (uint8 [4, 84, 84]). ref001-stack / ref001-diff: Lamb et al.'s 160x160 crop,
    grayscale and 80x80 downsampling, then 4 frames stacked or the difference of consecutive
    frames."""
    atari_training: bool = True
    """With atari deepmind: end an episode at every life loss and clip rewards to their sign.
    Evaluation envs turn it off (the training loop does); logged episode returns are always
    true scores of whole games."""

    def __post_init__(self) -> None:
        check(self, "id", bool(self.id), "must name an environment")
        check_choices(self)
        check_positive(self, "num_envs", "clip_obs", "clip_reward")
        check(self, "gamma", 0.0 <= self.gamma <= 1.0, "must be in [0, 1]")
        if self.max_episode_steps is not None:
            check_positive(self, "max_episode_steps")
        check_positive(self, "frame_stack")
        wrapped = bool(self.wrappers) or self.frame_stack > 1
        check(
            self,
            "wrappers",
            not (wrapped and self.atari != "none"),
            "cannot be combined with env.atari (its pipeline stacks and preprocesses frames)",
        )


@dataclass(frozen=True)
class OptimConfig:
    """Optimizer settings shared by gradient-based learners."""

    lr: float = 3e-4
    """Adam learning rate at the start of training."""
    lr_schedule: Literal["constant", "linear"] = "constant"
    """linear: decay to zero over anneal_steps."""
    anneal_steps: int | None = None
    """Horizon of the linear schedules in env steps; default run.total_steps. Set it explicitly
    when a run will be resumed with a larger total_steps, so the schedule does not change."""
    eps: float = 1e-5
    """Adam epsilon."""
    weight_decay: float = 0.0
    """Decoupled weight decay (AdamW) coefficient."""
    max_grad_norm: float | None = 0.5
    """Clip the global gradient norm to this value (None disables)."""

    def __post_init__(self) -> None:
        check_positive(self, "lr", "eps")
        check_choices(self)
        check(self, "weight_decay", self.weight_decay >= 0, "must be >= 0")
        if self.max_grad_norm is not None:
            check_positive(self, "max_grad_norm")
        if self.anneal_steps is not None:
            check_positive(self, "anneal_steps")


ENCODERS = ("mlp", "nature", "ref001-model2", "ref001-model3", "impala")
"""The built-in observation encoders (`ModelConfig.encoder`)."""


@dataclass(frozen=True)
class ModelConfig:
    """Network shapes for MLP actor-critic models."""

    hidden: tuple[int, ...] = (64, 64)
    """Hidden layer sizes of the MLP encoders."""
    activation: Literal["tanh", "relu", "silu", "elu"] = "tanh"
    """Hidden activation."""
    shared_trunk: bool = False
    """Share one encoder between actor and critic (separate encoders otherwise)."""
    init_log_std: float = 0.0
    """Initial log standard deviation of Gaussian policies."""
    temperature: float = 1.0
    """Softmax temperature of categorical policies (logits are divided by it); the initial
    temperature when temperature_min anneals it."""
    temperature_min: float | None = None
    """Anneal the temperature linearly from temperature down to this value over
    temperature_anneal, then hold it (Lamb et al.); None keeps it constant."""
    temperature_anneal: int = 100_000
    """Length of the temperature annealing, counted in temperature_unit."""
    temperature_unit: Literal["steps", "episodes"] = "steps"
    """What temperature_anneal counts: env steps (summed over parallel envs) or finished
    episodes."""
    lstm_hidden: int | None = None
    """Size of an LSTM core after the MLP encoder (None: a feed-forward model). The recurrent
    model shares its encoder and LSTM between actor and critic, whatever shared_trunk says;
    its state is carried across steps by the sampler and reset at episode starts."""
    encoder: str = "mlp"
    """Observation encoder: mlp, nature, ref001-model2, ref001-model3, impala
    (`shoal.nn.cnn`), or a user's network as module:Class (`shoal.nn.custom`). mlp:
    observations flattened (Box) or one-hot (Discrete), then the hidden layers; Dict and Tuple
    observations get one encoder per part, concatenated (`shoal.nn.composite`), image parts
    the CNN named here (nature when mlp). The others read channel-first images [C, H, W] (uint8
    frames are scaled by 1/255) and replace the MLP, so hidden is unused: nature is the DQN
    Nature CNN (Mnih et al. 2015; FC 512); ref001-model2 is Lamb et al.'s two conv layers
    with batch norm, flattened (3200 features on 80x80); ref001-model3 is its three conv
    layers (512 features on 80x80) and implies its LSTM 256 core, so lstm_hidden None becomes
    256 (any other size is an error); impala is the IMPALA ResNet (Espeholt et al. 2018; FC
    256). PPO, A2C and DQN read it (DQN has no LSTM core, hence no ref001-model3)."""
    policy_head: str | None = None
    """A user's policy head for the actor-critics as module:Class (`shoal.nn.custom`), built
    as Class(in_dim, action_space, model_config); None: the head for the action space."""
    key_hidden: tuple[int, ...] = ()
    """Dict and Tuple observations: hidden sizes of an MLP of each float vector part of its
    own, before the parts are joined (empty: the parts are joined as they are)."""
    precision: Literal["float32", "bfloat16", "float16"] = "float32"
    """Compute precision of the image encoders (not the mlp one). bfloat16 and float16: mixed
    precision, the convolutions and FC layer run in that type (autocast) while weights,
    optimizer state, heads and losses stay float32. bfloat16 runs on GPUs and on the CPU:
    about 2x faster Atari training on CPUs with AMX or AVX512-BF16 (Intel Sapphire Rapids and
    later), slower on CPUs without them (a warning says so). float16 needs CUDA and trains
    with a gradient scaler (its narrow range would flush small gradients to zero)."""
    backend: Literal["auto", "torch", "numpy"] = "auto"
    """How MLP actor-critics train and act (`shoal.backend`). torch: autograd. numpy: the
    forward and a hand-derived backward pass in NumPy, several times faster on the small
    networks of control tasks (PPO and A2C learners; every sampler of an MLP actor-critic);
    CPU, float32, tanh or relu MLPs only. auto: numpy where it applies, torch otherwise."""

    def __post_init__(self) -> None:
        check(self, "hidden", all(h > 0 for h in self.hidden), "sizes must be > 0")
        check(self, "key_hidden", all(h > 0 for h in self.key_hidden), "sizes must be > 0")
        if self.policy_head is not None:
            check(self, "policy_head", ":" in self.policy_head, "name your head as module:Class")
        check(
            self,
            "encoder",
            self.encoder in ENCODERS or ":" in self.encoder,
            f"choose one of {list(ENCODERS)}, or name your own network as module:Class",
        )
        if self.encoder == "ref001-model3":
            if self.lstm_hidden is None:  # the paper's Model 3 is CNN + LSTM 256 (Lamb et al.)
                object.__setattr__(self, "lstm_hidden", 256)
            check(
                self,
                "lstm_hidden",
                self.lstm_hidden == 256,
                "encoder 'ref001-model3' is Lamb et al.'s CNN + LSTM 256: use 256 or "
                "leave it unset (or pick encoder 'ref001-model2' / 'nature' / 'impala')",
            )
        if self.lstm_hidden is not None:
            check_positive(self, "lstm_hidden")
        check_positive(self, "temperature", "temperature_anneal")
        check_choices(self)
        check(
            self,
            "precision",
            self.precision == "float32" or self.encoder != "mlp",
            "bfloat16 and float16 apply to the image encoders (model.encoder nature, "
            "ref001-model2, ref001-model3, impala); the mlp encoder computes in float32",
        )
        if self.temperature_min is not None:
            check(
                self,
                "temperature_min",
                0 < self.temperature_min <= self.temperature,
                f"must be > 0 and <= temperature = {self.temperature}",
            )


@dataclass(frozen=True)
class SelfPlayConfig:
    """Self-play against a pool of past snapshots (MAPPO and IPPO on a game whose seats one
    policy plays, `shoal.collect.self_play`): in every env the learning policy takes one seat
    (drawn at each episode's start) and a frozen snapshot from the pool plays the others."""

    snapshot_every: int = 0
    """Iterations between snapshots of the learning policy added to the pool (the first is
    its initial weights); 0: no pool (self-play, if any, is against the current policy)."""
    pool_size: int = 20
    """Most snapshots kept; the oldest leave first."""
    sampling: Literal["uniform", "pfsp"] = "pfsp"
    """How each game's opponent is drawn: uniformly, or by prioritized fictitious self-play
    (Vinyals et al. 2019, "Grandmaster level in StarCraft II using multi-agent reinforcement
    learning"): weight (1 - win rate)^pfsp_power, most often the snapshots it beats least."""
    pfsp_power: float = 2.0
    """Exponent of the PFSP weighting (AlphaStar's "hard" weighting uses 2)."""
    elo_k: float = 16.0
    """Elo K-factor of the ratings logged for the learner and the snapshots."""

    def __post_init__(self) -> None:
        check_choices(self)
        check(self, "snapshot_every", self.snapshot_every >= 0, "must be >= 0")
        check_positive(self, "pool_size", "pfsp_power", "elo_k")


@dataclass(frozen=True)
class NoiseConfig:
    """Exploration noise added to a deterministic actor's actions (DDPG, TD3, D4PG), in the
    unit box the actor works in (1.0 = half the range of the env's action bounds)."""

    kind: Literal["gaussian", "ou"] = "gaussian"
    """gaussian: independent N(0, scale^2) per step; ou: scale times an Ornstein-Uhlenbeck
    process, temporally correlated (the DDPG paper's choice)."""
    scale: float = 0.1
    """Standard deviation of Gaussian noise, or the factor on the OU process (RLlib's
    noise_scale)."""
    theta: float = 0.15
    """OU mean reversion per step (RLlib's exploration_theta)."""
    sigma: float = 0.2
    """OU step standard deviation (RLlib's exploration_sigma)."""

    def __post_init__(self) -> None:
        check_choices(self)
        check(self, "scale", self.scale >= 0, "must be >= 0")
        check(self, "theta", 0 <= self.theta <= 1, "must be in [0, 1]")
        check(self, "sigma", self.sigma >= 0, "must be >= 0")


@dataclass(frozen=True)
class ReplayConfig:
    """Experience replay: how much is kept, how it is sampled and how often it is learned from.
    One block for every replay-based learner (DQN and its variants, DDPG, TD3, SAC, D4PG,
    MADDPG, CTEDD, Ape-X, QMIX), each with its own defaults."""

    buffer_size: int = 100_000
    """Capacity in transitions (QMIX: in episodes)."""
    batch_size: int = 64
    """Transitions (QMIX: episodes) per gradient step."""
    n_step: int = 1
    """Bootstrap after n rewards, stopping at episode ends (n-step returns)."""
    prioritized: Literal["none", "proportional", "rank"] = "none"
    """none: uniform sampling; proportional or rank: prioritized by TD error (Schaul et al.
    2016, "Prioritized Experience Replay")."""
    priority_alpha: float = 0.6
    """How strongly priorities skew sampling (0: uniform)."""
    priority_beta: float = 0.4
    """Importance-weight exponent at the start, annealed linearly to 1 (Ape-X keeps it)."""
    learning_starts: int = 1_000
    """Env steps before the first gradient step (QMIX: stored episodes); the actor-critics act
    uniformly at random until then."""
    gradient_steps: int = 1
    """Gradient steps per iteration: updates per env step = gradient_steps / (env steps per
    iteration)."""
    save: bool = False
    """Store the replay buffer in checkpoints (exact resume; large files)."""

    def __post_init__(self) -> None:
        check_choices(self)
        check_positive(self, "buffer_size", "batch_size", "n_step", "gradient_steps")
        check(self, "learning_starts", self.learning_starts >= 0, "must be >= 0")
        check(self, "priority_alpha", self.priority_alpha >= 0, "must be >= 0")
        check(self, "priority_beta", 0.0 <= self.priority_beta <= 1.0, "must be in [0, 1]")


def nested_block(cls: type[T]) -> type[T]:
    """``cls`` as a block nested in a variant's config (DD-PPO's ``ppo``, Ape-X's ``dqn``): the
    same fields and checks, except those that depend on ``run`` and ``env``, which the variant
    runs on the block with its own ``run`` and ``env`` (`unnest`). The block's own run and env
    are not used."""
    namespace = {"NESTED": True, "__doc__": cls.__doc__, "__module__": cls.__module__}
    return typing.cast(type[T], type(cls.__name__, (cls,), namespace))


def is_nested(config: object) -> bool:
    """Whether ``config`` is a `nested_block` (its run- and env-dependent checks wait)."""
    return getattr(type(config), "NESTED", False)


def unnest(block: T, **changes: Any) -> T:
    """The plain config a `nested_block` stands for, with ``changes`` (the variant's run and
    env), validated in full."""
    cls = type(block).__mro__[1] if is_nested(block) else type(block)
    values = {f.name: getattr(block, f.name) for f in dataclasses.fields(block) if f.init}
    return cls(**{**values, **changes})


def check_block(owner: Any, field: str) -> Any:
    """Validate ``owner``'s `nested_block` ``field`` with ``owner``'s run and env, and return
    the plain config it stands for (`unnest`). The block's own run and env must be left at
    their defaults, and a failed check of the block names ``Owner.field.name``."""
    block = getattr(owner, field)
    plain = type(block).__mro__[1] if is_nested(block) else type(block)
    untouched = block.run == RunConfig() and block.env == plain().env
    check(owner, field, untouched, f"set run and env at the top level, not in {field}")
    try:
        return unnest(block, run=owner.run, env=owner.env)
    except ConfigError as exc:
        prefix = f"{type(owner).__name__}.{field}."
        raise ConfigError(str(exc).replace(f"{plain.__name__}.", prefix, 1)) from None


def check_replay_holds(owner: object, num_envs: int) -> None:
    """``owner.replay.buffer_size`` must hold the n-step windows of ``num_envs`` envs (left
    to the variant for a `nested_block`)."""
    if is_nested(owner):
        return
    replay = owner.replay
    check(
        replay,
        "buffer_size",
        replay.buffer_size >= num_envs * (replay.n_step + 2),
        f"must hold at least replay.n_step + 2 steps of {num_envs} envs",
    )


class Renamed(NamedTuple):
    """Where a config field of an earlier shoal version lives now (config files, checkpoints,
    command lines and keyword overrides written for it keep working, with a warning)."""

    path: str
    """The field's dotted name now, e.g. ``replay.buffer_size``."""
    values: dict[Any, Any] | None = None
    """Old values that are spelled differently now."""


REPLAY_RENAMES: dict[str, Renamed] = {
    "buffer_size": Renamed("replay.buffer_size"),
    "batch_size": Renamed("replay.batch_size"),
    "n_step": Renamed("replay.n_step"),
    "replay": Renamed("replay.prioritized", {"uniform": "none"}),
    "priority_alpha": Renamed("replay.priority_alpha"),
    "priority_beta": Renamed("replay.priority_beta"),
    "learning_starts": Renamed("replay.learning_starts"),
    "gradient_steps": Renamed("replay.gradient_steps"),
    "save_replay": Renamed("replay.save"),
}
"""The flat replay fields of shoal 0.1's DQN, DDPG, TD3, SAC, D4PG, MADDPG and CTEDD configs."""


class RenamedFieldWarning(UserWarning):
    """A config used a field name of an earlier shoal version."""


def renames(cls: type) -> dict[str, Renamed]:
    """The renamed fields of a config class (its ``RENAMED`` class attribute)."""
    return getattr(cls, "RENAMED", {})


def _is_current(cls: type, name: str, value: Any) -> bool:
    """``name`` is a field of ``cls`` now and ``value`` fits it (a block takes a mapping)."""
    hints = typing.get_type_hints(cls)
    if name not in hints or name not in {f.name for f in dataclasses.fields(cls)}:
        return False
    return not dataclasses.is_dataclass(hints[name]) or isinstance(value, (dict, Mapping))


def rename_key(cls: type, key: str, value: Any, where: str = "") -> tuple[str, Any]:
    """``(key, value)`` in today's spelling: a renamed field's dotted path (a dotted ``key``
    whose head was renamed keeps its tail) and value; unchanged otherwise. Warns once per use
    of an old name."""
    name = key.replace("-", "_")
    head, dot, tail = name.partition(".")
    rule = renames(cls).get(head)
    if rule is None or _is_current(cls, head, value if not dot else {}):
        return key, value
    new = f"{rule.path}.{tail}" if dot else rule.path
    if rule.values is not None and not dot:
        value = rule.values.get(value, value)
    old = f"{where}.{name}" if where else name
    warnings.warn(
        f"config field {old!r} is now {new!r} (the old name still works)",
        RenamedFieldWarning,
        stacklevel=3,
    )
    return new, value


def _nest(key: str, value: Any) -> tuple[str, Any]:
    """``a.b.c: v`` as ``a: {b: {c: v}}``."""
    head, dot, tail = key.partition(".")
    if not dot:
        return head, value
    inner_key, inner_value = _nest(tail, value)
    return head, {inner_key: inner_value}


def _merge(into: dict[str, Any], key: str, value: Any) -> None:
    if isinstance(value, dict) and isinstance(into.get(key), dict):
        for k, v in value.items():
            _merge(into[key], k, v)
    else:
        into[key] = value


def upgrade(cls: type, data: dict[str, Any], path: str = "") -> dict[str, Any]:
    """``data`` (a config mapping for ``cls``) with renamed fields moved to where they live
    now (`Renamed`)."""
    if not renames(cls):
        return data
    out: dict[str, Any] = {}
    for key, value in data.items():
        new, value = rename_key(cls, key, value, path)
        head, nested = _nest(new, value)
        _merge(out, head, nested)
    return out


def to_dict(config: Any) -> dict[str, Any]:
    """A JSON-ready dict of a (nested) config dataclass."""
    return dataclasses.asdict(config)


def from_dict(cls: type[T], data: dict[str, Any], path: str = "", base: T | None = None) -> T:
    """Build a (nested) config dataclass from plain data, e.g. YAML or checkpoint JSON.

    Fields missing from ``data`` keep the values of ``base`` when given, else the class's
    defaults. A nested block starts from its parent's default for that block, not from the
    block class's own defaults: ``optim: {lr: 0.01}`` in a DQN file keeps DQN's default
    gradient clipping, as ``--optim.lr 0.01`` on the command line does.

    Unknown keys are an error with the closest valid names, because a silently ignored typo in a
    tuned example would train something other than what its author meant.
    """
    if not isinstance(data, dict):
        raise ConfigError(f"{path or cls.__name__} must be a mapping, got {data!r}")
    data = upgrade(cls, data, path)
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
    kwargs: dict[str, Any] = {}
    for key, value in data.items():
        name = key.replace("-", "_")
        where = f"{path}.{name}" if path else name
        if name not in fields:
            close = difflib.get_close_matches(name, sorted(fields), n=3)
            hint = f"; did you mean {', '.join(close)}?" if close else ""
            raise UnknownFieldError(f"unknown config field {where!r} for {cls.__name__}{hint}")
        if dataclasses.is_dataclass(hints[name]):
            block = getattr(base, name) if base is not None else _default(fields[name])
            kwargs[name] = from_dict(hints[name], value, where, base=block)
        else:
            kwargs[name] = _coerce(hints[name], value, f"{cls.__name__}.{name}")
    return dataclasses.replace(base, **kwargs) if base is not None else cls(**kwargs)


def _default(field: dataclasses.Field) -> Any:
    """A field's default value (built by its factory), or None when it has none."""
    if field.default_factory is not dataclasses.MISSING:
        return field.default_factory()
    return None if field.default is dataclasses.MISSING else field.default


def _coerce(hint: Any, value: Any, path: str) -> Any:
    """``value`` as the type ``hint`` names (YAML and JSON give ints for floats, lists for
    tuples, strings such as ``1e-3`` for numbers), or a `ConfigError` naming the field, the
    expected type and what was given."""
    origin = typing.get_origin(hint)
    if dataclasses.is_dataclass(hint):
        return value if dataclasses.is_dataclass(value) else from_dict(hint, value, path)
    if hint is Any or isinstance(hint, typing.TypeVar):
        return value
    if origin in (typing.Union, types.UnionType):
        options = typing.get_args(hint)
        if value is None:
            if type(None) in options:
                return None
            raise _type_error(hint, value, path)
        for option in (a for a in options if a is not type(None)):
            try:
                return _coerce(option, value, path)
            except ConfigError:
                continue
        raise _type_error(hint, value, path)
    if origin is typing.Literal:
        choices = typing.get_args(hint)
        if value in choices:
            return value
        raise ConfigError(f"{path} must be one of {', '.join(map(repr, choices))}, got {value!r}")
    if origin is tuple:
        args = typing.get_args(hint)
        if not isinstance(value, (list, tuple)):
            raise _type_error(hint, value, path)
        if len(args) == 2 and args[1] is Ellipsis:
            return tuple(_coerce(args[0], v, f"{path}[{i}]") for i, v in enumerate(value))
        if args and len(args) != len(value):
            raise _type_error(hint, value, path)
        if not args:
            return tuple(value)
        pairs = enumerate(zip(args, value, strict=True))
        return tuple(_coerce(a, v, f"{path}[{i}]") for i, (a, v) in pairs)
    if origin in (list, dict):
        if not isinstance(value, origin):
            raise _type_error(hint, value, path)
        args = typing.get_args(hint)
        if origin is list:
            item = args[0] if args else Any
            return [_coerce(item, v, f"{path}[{i}]") for i, v in enumerate(value)]
        item = args[1] if len(args) == 2 else Any
        return {k: _coerce(item, v, f"{path}.{k}") for k, v in value.items()}
    if hint is bool:
        if isinstance(value, (bool, np.bool_)):
            return bool(value)
        raise _type_error(hint, value, path)
    if hint is int:
        number = _number(value)
        if isinstance(number, int) or (isinstance(number, float) and number.is_integer()):
            return int(number)
        raise _type_error(hint, value, path)
    if hint is float:
        number = _number(value)
        if number is None:
            raise _type_error(hint, value, path)
        return float(number)
    if hint is str:
        if isinstance(value, str):
            return value
        raise _type_error(hint, value, path)
    return value


def _number(value: Any) -> int | float | None:
    """An int or float from a number or a numeric string (YAML reads ``1e-3`` as a string);
    None for anything else, booleans included."""
    if isinstance(value, (bool, np.bool_)):
        return None
    if isinstance(value, (int, np.integer)):
        return int(value)
    if isinstance(value, (float, np.floating)):
        return float(value)
    if isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            return None
    return None


def _type_error(hint: Any, value: Any, path: str) -> ConfigError:
    return ConfigError(f"{path} must be {_type_name(hint)}, got {value!r} ({type(value).__name__})")


def _type_name(hint: Any) -> str:
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        return " or ".join(_type_name(a) for a in typing.get_args(hint))
    if origin is typing.Literal:
        return "one of " + ", ".join(map(repr, typing.get_args(hint)))
    if origin is tuple:
        args = typing.get_args(hint)
        if len(args) == 2 and args[1] is Ellipsis:
            return f"a list of {_type_name(args[0])}"
        return "a list of " + str(len(args)) + " values"
    if origin is dict:
        return "a mapping"
    if origin is list:
        return "a list"
    if hint is type(None):
        return "null"
    names = {bool: "true or false", int: "an integer", float: "a number", str: "a string"}
    return names.get(hint, getattr(hint, "__name__", str(hint)))


def replace(config: T, **changes: Any) -> T:
    """`dataclasses.replace` that also accepts dotted names for nested blocks."""
    nested: dict[str, dict[str, Any]] = {}
    flat: dict[str, Any] = {}
    for old_key, old_value in changes.items():
        key, value = rename_key(type(config), old_key, old_value)
        head, _, rest = key.partition(".")
        if rest:
            nested.setdefault(head, {})[rest] = value
        else:
            flat[key] = value
    names = sorted(f.name for f in dataclasses.fields(config) if f.init)
    for name in (*flat, *nested):
        if name not in names:
            close = difflib.get_close_matches(name, names, n=3)
            hint = f"; did you mean {', '.join(close)}?" if close else ""
            raise UnknownFieldError(
                f"unknown config field {name!r} for {type(config).__name__}{hint}"
            )
    hints = typing.get_type_hints(type(config))
    prefix = type(config).__name__
    for name, value in flat.items():
        flat[name] = _coerce(hints[name], value, f"{prefix}.{name}")
    for head, sub in nested.items():
        flat[head] = replace(getattr(config, head), **sub)
    return dataclasses.replace(config, **flat)


__all__ = [
    "REPLAY_RENAMES",
    "EnvConfig",
    "ModelConfig",
    "OptimConfig",
    "Renamed",
    "RenamedFieldWarning",
    "ReplayConfig",
    "RunConfig",
    "SelfPlayConfig",
    "check",
    "check_choices",
    "check_replay_holds",
    "is_nested",
    "nested_block",
    "check_positive",
    "from_dict",
    "renames",
    "replace",
    "to_dict",
    "unnest",
    "upgrade",
]
