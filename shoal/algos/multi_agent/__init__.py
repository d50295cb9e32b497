"""Learners for teams of agents: PPO over policy maps and self-play (`multi_policy`: MAPPO,
IPPO), MADDPG and its Ray-distributed form, QMIX/VDN/IQL value decomposition, and CTEDD.
They collect through `shoal.collect.multi_agent` and keep an agent axis in their batches."""
