"""Where a short run's start-up goes, with the compile cache warm: whole processes of one iteration, and the
compiled programs' first calls split into the backend and the rest.

    python -m benchmarks.speed.startup --env CartPole --repeats 3
    python -m benchmarks.speed.startup --env HalfCheetah --repeats 3 --out results/tables/startup.md

Whole processes, each --repeats times in turn, medians:
- `imports`: a process that imports run.py and the engine it trains with (torch, Hydra, Gymnasium) and exits;
- `eager run`: `python run.py env=<env> total_steps=<one iteration>` with algo.backend=torch, no TensorBoard,
  checkpoint or evaluation but the final one;
- `compiled run`: the same on the default engine;
- `compiled run, ISA probe`: the same after removing the engine's record of inductor's vector-ISA probe
  (algorithms/population.py, probe_vector_isas_once), so that the run probes again, and records again.
Then, in this process, a population of one trained twice: each compiled program's first call in a fresh process
(what every run pays, with the compiler's one-off imports and checks) and in a warm one (what a sweep's next job
in the same worker, or a test, pays), and the part of it inside the backend (inductor, its kernels loaded from
the cache); the rest is dynamo (tracing the Python, building guards) and the call itself.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.arguments import conf_name, number_in
from benchmarks.speed.throughput import benchmark_config, parse_timing_args, print_table, write_timing_table

ROOT = Path(__file__).resolve().parents[2]
IMPORTS = "import run, gymnasium, benchmarks.engine.trainer, benchmarks.engine.batch_trainer"  # run.py's, and main()'s
PROGRAMS = {"act_one_seed": "act (and the bootstrap value)", "one_seed": "update step"}


def process_seconds(command: list[str], environment: dict) -> float:
    started = time.perf_counter()
    result = subprocess.run(command, cwd=ROOT, env=environment, capture_output=True, text=True)
    if result.returncode != 0:  # the run's own last line says why
        raise SystemExit(f"error: {' '.join(command[1:3])}: {(result.stderr.strip().splitlines() or ['no output'])[-1]}")
    return time.perf_counter() - started


def remove_isa_records() -> None:
    from torch._inductor.runtime.cache_dir_utils import cache_dir

    from algorithms.population import ISA_RECORD_PREFIX

    for record in Path(cache_dir()).glob(ISA_RECORD_PREFIX + "*"):
        record.unlink()


def first_calls(env: str, steps: int) -> dict[str, tuple[float, float]]:
    """Train a population of one in this process: each program's (first call, backend part) in seconds."""
    from algorithms import population
    from benchmarks.engine.trainer import train

    timings, original_call, original_backend = {}, population.CompiledOnce.__call__, population.CompiledOnce.inductor

    def backend(program, graph, example_inputs):
        started = time.perf_counter()
        try:
            return original_backend(program, graph, example_inputs)
        finally:
            program.backend_seconds = getattr(program, "backend_seconds", 0.0) + time.perf_counter() - started

    def call(program, *args):
        if program.called:
            return original_call(program, *args)
        started = time.perf_counter()
        result = original_call(program, *args)
        name = getattr(program.fn, "__name__", "program")
        name = PROGRAMS.get(name, name)
        timings.setdefault(name, (time.perf_counter() - started, getattr(program, "backend_seconds", 0.0)))
        return result

    population.CompiledOnce.__call__, population.CompiledOnce.inductor = call, backend
    try:
        with tempfile.TemporaryDirectory() as run_dir:
            train(benchmark_config(env, "ppo", [], steps, "compiled", recipe=False), Path(run_dir))
    finally:
        population.CompiledOnce.__call__, population.CompiledOnce.inductor = original_call, original_backend
    return timings


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog=f"python -m {__spec__.name}", description=__doc__.splitlines()[0])
    parser.add_argument("--env", default="CartPole", type=conf_name("env"))
    parser.add_argument("--repeats", type=number_in(1, integer=True), default=3)
    args, started, load_before = parse_timing_args(parser, argv)
    os.environ["POPULATION_COMPILE"] = "1"  # the compiled engine, whatever the shell asked
    cfg = benchmark_config(args.env, "ppo", [], 1, "compiled", recipe=False)
    steps = cfg.env.num_envs * cfg.env.num_steps  # one iteration
    run = [sys.executable, str(ROOT / "run.py"), f"env={args.env}", f"total_steps={steps}", "eval.at_start=false",
           "eval.episodes=1", "logging.tensorboard=false", "logging.checkpoint=false", "logging.progress_bar=false"]
    environment = dict(os.environ)
    seconds: dict[str, list[float]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        def training(*overrides: str) -> float:
            return process_seconds([*run, *overrides, f"hydra.run.dir={tmp}/{time.time_ns()}"], environment)

        cases = {
            "imports": lambda: process_seconds([sys.executable, "-c", IMPORTS], environment),
            "eager run": lambda: training("algo.backend=torch"),
            "compiled run": training,
            "compiled run, ISA probe": lambda: (remove_isa_records(), training())[1],
        }
        training()  # the cache (and the ISA record) warm
        for _ in range(args.repeats):
            for case, measure in cases.items():
                seconds.setdefault(case, []).append(measure())
    rows = [{"what": case, "seconds": round(statistics.median(values), 2)} for case, values in seconds.items()]
    for process, timings in (("fresh", first_calls(args.env, steps)), ("warm", first_calls(args.env, steps))):
        for name, (first_call, backend) in timings.items():
            rows.append({"what": f"{name}: first call, {process} process", "seconds": round(first_call, 2)})
            rows.append({"what": f"{name}: of it in the backend", "seconds": round(backend, 2)})
    table = print_table(rows, f"{args.env}, one iteration of {steps} env steps, the tuned defaults, medians of "
                              f"{args.repeats} (processes); one run each (first calls)")
    if args.out:
        write_timing_table(args.out, f"Start-up of a run ({args.env})", __spec__.name, argv, started, load_before, None,
                           "Compile cache warm; the rows as benchmarks/speed/startup.py's docstring says: whole "
                           "processes (medians), then each compiled program's first call in a fresh and in a warm "
                           "process (one run each) and the part of it inside inductor's backend (the rest: dynamo "
                           "and the call itself).", table,
                           kernels_of_this_process=False)


if __name__ == "__main__":
    main()
