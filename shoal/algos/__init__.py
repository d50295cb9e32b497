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
when it is asked for. An import by shoal 0.1's flat paths (``shoal.algos.ppo``) fails
naming the module's path now (`shoal.MOVED`).
"""
