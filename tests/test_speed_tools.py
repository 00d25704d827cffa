"""The speed tools (benchmarks/speed/): what they measure is fixed, and their tables say how they were made."""

import pytest
import torch

from benchmarks import numerics
from benchmarks.speed.seed_throughput import main as seed_throughput_main
from benchmarks.speed.throughput import benchmark_config


def test_speed_tools_measure_cleanrls_recipe_whatever_the_tuned_defaults():
    # the family defaults are the tuning's values (CartPole: 14 epochs x 32 minibatches); the tables are not
    for env, (epochs, minibatches, lr) in {"HalfCheetah": (10, 32, 3e-4), "CartPole": (4, 4, 2.5e-4),
                                           "Pendulum": (10, 32, 1e-3)}.items():
        config = benchmark_config(env, "ppo", [], 4096, "compiled")
        assert (config.algo.update_epochs, config.algo.num_minibatches, config.algo.lr) == (epochs, minibatches, lr)
    assert benchmark_config("HalfCheetah", "ppo", ["algo.update_epochs=3"], 4096).algo.update_epochs == 3


def test_seed_throughput_writes_its_table_with_command_and_kernels(tmp_path, capsys):
    out = tmp_path / "table.md"
    seed_throughput_main(["--envs", "CartPole", "--sizes", "2", "--steps", "1024", "--repeats",
                          "1", "--out", str(out)])
    text = out.read_text()
    assert "python -m benchmarks.speed.seed_throughput --envs CartPole --sizes 2" in text
    kernels = numerics.kernel_record()
    assert f"{numerics.MODE} numerics: torch {kernels['torch_cpu_capability']}, OpenBLAS {kernels['openblas_core']}" in text
    rows = [line for line in text.splitlines() if line.startswith("| CartPole")]
    assert [row.split("|")[2].strip() for row in rows] == ["raw env (random actions)", "one seed alone",
                                                                "population of 2"]
    update_share = float(rows[2].split("|")[-2])
    assert 0 < update_share < 1


def test_variant_cost_names_how_each_preset_updates(tmp_path, monkeypatch, capsys):
    from benchmarks.speed import variant_cost

    # outer_ppo: its full-batch inner loop and critic fit, two phases of one program each
    assert [variant_cost.update_kind("CartPole", algo) for algo in ("ppo", "outer_ppo_lr", "hp3o", "outer_ppo")] == [
        "vectorized", "vectorized", "vectorized", "vectorized"]


def test_variant_cost_takes_medians_of_rounds_each_in_another_order(tmp_path, monkeypatch):
    from benchmarks.speed import variant_cost

    sps = {"ppo": [100, 90, 120], "outer_ppo": [50, 90, 60], "hp3o": [100, 100, 100]}  # by round
    calls = []

    def measured(env, algo, steps, size, recipe=True):
        calls.append(algo)
        return sps[algo][calls.count(algo) - 1], 0.0

    monkeypatch.setattr(variant_cost, "batch_sps", measured)
    monkeypatch.setattr(variant_cost, "update_kind", lambda env, algo: "vectorized")
    variant_cost.main(["--envs", "CartPole", "--algos", "outer_ppo", "hp3o", "--sizes", "1", "--repeats", "3",
                       "--out", str(tmp_path / "t.md")])
    assert calls == ["ppo", "outer_ppo", "hp3o", "outer_ppo", "hp3o", "ppo", "hp3o", "ppo", "outer_ppo"]
    rows = [[cell.strip() for cell in line.split("|")[1:-1]] for line in (tmp_path / "t.md").read_text().splitlines()
            if line.startswith("| CartPole")]
    # outer_ppo's rounds cost 2, 1 and 2 PPO's; hp3o's 1, 0.9 and 1.2
    assert [row[2:] for row in rows] == [["ppo", "vectorized", "100", "1", "1.00-1.00"],
                                         ["outer_ppo", "vectorized", "60", "2", "1.00-2.00"],
                                         ["hp3o", "vectorized", "100", "1", "0.90-1.20"]]


