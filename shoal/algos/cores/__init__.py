"""What the families' learners share, by composition: the on-policy batches, learner
plumbing and iteration (`on_policy`: PPO, A2C, REINFORCE, TRPO, IMPALA), the act-store-learn
replay iteration (`off_policy`: DQN and the actor-critics), and the networks-targets-optimizer
core of the off-policy actor-critics (`actor_critic_replay`: DDPG, TD3, SAC, D4PG, MADDPG)."""
