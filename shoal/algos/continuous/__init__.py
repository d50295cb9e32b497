"""Off-policy actor-critics for continuous control: DDPG, TD3, SAC (with its discrete-action
variant) and D4PG. Each writes its own ``update`` over the shared core
(`shoal.algos.cores.actor_critic_replay`) and the act-store-learn iteration of
`shoal.algos.cores.off_policy`."""
