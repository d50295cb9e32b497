"""Trained policies as standalone files: ONNX (for ONNX Runtime and other runtimes) or
TorchScript (for ``torch.jit.load`` without shoal), with the observation normalization a run
trained with built in. ``shoal export RUN --format onnx|torchscript``.

The exported graph is the deterministic policy: observations ``obs`` (float32 ``[B, ...]``)
in, actions ``action`` out, as ``shoal.load(RUN).act(obs)`` gives them (`export` checks this
on a batch of observations drawn from the observation space). Recurrent policies take their
state explicitly: ``obs`` and ``state`` (``[B, 2, H]``, zeros at an episode's start) in,
``action`` and ``next_state`` out. Runs of several agent groups export one file per group
(decentralized execution: each group's policy on its own agents' observations
``[B, N, ...]``).

The normalization here is a second implementation of `shoal.envs.normalize.normalize`, in
torch so that it runs inside the graph; the check against ``act`` covers both.
"""

from __future__ import annotations

import importlib.util
import logging
import warnings
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import torch
from torch import nn

from shoal.config import replace
from shoal.core.errors import ShoalError
from shoal.envs.agents_as_batch import actor_space, critic_part
from shoal.envs.composite import PackedActions, PackedObs
from shoal.envs.games import is_game_id
from shoal.envs.make import make_multi_agent_env
from shoal.envs.multi_agent import is_multi_agent_id
from shoal.envs.normalize import RunningMeanStd
from shoal.envs.shapes import as_discrete
from shoal.nn.policy import ActorPolicy, JointPolicy
from shoal.nn.recurrent import is_recurrent
from shoal.registry import algorithm_for_config

FORMATS = ("onnx", "torchscript")
SUFFIX = {"onnx": ".onnx", "torchscript": ".pt"}


class _NormalizedInput(nn.Module):
    """What every exported actor does first: a MAPPO-style critic part appended as zeros,
    then normalization with the run's frozen statistics (`normalize`)."""

    mean: torch.Tensor
    std: torch.Tensor

    def __init__(self, policy: ActorPolicy) -> None:
        super().__init__()
        self.model = policy.model
        stats = policy.obs_stats
        self.normalized = stats is not None
        if stats is not None and not isinstance(stats, RunningMeanStd):
            raise ShoalError("export supports whole-observation normalization, not per field")
        mean = np.zeros(1) if stats is None else stats.mean
        var = np.ones(1) if stats is None else stats.var
        self.register_buffer("mean", torch.as_tensor(mean, dtype=torch.float32))
        self.register_buffer("std", torch.as_tensor(np.sqrt(var + 1e-8), dtype=torch.float32))
        self.clip = float(policy.clip_obs)
        self.critic_dim = critic_part(policy.observation_space)

    def normalize(self, obs: torch.Tensor) -> torch.Tensor:
        x = obs.float()
        if self.critic_dim:  # the centralized critic's input, which the policy never reads
            x = torch.cat([x, x.new_zeros(x.shape[0], self.critic_dim)], 1)
        if self.normalized:
            x = torch.clamp((x - self.mean) / self.std, -self.clip, self.clip)
        return x


class DeterministicActor(_NormalizedInput):
    """``obs -> action``: normalization (frozen statistics), then the policy's mode."""

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return self.model.distribution(self.normalize(obs)).mode()


class MaskedDeterministicActor(_NormalizedInput):
    """``(obs, action_mask) -> action`` for a policy trained with legal-action masks: the
    file takes the mask ``[B, A]`` (True: legal) as its second input and never picks an
    illegal action, as ``policy.act(obs, action_mask=m)``."""

    def forward(self, obs: torch.Tensor, action_mask: torch.Tensor) -> torch.Tensor:
        return self.model.distribution(self.normalize(obs), action_mask.bool()).mode()


class RecurrentDeterministicActor(_NormalizedInput):
    """``(obs, state) -> (action, next_state)`` for an LSTM actor-critic; ``state_size``
    (a buffer, kept in TorchScript files) is the LSTM's ``H``."""

    state_size: torch.Tensor

    def __init__(self, policy: ActorPolicy) -> None:
        super().__init__(policy)
        self.register_buffer("state_size", torch.tensor(policy.model.hidden_size))

    def forward(self, obs: torch.Tensor, state: torch.Tensor) -> tuple[torch.Tensor, ...]:
        features, next_state = self.model(self.normalize(obs).unsqueeze(0), state)
        return self.model.policy_head(features[0]).mode(), next_state


class GroupActor(nn.Module):
    """One agent group's deterministic policy of a joint (several-group) run, whose actors
    act greedily on their own observations (MADDPG's): ``obs [B, N, obs_dim] -> action
    [B, N(, d)]``."""

    def __init__(self, joint: JointPolicy, group: str) -> None:
        super().__init__()
        actor = joint.model.groups[group]
        if not hasattr(actor, "greedy"):
            raise ShoalError(
                f"export of this run's group {group!r} ({type(actor).__name__}) is not supported "
                "yet: joint runs export when their actors act on their own observations "
                "(MADDPG's)"
            )
        self.actor = actor

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return self.actor.greedy(obs.float())


