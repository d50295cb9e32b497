"""The config blocks every algorithm shares: `RunConfig`, `EnvConfig`, `OptimConfig`,
`ModelConfig`, `SelfPlayConfig`, `NoiseConfig`, `ReplayConfig`."""

from __future__ import annotations

import dataclasses
import importlib.util
import math
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

from shoal.config.checks import check, check_choices, check_positive, is_nested, unnest
from shoal.config.renames import renamed_value
from shoal.config.usage import Gate
from shoal.core.device import DEVICE_NAMES, valid_device_name
from shoal.core.errors import ConfigError


@dataclass(frozen=True)
class RunConfig:
    """How long to train, where to write, how to seed: shared by every algorithm."""

    seed: int = 0
    """One seed derives every environment, worker and torch generator seed."""
    total_steps: int = 100_000
    """Stop after this many environment steps (summed over parallel environments); an
    offline learner counts gradient updates. Every step call of a vector env counts,
    including the one that resets an env whose episode ended on the step before (Gymnasium's
    next-step autoreset): a Pendulum episode of 200 steps takes 201 of them, so episodes end
    at 200, 401, 602, ... Stable-Baselines3's vector envs reset within the final step, so
    its 100,000 steps hold about 0.5% more Pendulum transitions (about 1/length more)."""
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
    """Evaluate the policy every this many environment steps (0: never, unless
    ``target_return`` is set: then every iteration, to see when it is reached)."""
    eval_episodes: int = 10
    """Episodes per evaluation, run in parallel on separate environments."""
    eval_actions: Literal["deterministic", "sampled"] = "deterministic"
    """The actions evaluations take: the policy's deterministic ones (argmax, mode or mean),
    or sampled from it, seeded by the evaluation's seed. rl-baselines3-zoo scores Atari
    policies with sampled actions; a stochastic policy's argmax can do worse than its samples
    (it can repeat a move that leads nowhere)."""
    checkpoint_every_steps: int = 50_000
    """Save a checkpoint every this many environment steps (0: only at the end)."""
    keep_checkpoints: int = 3
    """How many of the newest checkpoints to keep on disk."""
    torch_threads: int = 1
    """Intra-op threads for torch and NumPy's BLAS (`shoal.core.threads`); one is fastest for
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
    learners: int = 1
    """Data-parallel copies of the learner (a learner group), as Ray actors placed together
    with their devices (a placement group) on this machine or any node of the cluster. Every
    minibatch is split among them, each backpropagates its share and the gradients are
    all-reduced (NCCL between GPUs, gloo on CPUs), so each step is one update on the whole
    minibatch. 1: the learner in the training process. Algorithms without learner groups
    refuse > 1 (the scaling tutorial's table lists which have them)."""
    share_gpus: bool = False
    """With run.learners > 1 on GPUs: let learners share a GPU where the cluster has fewer GPUs
    than learners (each takes an equal share; gradients then go through gloo on the host, as
    NCCL needs a GPU per rank). False: more learners than GPUs is refused."""
    learner_processes: bool = False
    """With run.learners > 1: the learners are fresh Python processes on this machine instead
    of Ray actors (Ray need not be installed): no cluster and no placement groups. Their
    updates are the same, to the bit, and as fast (benchmarks/README.md); a dead learner
    restarts the group from its synchronized state, as on Ray. run.share_gpus still decides
    whether learners may share a GPU (learner i takes GPU i mod the machine's count)."""
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

    GATES: ClassVar[dict[str, Gate]] = {
        "ray_address": Gate(
            "", lambda run: run.runners > 0 or run.learners > 1,
            "with Ray runners or learners (run.runners > 0 or run.learners > 1)",
        ),
        "share_gpus": Gate("learners", lambda n: n > 1, "with a learner group (run.learners > 1)"),
        "learner_processes": Gate(
            "learners", lambda n: n > 1, "with a learner group (run.learners > 1)"
        ),
        "max_worker_restarts": Gate(
            "runners", lambda n: n > 0, "with Ray runners (run.runners > 0)"
        ),
    }  # fmt: skip

    def __post_init__(self) -> None:
        check(self, "seed", self.seed >= 0, "must be >= 0")
        check_positive(self, "total_steps", "eval_episodes", "keep_checkpoints", "torch_threads")
        check(self, "eval_every_steps", self.eval_every_steps >= 0, "must be >= 0")
        check(self, "runners", self.runners >= 0, "must be >= 0 (0: no Ray)")
        check(self, "learners", self.learners >= 1, "must be >= 1 (1: no learner group)")
        check_choices(self)
        for tracker, module, extra in (("wandb", "wandb", "wandb"), ("mlflow", "mlflow", "mlflow")):
            if getattr(self, tracker) is not None and importlib.util.find_spec(module) is None:
                raise ConfigError(
                    f"RunConfig.{tracker} needs the {module} package: pip install 'shoal[{extra}]'"
                )
        check(self, "max_worker_restarts", self.max_worker_restarts >= 0, "must be >= 0")
        check(self, "checkpoint_every_steps", self.checkpoint_every_steps >= 0, "must be >= 0")
        if self.max_wall_s is not None:
            check(self, "max_wall_s", self.max_wall_s > 0, "must be > 0 seconds")
        if self.target_return is not None:
            check(self, "target_return", not math.isnan(self.target_return), "must be a number")
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
    atari: Literal["none", "deepmind", "crop80-stack", "crop80-diff"] = "none"
    """Atari frame preprocessing for ALE ids (needs the atari extra; `shoal.envs.atari`).
    deepmind: no-op and FIRE resets, frame skip 4 with max-pooling, 84x84 grayscale, 4 frames
    stacked (uint8 [4, 84, 84]). crop80-stack / crop80-diff: Lamb et al.'s 160x160 crop,
    grayscale and 80x80 downsampling, then 4 frames stacked or the difference of consecutive
    frames."""
    atari_training: bool = True
    """With atari deepmind: end an episode at every life loss and clip rewards to their sign.
    Evaluation envs turn it off (the training loop does); logged episode returns are always
    true scores of whole games."""

    RENAMED_VALUES: ClassVar[dict[str, dict[str, str]]] = {
        "atari": {"ref001-stack": "crop80-stack", "ref001-diff": "crop80-diff"}
    }

    GATES: ClassVar[dict[str, Gate]] = {
        "clip_reward": Gate("normalize_reward", bool, "with env.normalize_reward"),
        "gamma": Gate("normalize_reward", bool, "with env.normalize_reward"),
    }

    def __post_init__(self) -> None:
        object.__setattr__(self, "atari", renamed_value(type(self), "atari", self.atari))
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


ENCODERS = ("mlp", "nature", "batchnorm-cnn2", "batchnorm-cnn3-lstm", "impala")
"""The built-in observation encoders (`ModelConfig.encoder`)."""


@dataclass(frozen=True)
class ModelConfig:
    """Network shapes for MLP actor-critic models."""

    hidden: tuple[int, ...] = (64, 64)
    """Hidden layer sizes of the MLP encoders."""
    activation: Literal["tanh", "relu", "silu", "elu"] = "tanh"
    """Hidden activation of the MLP layers (``hidden``, ``key_hidden``). An image encoder on
    image observations builds no MLP: its layers take ``encoder_activation``."""
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
    """Observation encoder: mlp, nature, batchnorm-cnn2, batchnorm-cnn3-lstm, impala
    (`shoal.nn.cnn`), or a user's network as module:Class (`shoal.nn.custom`). mlp:
    observations flattened (Box) or one-hot (Discrete), then the hidden layers; Dict and Tuple
    observations get one encoder per part, concatenated (`shoal.nn.composite`), image parts
    the CNN named here (nature when mlp). The others read channel-first images [C, H, W] (uint8
    frames are scaled by 1/255) and replace the MLP, so hidden is unused: nature is the DQN
    Nature CNN (Mnih et al. 2015; FC 512); batchnorm-cnn2 is Lamb et al.'s two conv layers
    with batch norm, flattened (3200 features on 80x80); batchnorm-cnn3-lstm is its three conv
    layers (512 features on 80x80) and implies its LSTM 256 core, so lstm_hidden None becomes
    256 (any other size is an error); impala is the IMPALA ResNet (Espeholt et al. 2018; FC
    256). PPO, A2C and DQN read it (DQN has no LSTM core, hence no batchnorm-cnn3-lstm)."""
    encoder_activation: Literal["relu", "tanh", "silu", "elu"] = "relu"
    """The nonlinearity after every layer of the image encoders (nature, batchnorm-cnn2,
    batchnorm-cnn3-lstm, impala, and those of Dict/Tuple image parts) and of AlphaZero's
    board network: their papers' ReLU, or SiLU (x * sigmoid(x); Lamb et al.'s Model 3 SiLU
    variant), tanh or ELU."""
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
    """How MLP actor-critics train and act (`shoal.fast.backend`). torch: autograd. numpy: the
    forward and a hand-derived backward pass in NumPy, several times faster on the small
    networks of control tasks (PPO and A2C learners; every sampler of an MLP actor-critic);
    CPU, float32, tanh or relu MLPs only. auto: numpy where it applies, torch otherwise."""

    RENAMED_VALUES: ClassVar[dict[str, dict[str, str]]] = {
        "encoder": {"ref001-model2": "batchnorm-cnn2", "ref001-model3": "batchnorm-cnn3-lstm"}
    }

    GATES: ClassVar[dict[str, Gate]] = {
        "temperature_anneal": Gate("temperature_min", lambda t: t is not None,
                                   "with model.temperature_min (an annealed temperature)"),
        "temperature_unit": Gate("temperature_min", lambda t: t is not None,
                                 "with model.temperature_min (an annealed temperature)"),
    }  # fmt: skip

    def __post_init__(self) -> None:
        object.__setattr__(self, "encoder", renamed_value(type(self), "encoder", self.encoder))
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
        if self.encoder == "batchnorm-cnn3-lstm":
            if self.lstm_hidden is None:  # the paper's Model 3 is CNN + LSTM 256 (Lamb et al.)
                object.__setattr__(self, "lstm_hidden", 256)
            check(
                self,
                "lstm_hidden",
                self.lstm_hidden == 256,
                "encoder 'batchnorm-cnn3-lstm' is Lamb et al.'s CNN + LSTM 256: use 256 or "
                "leave it unset (or pick encoder 'batchnorm-cnn2' / 'nature' / 'impala')",
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
            "batchnorm-cnn2, batchnorm-cnn3-lstm, impala); the mlp encoder computes in float32",
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

    GATES: ClassVar[dict[str, Gate]] = {
        name: Gate(
            "snapshot_every", lambda n: n > 0, "with self-play (self_play.snapshot_every > 0)"
        )
        for name in ("pool_size", "sampling", "pfsp_power", "elo_k")
    }

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

    GATES: ClassVar[dict[str, Gate]] = {
        "theta": Gate("kind", lambda k: k == "ou", "with noise.kind ou"),
        "sigma": Gate("kind", lambda k: k == "ou", "with noise.kind ou"),
    }

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
    """Gradient steps per rollout of env.num_envs envs: updates per env step =
    gradient_steps / (rollout_steps x env.num_envs), in-process and with run.runners alike (an
    iteration with R runners gathers R rollouts and takes R x gradient_steps)."""
    max_lag: int = 0
    """Asynchronous sampling (DQN, DDPG, TD3, SAC, D4PG, with run.runners >= 1): iterations
    the sampling runs ahead of learning. 0: each iteration samples with the weights just
    learned, then learns. k >= 1: the runners sample rollout n with the weights of iteration
    n - k while the learner trains, exactly: which weights act is counted, not timed, so a
    seeded run is the same however the processes are scheduled. Logged as
    train/policy_lag."""
    save: bool = False
    """Store the replay buffer in checkpoints (exact resume; large files)."""

    GATES: ClassVar[dict[str, Gate]] = {
        name: Gate("prioritized", lambda p: p != "none",
                   "with prioritized replay (replay.prioritized proportional or rank)")
        for name in ("priority_alpha", "priority_beta")
    }  # fmt: skip

    def __post_init__(self) -> None:
        check_choices(self)
        check_positive(self, "buffer_size", "batch_size", "n_step", "gradient_steps")
        check(self, "learning_starts", self.learning_starts >= 0, "must be >= 0")
        check(self, "max_lag", self.max_lag >= 0, "must be >= 0 (0: synchronous sampling)")
        check(self, "priority_alpha", self.priority_alpha >= 0, "must be >= 0")
        check(self, "priority_beta", 0.0 <= self.priority_beta <= 1.0, "must be in [0, 1]")


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
