"""Running parts of shoal in other processes and on other machines.

`shoal.distributed.ray_workers` is, with `shoal.collect.ray`, the only place that imports
Ray; everything else reaches it through `ray_workers()`, which turns a missing installation
into an error that says what to install.
"""

from __future__ import annotations

from types import ModuleType

from shoal.core.errors import DistributedError

__all__ = ["DistributedError", "require_ray"]


def require_ray() -> ModuleType:
    """The Ray-backed worker module, imported on first use."""
    try:
        from shoal.distributed import ray_workers as module
    except ImportError as exc:
        if exc.name is not None and exc.name.split(".")[0] == "ray":
            raise DistributedError(
                "distributed training needs Ray, which is not installed: "
                "pip install 'shoal[ray]' (or set run.runners to 0 to sample in-process)"
            ) from exc
        raise
    return module
