"""Policy-gradient actor-critics that learn from the rollouts their own (or a slightly older)
policy sampled: REINFORCE (`pg`), A2C and A3C, PPO and APPO, TRPO, IMPALA (V-trace) and
DD-PPO. They share `shoal.algos.cores.on_policy`'s batches and plumbing and the objectives of
`shoal.losses.objectives`."""
