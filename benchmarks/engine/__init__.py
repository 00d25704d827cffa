"""The training engine: the loop every algorithm shares, its environments, logs, checkpoints and config checks."""