@pytest.mark.parametrize("tool, arguments", [
    ("variant_cost", ["--algos", "nosuch"]), ("engine_targets", ["--algos", "nosuch"]),
    ("throughput", ["--algos", "nosuch"]), ("seed_throughput", ["--algo", "nosuch"]), ("profile", ["--algo", "nosuch"]),
    ("variant_cost", ["--envs", "Nope"]), ("engine_targets", ["--envs", "Nope"]), ("seed_throughput", ["--envs", "Nope"]),
    ("profile", ["--env", "Nope"]), ("sb3_reference", ["--env", "Nope"]), ("batched_physics", ["--env", "Nope"]),
    ("interleave", ["--env", "Nope"]),
])
def test_a_speed_tool_refuses_an_unknown_preset_or_task_in_one_line_before_measuring(tool, arguments, capsys):
    import importlib

    with pytest.raises(SystemExit) as stop:
        importlib.import_module(f"benchmarks.speed.{tool}").main(arguments)
    assert stop.value.code == 2
    kind = "algo" if arguments[0].startswith("--algo") else "env"
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert last.startswith(f"python -m benchmarks.speed.{tool}: error: argument {arguments[0]}: no "
                           f"conf/{kind}/{arguments[1]}.yaml (have: "), last


def test_engine_targets_says_met_by_the_targets_sense():
    from benchmarks.speed.engine_targets import row

    assert row("8 seeds", "CartPole", "recipe", "x", 4.0)["met"] == "yes"
    assert row("8 seeds", "CartPole", "recipe", "x", 3.99)["met"] == "no"
    assert row("variant cost", "CartPole", "recipe", "x", 1.21)["met"] == "no"
    assert row("update/seed", "CartPole", "recipe", "x", 0.3)["met"] == "yes"


def test_gemm_routes_writes_every_route_for_one_seed_and_eight(tmp_path):
    from benchmarks.speed.gemm_routes import main

    main(["--calls", "3", "--repeats", "1", "--out", str(tmp_path / "gemm.md")])
    text = (tmp_path / "gemm.md").read_text()
    assert "python -m benchmarks.speed.gemm_routes --calls 3 --repeats 1 --out" in text
    rows = [line for line in text.splitlines() if line.startswith("|")]
    assert rows[0].replace(" ", "") == "|seeds|torchbmm(us)|compiledloops(us)|numpyOpenBLAS(us)|"
    assert [row.split("|")[1].strip() for row in rows[2:]] == ["1", "8"]


def test_interleave_times_each_call_alone_and_between_the_other_per_seed(tmp_path):
    from benchmarks.speed.interleave import main

    main(["--env", "CartPole", "--seeds", "1", "2", "--steps", "20", "--repeats", "1", "--out", str(tmp_path / "t.md")])
    text = (tmp_path / "t.md").read_text()
    assert "python -m benchmarks.speed.interleave --env CartPole --seeds 1 2 --steps 20" in text
    assert "CartPole, 4 env(s) per seed" in text and "act program eager" in text  # the tests' engine mode, as it ran
    rows = [[cell.strip() for cell in line.split("|")[1:-1]] for line in text.splitlines() if line.startswith("|")][2:]
    # 4 and 8 sub-envs: under CartPole's batch threshold (8 sub-envs) and at it, as a run builds the layer
    assert [row[:2] for row in rows] == [["1", "Gymnasium's step"]] * 7 + [["2", "batched physics"]] * 7
    assert [row[2] for row in rows[:7]] == ["act alone", "env step alone", "act interleaved", "env step interleaved",
                                            "act + env step alone", "act + env step interleaved",
                                            "switching cost (interleaved - alone)"]
    for first in (0, 7):
        per_call = {row[2]: float(row[3]) for row in rows[first:first + 7]}
        assert per_call["act + env step alone"] == pytest.approx(
            per_call["act alone"] + per_call["env step alone"], abs=0.11)
        assert per_call["switching cost (interleaved - alone)"] == pytest.approx(
            per_call["act + env step interleaved"] - per_call["act + env step alone"], abs=0.21)
    assert all(float(row[4]) == pytest.approx(float(row[3]) / 2, abs=0.06) for row in rows[7:])


def test_interleave_keeps_the_run_with_the_lowest_total_and_each_calls_own_time_in_it(monkeypatch):
    from types import SimpleNamespace

    from benchmarks.speed import interleave

    clock, runs = [0.0], []
    monkeypatch.setattr(interleave, "time", SimpleNamespace(perf_counter=lambda: clock[0]))

    def costing(seconds_by_run):
        def call(step):
            if step == 0 and call is first:
                runs.append(None)
            clock[0] += seconds_by_run[len(runs) - 1]
        return call

    # run 1: 1 s + 5 s per round (total 6), run 2: 3 s + 2 s (total 5, the lowest), run 3: 0.5 s + 6 s (6.5)
    first, second = costing([1.0, 3.0, 0.5]), costing([5.0, 2.0, 6.0])
    assert interleave.best_us([first, second], steps=4, repeats=3) == [3e6, 2e6]


