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
composition. `shoal.registry` maps names to them.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys
import warnings

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
"""``shoal.algos.<name>`` of shoal 0.1 -> where the module lives now."""


class _MovedModules(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Imports of a module by its shoal 0.1 path (``from shoal.algos.ppo import PPOConfig``)
    get the module at its new path, with a `DeprecationWarning` naming it."""

    def find_spec(self, fullname, path=None, target=None):
        prefix, _, name = fullname.rpartition(".")
        if prefix != __name__ or name not in MOVED:
            return None
        return importlib.util.spec_from_loader(fullname, self)

    def create_module(self, spec):
        new = MOVED[spec.name.rpartition(".")[2]]
        warnings.warn(
            f"{spec.name} is now {new} (the old path still imports)", DeprecationWarning, 2
        )
        return importlib.import_module(new)

    def exec_module(self, module) -> None:
        """The module was executed under its new name."""


if not any(isinstance(finder, _MovedModules) for finder in sys.meta_path):
    sys.meta_path.append(_MovedModules())
