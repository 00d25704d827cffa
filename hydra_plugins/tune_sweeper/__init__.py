"""Hydra sweeper that tunes a preset with Optuna (ask-and-tell), one trial = one run per tuning task x seed."""
