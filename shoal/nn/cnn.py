"""Image encoders for channel-first observations ``[C, H, W]`` (``[H, W]`` reads as one channel).

Each encoder maps a batch ``[N, C, H, W]`` to flat features ``[N, out_dim]`` and takes the
place of `ObsEncoding` + `MLP` in `ActorCritic`, `RecurrentActorCritic` and `QNetwork` when
``ModelConfig.encoder`` names it (`build_encoder`). uint8 frames are scaled to [0, 1] inside the
encoder, so replay and rollout storage keep them as uint8 (a quarter of float32's memory).

* ``nature``: the DQN network of Mnih et al. 2015 (Nature): 32 8x8/4, 64 4x4/2, 64 3x3/1,
  FC 512, ReLU after each layer (84x84 input: 20x20, 9x9, 7x7 feature maps).
* ``batchnorm-cnn2``: Lamb et al.'s Model 2: conv 16 8x8/4 pad 2 (80x80 -> 20x20), conv 32
  4x4/2 pad 1 (-> 10x10), batch norm and ReLU after each, flattened to 3200 features that the
  heads read directly.
* ``batchnorm-cnn3-lstm``: the convolutional part of Lamb et al.'s Model 3: Model 2's two layers,
  then conv 32 4x4/2 pad 0 (-> 4x4), flattened to 512 features that feed its LSTM 256
  (``ModelConfig.lstm_hidden``, the `RecurrentActorCritic` core).
* ``impala``: the IMPALA ResNet of Espeholt et al. 2018: three stacks (16, 32, 32 channels) of
  conv 3x3, max-pool 3x3/2 and two residual blocks, then ReLU and FC 256.

Lamb et al. say "between each convolutional layer, batch normalization and ReLU are
applied"; here the last convolution is followed by them too, as every layer of the Nature and
IMPALA networks is by its nonlinearity, so the heads (or the LSTM) read rectified features.
Batch norm uses batch statistics in training mode and running statistics in `eval` mode (the
deployed `shoal.nn.policy.ActorPolicy`); its running statistics travel with the weights.

Every encoder's nonlinearity is its paper's ReLU unless ``ModelConfig.encoder_activation``
names another: Lamb et al. also trained Model 3 with SiLU (Elfwing et al. 2018,
"Sigmoid-weighted linear units for neural network function approximation in reinforcement
learning"), x * sigmoid(x).

Weights follow `shoal.nn.init`: orthogonal with gain sqrt(2), zero biases.

``ModelConfig.precision`` ``bfloat16`` or ``float16`` runs an encoder's convolutions and FC
layer in mixed precision (autocast): weights, gradients, optimizer state and everything after
the encoder stay float32, and the features leave the encoder as float32. On GPUs both types
use the tensor cores (float16 needs the learner's gradient scaler, `shoal.core.device.grad_scaler`).
On CPUs with AMX or AVX512-BF16 (Intel Sapphire Rapids and later) oneDNN's bfloat16
convolutions make a Nature CNN training step about 2x faster; on other CPUs bfloat16 is
emulated and slower, and `ImageEncoder` warns (`native_bfloat16`). float16 applies on CUDA only:
a sampler's copy acting on the CPU computes in float32.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence

import gymnasium as gym
import numpy as np
import torch
from torch import nn

from shoal.config import ModelConfig
from shoal.core.device import autocast_dtype
from shoal.core.errors import ConfigError, UnsupportedSpaceError
from shoal.envs.shapes import shape_of
from shoal.nn.activations import ACTIVATION_MODULES, ACTIVATIONS
from shoal.nn.init import HIDDEN_GAIN, init_linear, linear

# (out_channels, kernel, stride, padding) of each convolution.
NATURE_CONVS = ((32, 8, 4, 0), (64, 4, 2, 0), (64, 3, 1, 0))
BATCHNORM_CNN2_CONVS = ((16, 8, 4, 2), (32, 4, 2, 1))
BATCHNORM_CNN3_CONVS = ((16, 8, 4, 2), (32, 4, 2, 1), (32, 4, 2, 0))
IMPALA_CHANNELS = (16, 32, 32)


def native_bfloat16() -> bool:
    """Whether this CPU computes bfloat16 natively (AMX tiles or AVX512-BF16), by PyTorch's
    own CPU feature checks (private helpers, hence the fallback to "no")."""
    checks = ("_is_amx_tile_supported", "_is_avx512_bf16_supported")
    return any(getattr(torch.cpu, name, lambda: False)() for name in checks)


def conv2d(
    in_channels: int, out_channels: int, kernel: int, stride: int = 1, padding: int = 0
) -> nn.Conv2d:
    """An orthogonally initialized `nn.Conv2d` (gain sqrt(2), zero bias)."""
    layer = nn.Conv2d(in_channels, out_channels, kernel, stride, padding)
    return init_linear(layer, HIDDEN_GAIN)  # orthogonal_ flattens the kernel to [out, in*k*k]


def conv_output_size(size: int, kernel: int, stride: int, padding: int) -> int:
    return (size + 2 * padding - kernel) // stride + 1


class ImageEncoder(nn.Module):
    """Scale, then a convolutional ``trunk``, flattened, then an optional ``fc`` layer and its
    ``activation`` (ReLU in every encoder's paper).

    ``scale`` is 1/255 for uint8 observation spaces and 1 otherwise.

    The trunk runs in the channels-last memory layout (weights and activations stored
    ``[N, H, W, C]``; shapes and results are unchanged): PyTorch's CPU convolutions (oneDNN)
    are faster there. Measured with one thread on a 256-frame training step (forward, backward,
    Adam): 1.54x for the Nature CNN, 1.69x / 1.53x for Lamb et al.'s Models 2 / 3, 1.48x for
    the IMPALA ResNet."""

    def __init__(
        self,
        trunk: nn.Module,
        flat_dim: int,
        fc: int | None,
        scale: float,
        precision: str = "float32",
        activation: str = "relu",
    ):
        super().__init__()
        self.trunk = trunk.to(memory_format=torch.channels_last)  # type: ignore[call-overload]
        self.fc = None if fc is None else linear(flat_dim, fc)
        self.activation = ACTIVATIONS[activation]
        self.scale = scale
        self.out_dim = flat_dim if fc is None else fc
        self.autocast_dtype = autocast_dtype(precision)
        self._warned = False

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        x = obs.unsqueeze(1) if obs.dim() == 3 else obs  # [N, H, W]: one channel
        # Reorder the raw frames (uint8: a quarter of float32's bytes to move); the float
        # conversion and the scaling keep the layout.
        x = x.contiguous(memory_format=torch.channels_last).float()
        if self.scale != 1.0:
            x = x * self.scale
        with torch.autocast(x.device.type, dtype=self.autocast_dtype, enabled=self._autocast(x)):
            x = self.trunk(x).flatten(start_dim=1)
            if self.fc is not None:
                x = self.activation(self.fc(x))
        return x.float()  # a no-op in float32; heads, losses and LSTMs read float32

    def _autocast(self, x: torch.Tensor) -> bool:
        """Whether to compute in the reduced precision on ``x``'s device: bfloat16 anywhere
        (with a warning, once, on a CPU that emulates it), float16 on CUDA only."""
        dtype = self.autocast_dtype
        if dtype is None or (dtype == torch.float16 and x.device.type != "cuda"):
            return False
        if x.device.type == "cpu" and not self._warned and not native_bfloat16():
            self._warned = True
            warnings.warn(
                "model.precision 'bfloat16' is emulated on this CPU (no AMX or AVX512-BF16) "
                "and computes slower than float32",
                stacklevel=3,
            )
        return True


def _image_shape(obs_space: gym.Space, encoder: str) -> tuple[int, int, int]:
    if not isinstance(obs_space, gym.spaces.Box) or len(obs_space.shape) not in (2, 3):
        raise UnsupportedSpaceError(
            f"model.encoder {encoder!r} reads image observations: a Box of shape [C, H, W] or "
            f"[H, W]; got {obs_space}. Use model.encoder 'mlp' for other observations"
        )
    shape = tuple(obs_space.shape)
    return (1, *shape) if len(shape) == 2 else shape  # type: ignore[return-value]


def _too_small(encoder: str, shape: tuple[int, ...], minimum: str) -> ConfigError:
    hint = ""
    if shape[-1] in (1, 3, 4) and shape[0] > 4:
        hint = " (it looks channel-last; the encoders read channel-first [C, H, W] frames)"
    return ConfigError(
        f"model.encoder {encoder!r} needs images of at least {minimum} pixels; got "
        f"observations of shape {shape}{hint}"
    )


def conv_stack(
    in_channels: int,
    height: int,
    width: int,
    convs: Sequence[tuple[int, int, int, int]],
    batch_norm: bool,
    activation: str = "relu",
) -> tuple[nn.Sequential, tuple[int, int, int]]:
    """Conv (+ batch norm) + ``activation`` for each ``(out, kernel, stride, padding)``;
    returns the stack and its output shape ``(C, H, W)``."""
    layers: list[nn.Module] = []
    for out, kernel, stride, padding in convs:
        layers.append(conv2d(in_channels, out, kernel, stride, padding))
        if batch_norm:
            layers.append(nn.BatchNorm2d(out))
        layers.append(ACTIVATION_MODULES[activation]())
        in_channels = out
        height = conv_output_size(height, kernel, stride, padding)
        width = conv_output_size(width, kernel, stride, padding)
    return nn.Sequential(*layers), (in_channels, height, width)


class ResidualBlock(nn.Module):
    """``x + conv(f(conv(f(x))))`` with ``f`` the activation (ReLU in the paper), both
    convolutions 3x3 with the same channels."""

    def __init__(self, channels: int, activation: str = "relu"):
        super().__init__()
        self.conv0 = conv2d(channels, channels, 3, padding=1)
        self.conv1 = conv2d(channels, channels, 3, padding=1)
        self.activation = ACTIVATIONS[activation]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        f = self.activation
        return x + self.conv1(f(self.conv0(f(x))))


def impala_trunk(
    in_channels: int,
    height: int,
    width: int,
    channels: Sequence[int] = IMPALA_CHANNELS,
    activation: str = "relu",
) -> tuple[nn.Sequential, tuple[int, int, int]]:
    """IMPALA's ResNet stacks (Espeholt et al. 2018, Fig. 3), ending in the activation."""
    layers: list[nn.Module] = []
    for out in channels:
        layers += [
            conv2d(in_channels, out, 3, padding=1),
            nn.MaxPool2d(3, stride=2, padding=1),
            ResidualBlock(out, activation),
            ResidualBlock(out, activation),
        ]
        in_channels = out
        height, width = conv_output_size(height, 3, 2, 1), conv_output_size(width, 3, 2, 1)
    layers.append(ACTIVATION_MODULES[activation]())
    return nn.Sequential(*layers), (in_channels, height, width)


def image_encoder(
    obs_space: gym.Space, encoder: str, precision: str = "float32", activation: str = "relu"
) -> ImageEncoder:
    """One ``encoder`` network (a `ModelConfig.encoder` name other than mlp) for ``obs_space``,
    computing in ``precision`` (`ModelConfig.precision`), with ``activation``
    (`ModelConfig.encoder_activation`) after each layer."""
    channels, height, width = _image_shape(obs_space, encoder)
    if encoder == "impala":
        trunk, out_shape = impala_trunk(channels, height, width, activation=activation)
        fc, minimum = 256, "1x1"
    elif encoder == "nature":
        trunk, out_shape = conv_stack(channels, height, width, NATURE_CONVS, False, activation)
        fc, minimum = 512, "36x36"
    elif encoder == "batchnorm-cnn2":
        convs: tuple[tuple[int, int, int, int], ...] = BATCHNORM_CNN2_CONVS
        trunk, out_shape = conv_stack(channels, height, width, convs, True, activation)
        fc, minimum = None, "8x8"
    elif encoder == "batchnorm-cnn3-lstm":
        convs = BATCHNORM_CNN3_CONVS
        trunk, out_shape = conv_stack(channels, height, width, convs, True, activation)
        fc, minimum = None, "32x32"
    else:
        raise ConfigError(f"unknown model.encoder {encoder!r}")
    if min(out_shape[1:]) < 1:
        raise _too_small(encoder, shape_of(obs_space), minimum)
    scale = 1.0 / 255.0 if obs_space.dtype == np.uint8 else 1.0
    return ImageEncoder(trunk, int(np.prod(out_shape)), fc, scale, precision, activation)


class ParallelEncoders(nn.Module):
    """Independent encoders on the same input: ``[N, ...] -> [members, N, out_dim]``, the
    layout of `shoal.nn.mlp.ParallelMLP` (separate actor and critic encoders)."""

    def __init__(self, encoders: Sequence[nn.Module]):
        super().__init__()
        self.members = nn.ModuleList(encoders)
        self.out_dim = encoders[0].out_dim

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return torch.stack([encoder(obs) for encoder in self.members])


def build_encoder(obs_space: gym.Space, config: ModelConfig, members: int = 1) -> nn.Module:
    """The image encoder ``config.encoder`` names, with ``out_dim`` features: one network
    ``[N, ...] -> [N, out_dim]``, or ``members`` independent ones stacked as
    ``[members, N, out_dim]``. The ``mlp`` encoder is built where it is used
    (`ObsEncoding` + `MLP`), so its fast path has no extra layer of calls."""
    if config.encoder == "mlp":
        raise ValueError("build_encoder builds image encoders; mlp is ObsEncoding + MLP")
    encoders = [
        image_encoder(obs_space, config.encoder, config.precision, config.encoder_activation)
        for _ in range(members)
    ]
    return encoders[0] if members == 1 else ParallelEncoders(encoders)