def example_observations(space: gym.Space, batch: int, seed: int) -> np.ndarray:
    """``batch`` observations drawn from ``space`` (finite bounds, or a standard normal where
    a Box is unbounded), float32."""
    rng = np.random.default_rng(seed)
    if isinstance(space, gym.spaces.Box):
        low = np.where(np.isfinite(space.low), space.low, -3.0)
        high = np.where(np.isfinite(space.high), space.high, 3.0)
        draw = rng.uniform(low, high, size=(batch, *space.shape))
        return draw.astype(np.float32)
    space.seed(seed)
    return np.stack([np.asarray(space.sample(), np.float32) for _ in range(batch)])


def export(
    policy: ActorPolicy | JointPolicy, path: str | Path, format: str = "onnx", check: int = 64
) -> list[Path]:
    """Write ``policy`` (from ``shoal.load``) to ``path`` (a file; one file per group, named
    ``<stem>.<group><suffix>``, for joint policies) and check on ``check`` observations that
    the file gives ``policy.act``'s actions. Returns the files written."""
    if format not in FORMATS:
        raise ShoalError(f"export format must be one of {list(FORMATS)}, not {format!r}")
    if format == "onnx":
        missing = [
            m for m in ("onnx", "onnxruntime", "onnxscript") if not importlib.util.find_spec(m)
        ]
        if missing:
            raise ShoalError(f"ONNX export needs {missing}: pip install 'shoal[export]'")
    spec = algorithm_for_config(policy.config)
    if spec.deploys_search:
        raise ShoalError(
            f"{spec.name} deploys a search (MCTS in its learned model at every step), and a "
            "search is not a network: export writes networks; use shoal.load(RUN).act"
        )
    path = Path(path)
    if path.suffix == "":
        path = path.with_suffix(SUFFIX[format])
    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(policy, JointPolicy):
        return [_export_group(policy, g, path, format, check) for g in policy.groups]
    space = policy.observation_space
    if space is None or (isinstance(space, PackedObs) and not critic_part(space)):
        shown = getattr(space, "original", space)
        raise ShoalError(
            f"export takes policies whose observation is one array (Box, Discrete, "
            f"MultiDiscrete); this one reads {shown}: use shoal.load(RUN).act in Python, "
            "which takes Dict and Tuple observations as the env gives them"
        )
    if isinstance(policy.action_space, PackedActions):
        raise ShoalError(
            f"export takes policies whose action is one array (Discrete, MultiDiscrete, Box); "
            f"this one acts in {policy.action_space.original}: use shoal.load(RUN).act in Python"
        )
    masked = isinstance(policy, ActorPolicy) and policy.takes_mask and has_mask(policy)
    if masked and is_recurrent(policy.model):
        raise ShoalError(
            "export of a recurrent policy with action masks is not supported yet: use "
            "shoal.load(RUN).act(obs, action_mask=m) in Python"
        )
    obs = example_observations(actor_space(space), check, seed=0)
    full = obs
    if isinstance(space, gym.spaces.Dict) and critic_part(space):  # act reads the whole row:
        critic = example_observations(space["critic"], check, seed=1)  # a random critic part
        full = np.concatenate([obs.reshape(check, -1), critic.reshape(check, -1)], 1)
    if is_recurrent(policy.model):
        module: nn.Module = RecurrentDeterministicActor(policy).eval()
        state = policy.model.initial_state(check).cpu()
        inputs: tuple = (torch.as_tensor(obs), state)
        names, outputs = ["obs", "state"], ["action", "next_state"]
    elif masked:
        module = MaskedDeterministicActor(policy).eval()
        assert policy.action_space is not None  # a masked policy's actions are known
        mask = example_masks(policy.action_space, check, seed=2)
        inputs = (torch.as_tensor(obs), torch.as_tensor(mask))
        names, outputs = ["obs", "action_mask"], ["action"]
    else:
        module = DeterministicActor(policy).eval()
        inputs = (torch.as_tensor(obs),)
        names, outputs = ["obs"], ["action"]
    _write(module, inputs, names, outputs, path, format)
    for n in check_batches(check):  # the file serves every batch size, not the traced one
        if hasattr(policy.model, "reset_state"):  # act from a zero state, as the file does
            policy.model.reset_state()
        if masked:
            want = policy.act(full[:n], action_mask=mask[:n])
            got = run_exported(path, obs[:n], format, action_mask=mask[:n])
            if not np.take_along_axis(mask[:n], np.asarray(got).reshape(-1, 1), 1).all():
                raise ShoalError(f"{path}: the exported policy picked an illegal action")
        else:
            want = policy.act(full[:n])
            got = run_exported(path, obs[:n], format, recurrent=is_recurrent(policy.model))
        _compare(got, want, path)
    return [path]


def check_batches(check: int) -> list[int]:
    """The batch sizes an export is checked at: the ``check`` observations it was traced
    with, one, and three."""
    return list(dict.fromkeys(min(n, check) for n in (check, 1, 3)))


