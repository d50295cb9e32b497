"""Learning from a fixed dataset: behaviour cloning, CQL, IQL and TD3+BC."""