def test_profile_of_a_population_divides_each_phase_by_every_seeds_steps(capsys):
    from benchmarks.speed import profile

    profile.main(["--env", "CartPole", "--seeds", "2", "--steps", "1024", "--backend", "torch"])
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("ppo (torch backend) on CartPole, 2 seed(s) x 1024 env steps: ")
    rows = [line.strip("|").split("|") for line in lines[3:]]
    assert {row[0].strip() for row in rows} >= {"update", "act", "env step", "rest of the loop"}
    for phase, seconds, _share, per_seed_step in rows:
        assert float(per_seed_step) == pytest.approx(1e6 * float(seconds) / (2 * 1024), abs=0.06 + 1e6 * 0.005 / 2048)


def test_update_split_parts_add_up_to_the_update_and_leave_the_functions_as_they_were(capsys):
    from algorithms import population
    from benchmarks.speed.update_split import main as update_split_main, split

    before = (population.PopulationStep.__call__, population.gather_minibatches)
    totals = split("CartPole", 2, 1024)
    assert (population.PopulationStep.__call__, population.gather_minibatches) == before
    assert 0 < totals["minibatch step"] + totals["minibatch gathers"] <= totals["epochs"] <= totals["update"]
    assert totals["update"] < totals["training"]
    update_split_main(["--env", "CartPole", "--seeds", "2", "--steps", "1024"])
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| ") and "%" in line]
    assert len(rows) == 4 and abs(sum(float(row.split("|")[3].strip(" %")) for row in rows) - 100) < 0.5


def test_startup_splits_each_programs_first_call_and_leaves_the_engine_as_it_was(compiled, monkeypatch):
    from algorithms import population
    from benchmarks.engine import trainer
    from benchmarks.speed.startup import first_calls

    before = (population.CompiledOnce.__call__, population.CompiledOnce.inductor)
    timings = first_calls("CartPole", 512)
    assert (population.CompiledOnce.__call__, population.CompiledOnce.inductor) == before
    assert timings.keys() == {"act (and the bootstrap value)", "update step"}
    assert all(0 < backend < first_call for first_call, backend in timings.values())

    def failing_run(*args):
        raise RuntimeError("the run failed")

    monkeypatch.setattr(trainer, "train", failing_run)
    with pytest.raises(RuntimeError, match="the run failed"):
        first_calls("CartPole", 512)
    assert (population.CompiledOnce.__call__, population.CompiledOnce.inductor) == before


def test_step_kernels_splits_the_profiled_step_three_ways_and_refuses_a_split_of_nothing():
    from types import SimpleNamespace

    from benchmarks.speed.step_kernels import split

    events = [SimpleNamespace(key="aoti_torch_cpu_bmm_out", self_cpu_time_total=450.0, count=30),
              SimpleNamespace(key="aoti_torch_cpu_mm_out", self_cpu_time_total=150.0, count=9),
              SimpleNamespace(key="graph_0_cpp_fused_add_mul_tanh_1", self_cpu_time_total=300.0, count=3),
              SimpleNamespace(key="graph_0_cpp_fused_cat_view_2", self_cpu_time_total=30.0, count=3),
              SimpleNamespace(key="## Call CompiledFxGraph abc ##", self_cpu_time_total=90.0, count=3),
              SimpleNamespace(key="Torch-Compiled Region: 0/0", self_cpu_time_total=60.0, count=3)]
    assert split(events, 3) == {"products": 200.0, "generated": 110.0, "rest": 50.0, "product_calls": 13,
                                "generated_calls": 2}
    for kept, missing in ((events[2:], "matrix products"), (events[:2] + events[4:], "generated kernels")):
        with pytest.raises(SystemExit) as stop:
            split(kept, 3)
        assert str(stop.value).startswith(f"error: the profiler recorded no {missing} under the names this tool reads")



def test_step_kernels_counts_the_numbers_ppos_forward_passes_through_tanh(monkeypatch):
    from benchmarks.speed.population_step import SHAPES, algorithms_for, minibatch
    from benchmarks.speed.step_kernels import tanh_numbers

    algorithm = algorithms_for("HalfCheetah", "torch", 1)[0]
    rows = SHAPES["HalfCheetah"][4]
    batch = {key: value[0] for key, value in minibatch("HalfCheetah", 1).items()}
    counted, tanh = [], torch.tanh
    monkeypatch.setattr(torch, "tanh", lambda x, *args, **kwargs: counted.append(x.numel()) or tanh(x, *args, **kwargs))
    algorithm.evaluate_minibatch(batch)  # what the step's forward computes: log-prob, entropy, value
    assert tanh_numbers(algorithm, rows) == sum(counted) > 0