def has_mask(policy: ActorPolicy) -> bool:
    """Whether the run trained with legal-action masks (``env.action_mask``, a two-player
    game's rules, or a masked multi-agent env): then the exported file takes them."""
    env = getattr(policy.config, "env", None)
    if env is None:
        return False
    if getattr(env, "action_mask", "none") not in ("none", None, "") or is_game_id(env.id):
        return True
    if not is_multi_agent_id(env.id):
        return False
    probe = make_multi_agent_env(replace(env, num_envs=1))  # masks in its observations?
    try:
        probe.reset(seed=0)
        return getattr(probe, "action_mask", None) is not None
    finally:
        probe.close()


def example_masks(space: gym.Space, batch: int, seed: int) -> np.ndarray:
    """``batch`` random legal-action masks of a Discrete space, each with a legal action."""
    rng = np.random.default_rng(seed)
    actions = int(as_discrete(space).n)
    mask = rng.random((batch, actions)) < 0.5
    mask[np.arange(batch), rng.integers(0, actions, batch)] = True
    return mask


def _export_group(joint: JointPolicy, group: str, path: Path, format: str, check: int) -> Path:
    module = GroupActor(joint, group).eval()
    rng = np.random.default_rng(0)
    everyone = {
        g: rng.normal(size=(check, a.num_agents, a.obs_dim)).astype(np.float32)
        for g, a in joint.model.groups.items()
    }
    obs = everyone[group]
    target = path.with_name(f"{path.stem}.{group}{path.suffix}")
    _write(module, (torch.as_tensor(obs),), ["obs"], ["action"], target, format)
    for n in check_batches(check):
        want = joint.act({g: o[:n] for g, o in everyone.items()})[group]
        _compare(run_exported(target, obs[:n], format), want, target)
    return target


def _write(module: nn.Module, inputs: tuple, names: list[str], outputs: list[str], path: Path,
           format: str) -> None:  # fmt: skip
    with torch.no_grad():
        if format == "torchscript":
            traced = torch.jit.trace(module, inputs, check_trace=False)
            traced.save(str(path))
            return
        # A bounded batch: PyTorch 2.7's torch.export refuses an unbounded dynamic dimension
        # of a recurrent model (a guard against the int64 maximum).
        batch = torch.export.Dim("batch", max=2**20)
        shapes = tuple({0: batch} for _ in inputs)
        quiet = logging.getLogger("torch.onnx")  # its notes on optional torchvision ops
        level = quiet.level
        quiet.setLevel(logging.ERROR)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            program = torch.onnx.export(
                module, inputs, input_names=names, output_names=outputs,
                dynamic_shapes=shapes, dynamo=True, verbose=False,
            )  # fmt: skip
        quiet.setLevel(level)
        if program is None:
            raise ShoalError(f"{path}: torch.onnx.export returned no program")
        program.save(str(path))


def run_exported(
    path: Path,
    obs: np.ndarray,
    format: str,
    recurrent: bool = False,
    state: Any = None,
    action_mask: np.ndarray | None = None,
) -> np.ndarray:
    """The actions an exported file gives for ``obs`` (a recurrent one from a zero state,
    unless ``state`` is given; a masked one with ``action_mask``)."""
    obs = np.asarray(obs, np.float32)
    if action_mask is not None:
        if format == "torchscript":
            with torch.no_grad():
                out = torch.jit.load(str(path))(torch.as_tensor(obs), torch.as_tensor(action_mask))
            return out.numpy()
        import onnxruntime

        session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
        return session.run(["action"], {"obs": obs, "action_mask": np.asarray(action_mask)})[0]
    if recurrent and state is None:
        hidden = _state_size(path, format)
        state = np.zeros((len(obs), 2, hidden), np.float32)
    if format == "torchscript":
        module = torch.jit.load(str(path))
        with torch.no_grad():
            args = [torch.as_tensor(obs)] + ([torch.as_tensor(state)] if recurrent else [])
            out = module(*args)
        return (out[0] if recurrent else out).numpy()
    import onnxruntime

    session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    feeds = {"obs": obs, **({"state": state} if recurrent else {})}
    return session.run(["action"], feeds)[0]


def _state_size(path: Path, format: str) -> int:
    if format == "torchscript":
        return int(torch.jit.load(str(path)).state_size)
    import onnxruntime

    session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return int(next(i for i in session.get_inputs() if i.name == "state").shape[-1])


def _compare(got: np.ndarray, want: np.ndarray, path: Path) -> None:
    got, want = np.asarray(got), np.asarray(want)
    at = f" at batch size {len(want)}"
    if got.shape != want.shape:
        raise ShoalError(
            f"{path}: exported actions have shape {got.shape}, act gives {want.shape}{at}"
        )
    if np.issubdtype(want.dtype, np.integer):
        agree = float((got == want).mean())
        if agree < 1.0:
            raise ShoalError(f"{path}: exported actions agree with act on {agree:.1%} only{at}")
    elif not np.allclose(got, want, atol=1e-4, rtol=1e-4):
        gap = float(np.abs(got - want).max())
        raise ShoalError(f"{path}: exported actions differ from act's by up to {gap:.2e}{at}")
