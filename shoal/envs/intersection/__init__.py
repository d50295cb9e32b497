"""The 4-lane traffic intersection (``shoal/intersection-v0``, ``shoal/smarts-intersection-v0``):
the environment (`env`: observations, rewards, outcomes, metrics) given a simulator that moves
the vehicles (`simulators`: the built-in `kinematic` one, `sumo`, `smarts`), over the fixed
`scenario` (layout and routes of `geometry`, traffic, signals) and the `vehicles` arrays they
share; `dynamics` holds the vehicle models."""

from shoal.envs.intersection.env import IntersectionEnv

__all__ = ["IntersectionEnv"]
