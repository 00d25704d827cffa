"""Hydra entry point: compose -> validate -> train.

    python run.py algo=outer_ppo env=HalfCheetah seed=1
    python run.py -m algo=ppo,hp3o env=CartPole seed=0,1,2
"""

import logging
import sys
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig

from benchmarks.validate import ConfigError, validate_config

log = logging.getLogger(__name__)


@hydra.main(config_path="conf", config_name="config", version_base="1.3")
def main(cfg: DictConfig) -> float | None:
    try:
        validate_config(cfg)
    except ConfigError as error:
        for line in str(error).splitlines():
            print(f"config error: {line}", file=sys.stderr)
        sys.exit(2)

    from benchmarks.logger import write_json_atomic
    from benchmarks.trainer import train  # heavy imports only after the config is known good

    run_dir = Path(HydraConfig.get().runtime.output_dir)
    log.info("training %s on %s, seed %d, %d env steps -> %s", cfg.algo.name, cfg.env.name, cfg.seed,
             cfg.total_steps, run_dir)
    try:
        summary = train(cfg, run_dir)
    except Exception as error:
        # The failure is recorded in the job's own directory. In a sweep the other
        # jobs go on, and the sweep's end lists every failure and exits non-zero
        # (benchmarks/hydra_callbacks.py); a single run fails here.
        write_json_atomic(run_dir / "summary.json", {"status": "failed", "error": f"{type(error).__name__}: {error}"})
        if HydraConfig.get().mode != RunMode.MULTIRUN:
            raise
        log.exception("job failed: %s", run_dir)
        return None
    log.info("done in %.0f s (%.0f SPS); final eval return %.2f +- %.2f", summary["wall_time_s"], summary["sps"],
             summary["final_eval_return_mean"], summary["final_eval_return_std"])
    return summary["final_eval_return_mean"]


if __name__ == "__main__":
    main()
