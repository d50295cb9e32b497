"""The 4-lane traffic intersection (`shoal.envs.intersection.env`, ``shoal/intersection-v0``):
its layout (`geometry`), vehicle dynamics (`dynamics`) and the batched simulator."""

from shoal.envs.intersection.env import IntersectionEnv

__all__ = ["IntersectionEnv"]
