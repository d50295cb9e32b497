"""The learning algorithms, one file each, grouped by family:

* `shoal.algos.cores`: what the families' learners are built from (the on-policy
  iteration and batches, the act-store-learn replay iteration, the off-policy actor-critic
  core); no algorithm of its own.
* `shoal.algos.value`: value-based learners (tabular TD, DQN and its Rainbow parts, Ape-X).
* `shoal.algos.policy_gradient`: on-policy and near-on-policy actor-critics (REINFORCE,
  A2C, A3C, PPO, APPO, TRPO, IMPALA, DD-PPO).
* `shoal.algos.continuous`: off-policy actor-critics for continuous actions (DDPG, TD3,
  SAC, D4PG).
* `shoal.algos.multi_agent`: learners for teams of agents (policy maps over PPO, MADDPG and
  its distributed form, QMIX/VDN/IQL, CTEDD).

Algorithms never subclass one another; they share the parts in `cores` and below by
composition. Each module declares the names it registers (``SPECS``,
`shoal.algos.spec.AlgorithmSpec`); `shoal.registry` maps names to modules and imports one
when it is asked for.
"""

from __future__ import annotations

import importlib.abc
import sys

MOVED = {
    old: f"{__name__}.{family}.{old}"
    for family, members in {
        "cores": ("on_policy", "off_policy", "actor_critic_replay"),
        "value": ("tabular", "dqn", "apex", "apex_actor"),
        "policy_gradient": ("pg", "a2c", "a3c", "ppo", "appo", "trpo", "impala", "ddppo"),
        "continuous": ("ddpg", "td3", "sac", "d4pg"),
        "multi_agent": ("multi_policy", "maddpg", "distributed_maddpg", "qmix", "ctedd"),
    }.items()
    for old in members
}
"""``shoal.algos.<name>`` of shoal 0.1 -> where the module lives now (named when an old
path is imported)."""


class _MovedModules(importlib.abc.MetaPathFinder):
    """An import of a module by its shoal 0.1 path (``from shoal.algos.ppo import
    PPOConfig``) fails naming where the module lives now (the redirect that imported it was
    removed in the fourth wave)."""

    def find_spec(self, fullname, path=None, target=None):
        prefix, _, name = fullname.rpartition(".")
        if prefix == __name__ and name in MOVED:
            raise ModuleNotFoundError(
                f"{fullname} is now {MOVED[name]} (shoal 0.1's flat paths are gone)",
                name=fullname,
            )
        return None


if not any(isinstance(finder, _MovedModules) for finder in sys.meta_path):
    sys.meta_path.append(_MovedModules())
