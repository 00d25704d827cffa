"""Speed tools: throughput against Stable-Baselines3, per-phase profiles, env overhead, sweep and many-seed speedups."""
