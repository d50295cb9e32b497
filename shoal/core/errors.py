"""Exceptions that carry a message meant for the user, not a traceback to decode."""

from __future__ import annotations


class ShoalError(Exception):
    """Base class: the CLI prints these as one clear line and exits non-zero."""


class ConfigError(ShoalError, ValueError):
    """A config field has a value outside its allowed range."""


class UnknownFieldError(ConfigError):
    """A config names a field its dataclass does not have (the message lists close matches)."""


class UnknownEnvError(ShoalError, ValueError):
    """The environment id is not registered with Gymnasium (or shoal)."""


class UnsupportedSpaceError(ShoalError, ValueError):
    """An algorithm or model was given an observation or action space it cannot handle."""


class CheckpointError(ShoalError):
    """A checkpoint is missing, corrupted or incompatible with this version of shoal."""


class NaNLossError(ShoalError, FloatingPointError):
    """A loss became NaN or infinite; training stopped before the weights were corrupted further."""


class DistributedError(ShoalError):
    """Ray is missing, the cluster cannot be reached, or workers keep failing."""


class DatasetError(ShoalError, ValueError):
    """An offline dataset is missing, corrupt, or does not fit the env or the learner."""
