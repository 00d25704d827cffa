"""Mutation check: small deliberate bugs in the learning code, the statistics and the checkpoints, each caught by a
named test.

    python tests/mutants.py            # every mutant
    python tests/mutants.py M04 S02    # some of them

Each mutant replaces one line (or a few) of the committed code, in a scratch git worktree of HEAD (your own files
are never touched; HEAD's tests are what run, so commit a new test before checking it), and runs only the tests it
names: `caught` when one of them fails, SURVIVED when all pass. The named tests are first run on the unchanged code,
where they must pass. Exit status 1 if any mutant survived; 2 if a mutant no longer applies, a run of its tests
errs (collection or import: no verdict) or the tests fail unchanged. A test that guards a piece of math belongs
here with the bug it guards against: the CI reference (tests/test_regression_check.py) catches any change of a
number it logs, but only in the settings it runs.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import NamedTuple

ROOT = Path(__file__).resolve().parents[1]


class Mutant(NamedTuple):
    name: str
    bug: str
    path: str
    old: str
    new: str
    tests: tuple[str, ...]


CORE, POPULATION, BATCHED = "tests/test_core.py::", "tests/test_population.py::", "tests/test_batched.py::"
CLIPPED_LOSS = CORE + "test_clipped_policy_loss_on_known_inputs"
VALUE_LOSS = CORE + "test_value_loss_clipped_and_unclipped_on_known_inputs"
GAE = CORE + "test_gae_termination_truncation_and_reset_step_by_hand"
GAUSSIAN = CORE + "test_gaussian_log_prob_and_entropy_match_torch_distributions"
TARGET_KL_PER_SEED = POPULATION + ("test_each_seed_of_a_population_ends_its_epochs_at_target_kl_as_it_does_"
                                   "alone[ppo]")
TARGET_KL_PER_SEED_HP3O = TARGET_KL_PER_SEED.replace("[ppo]", "[hp3o]")
ONE_SEED_UPDATE = POPULATION + "test_a_population_of_one_takes_the_eager_torch_update[ppo]"
STATISTICS = BATCHED + ("test_the_compiled_engines_env_layer_and_statistics_step_as_each_seeds_own_wrappers_and_"
                        "normalisers")
REPORT_NUMBERS = ("tests/test_report.py::test_iqm_is_scipys_quarter_trimmed_mean_the_bootstrap_interval_95_percent_"
                  "wide_and_the_area_per_step")
DETECTABLE = "tests/test_claims.py::test_the_detectable_effect_at_a_designs_seeds_and_tasks"
PPO_TERMS = CORE + "test_ppos_loss_is_minus_the_surrogate_plus_the_weighted_value_loss_minus_the_weighted_entropy"

MUTANTS = [
    Mutant("M01", "the surrogate's pessimistic min taken as a max", "algorithms/core.py",
           "torch.min(unclipped, clipped), mask)", "torch.max(unclipped, clipped), mask)", (CLIPPED_LOSS,)),
    Mutant("M02", "the ratio clipped to [1 - c, 1 + 2c]", "algorithms/core.py",
           "torch.clamp(ratio, 1.0 - clip_coef, 1.0 + clip_coef)",
           "torch.clamp(ratio, 1.0 - clip_coef, 1.0 + 2 * clip_coef)", (CLIPPED_LOSS,)),
    Mutant("M03", "the clipped value loss takes the smaller error", "algorithms/core.py",
           "masked_mean(torch.max(unclipped, clipped), mask)", "masked_mean(torch.min(unclipped, clipped), mask)",
           (VALUE_LOSS,)),
    Mutant("M04", "the value clip's lower side at -2c", "algorithms/core.py",
           "torch.clamp(new_values - old_values, -clip_coef, clip_coef)",
           "torch.clamp(new_values - old_values, -2 * clip_coef, clip_coef)", (VALUE_LOSS,)),
    Mutant("M05", "GAE without lambda on steps without episode ends", "algorithms/core.py",
           "last = deltas[t] + gamma * gae_lambda * last", "last = deltas[t] + gamma * last", (GAE,)),
    Mutant("M06", "truncation treated as termination (no bootstrap)", "algorithms/core.py",
           "bootstrap = np.where(terminated, zero, next_values)",
           "bootstrap = np.where(terminated | truncated, zero, next_values)", (GAE,)),
    Mutant("M07", "the masked advantage std without Bessel's correction", "algorithms/core.py",
           "/ (count - 1.0).clamp_min(1.0))", "/ count.clamp_min(1.0))", (ONE_SEED_UPDATE,)),
    Mutant("M08", "approx_kl with its sign flipped", "algorithms/core.py",
           "masked_mean((ratio - 1.0) - log_ratio, mask)", "masked_mean(log_ratio - (ratio - 1.0), mask)",
           (CLIPPED_LOSS,)),
    Mutant("M09", "the Gaussian entropy without its constant", "algorithms/core.py",
           "entropy = (0.5 + LOG_SQRT_2PI + log_std).sum(-1)", "entropy = (0.5 + log_std).sum(-1)", (GAUSSIAN,)),
    Mutant("M10", "the Gaussian log-prob without -log std", "algorithms/core.py",
           "log_prob = (-0.5 * z.pow(2) - log_std - LOG_SQRT_2PI).sum(-1)",
           "log_prob = (-0.5 * z.pow(2) - LOG_SQRT_2PI).sum(-1)", (GAUSSIAN,)),
    Mutant("M11", "the deterministic (evaluation) action at 0.9 x the mean", "algorithms/core.py",
           "return head.argmax(-1) if self.discrete else head", "return head.argmax(-1) if self.discrete else 0.9 * head",
           (CORE + "test_the_deterministic_action_is_the_gaussians_mean_and_the_categoricals_mode",)),
    Mutant("M12", "the running variance merge loses a factor", "algorithms/core.py",
           "delta**2 * count * batch_count / total", "delta**2 * count / total",
           (CORE + "test_running_mean_std_matches_numpy_over_batches",)),
    Mutant("M13", "the lr annealed one iteration early", "algorithms/ppo.py",
           "base_lr * (1.0 - (iteration - 1) / self.num_iterations)", "base_lr * (1.0 - iteration / self.num_iterations)",
           (CORE + "test_the_lr_anneals_linearly_to_zero_over_the_run_and_is_what_adam_steps_with",)),
    Mutant("M14", "the entropy bonus with its sign flipped", "algorithms/ppo.py",
           "return -(self.cfg.ent_coef * entropy_mean)", "return (self.cfg.ent_coef * entropy_mean)",
           (PPO_TERMS,)),
    Mutant("M15", "the population's norm clip with epsilon 1e-3", "algorithms/population.py",
           "max_norm / (norm + 1e-6)", "max_norm / (norm + 1e-3)",
           (POPULATION + "test_the_populations_norm_clip_scales_the_gradient_as_clip_grad_norm_does",)),
    Mutant("M16", "the population's Adam without its second bias correction", "algorithms/population.py",
           "denom = torch.sqrt(v) / torch.sqrt(1 - beta2 ** step) + eps", "denom = torch.sqrt(v) + eps",
           (ONE_SEED_UPDATE,)),
    Mutant("M17", "the discounted return not restarted at an episode's end", "benchmarks/engine/batch_trainer.py",
           "self.discounted_return = np.where(episode_ended, 0.0, self.discounted_return)", "pass", (STATISTICS,)),
    Mutant("M18", "normalised observations clipped at 5, not env.obs_clip", "benchmarks/engine/batch_trainer.py",
           "clip_symmetric(normalized, self.obs_clip)", "clip_symmetric(normalized, 5.0)", (STATISTICS,)),
    Mutant("M19", "reward scaling's epsilon outside the square root", "benchmarks/engine/batch_trainer.py",
           "rewards / np.sqrt(self.return_var[:, None] + self.reward_epsilon)",
           "rewards / (np.sqrt(self.return_var[:, None]) + self.reward_epsilon)", (STATISTICS,)),
    Mutant("M20", "the value clip applied with algo.clip_vloss=false", "algorithms/ppo.py",
           "self.cfg.clip_coef if self.cfg.clip_vloss else None", "self.cfg.clip_coef", (PPO_TERMS,)),
    Mutant("M21", "advantages normalised with algo.norm_adv=false", "algorithms/ppo.py",
           "if self.cfg.norm_adv:", "if True:", (PPO_TERMS,)),
    Mutant("M22", "evaluation updates the observation statistics", "benchmarks/engine/trainer.py",
           "obs_normalizer(raw_obs, update=False)", "obs_normalizer(raw_obs, update=True)",
           ("tests/test_trainer.py::test_checkpoint_alone_reproduces_the_final_evaluation",)),
    Mutant("M23", "the target-KL stop at 10 x algo.target_kl", "algorithms/ppo.py",
           "tracker.last(\"approx_kl\") > self.cfg.target_kl", "tracker.last(\"approx_kl\") > 10 * self.cfg.target_kl",
           (CORE + "test_target_kl_stops_the_epochs_after_the_first_whose_last_minibatch_exceeds_it",)),
    Mutant("M24", "scaled rewards clipped at 5, not env.reward_clip", "benchmarks/engine/batch_trainer.py",
           "clip_symmetric(scaled, self.reward_clip)", "clip_symmetric(scaled, 5.0)", (STATISTICS,)),
    Mutant("M25", "a stopped seed's observation count moves on", "benchmarks/engine/batch_trainer.py",
           "self.obs_count = np.where(active, count[:, 0], self.obs_count)", "self.obs_count = count[:, 0]",
           (STATISTICS,)),
    Mutant("M26", "reset rows counted in the return variance", "benchmarks/engine/batch_trainer.py",
           "batch_var = np.where(valid, (self.discounted_return - batch_mean[:, None]) ** 2, 0.0).sum(axis=1) / safe",
           "batch_var = ((self.discounted_return - batch_mean[:, None]) ** 2).sum(axis=1) / safe", (STATISTICS,)),
    Mutant("M27", "a population's target-KL stop reads each epoch's first minibatch", "algorithms/population.py",
           'float(epoch_steps[split - 1]["approx_kl"][index])', 'float(epoch_steps[0]["approx_kl"][index])',
           (TARGET_KL_PER_SEED,)),
    Mutant("M29", "a population's target-KL stop reads the epoch's last slab, a seed's own last or not",
           "algorithms/population.py", 'float(epoch_steps[split - 1]["approx_kl"][index])',
           'float(epoch_steps[-1]["approx_kl"][index])', (TARGET_KL_PER_SEED_HP3O,)),
    Mutant("M28", "a population's target-KL stop ends every seed's epochs", "algorithms/population.py",
           "epoch_iterators[index] = None  # no further",
           "epoch_iterators[:] = [None] * len(epoch_iterators)  # no further",
           (TARGET_KL_PER_SEED,)),
    Mutant("A01", "PPO-KL's beta adapted the wrong way", "algorithms/ppo_kl.py",
           "        return beta / factor\n    if kl > target * tolerance:\n        return beta * factor",
           "        return beta * factor\n    if kl > target * tolerance:\n        return beta / factor",
           ("tests/test_ppo_kl.py::test_beta_follows_the_papers_rule",)),
    Mutant("A02", "HP3O's best trajectory is the worst", "algorithms/hp3o.py",
           "return max(range(len(returns)), key=returns.__getitem__)",
           "return min(range(len(returns)), key=returns.__getitem__)",
           ("tests/test_hp3o.py::test_draws_are_without_replacement_uniform_and_take_all_when_fewer",)),
    Mutant("A03", "HP3O's hybrid batch with the best trajectory last", "algorithms/hp3o.py",
           "return [best] + [others[p] for p in picks]", "return [others[p] for p in picks] + [best]",
           ("tests/test_hp3o.py::test_draws_are_without_replacement_uniform_and_take_all_when_fewer",)),
    Mutant("A04", "HP3O+ swaps in a lower baseline", "algorithms/hp3o.py",
           "replaced = (candidate > values) & (", "replaced = (candidate < values) & (",
           ("tests/test_hp3o.py::test_best_trajectory_baseline_replaces_only_close_higher_values",)),
    Mutant("A05", "Outer-PPO's biased start steps backwards", "algorithms/outer_ppo.py",
           "param.add_(update, alpha=self.cfg.bias_coef)", "param.add_(update, alpha=-self.cfg.bias_coef)",
           ("tests/test_outer_ppo.py::test_biased_start_matches_hand_computation",)),
    Mutant("A06", "Outer-PPO's sigma_eff step ignores |g|", "algorithms/outer_ppo.py",
           "scale = target * float(grad_vector.norm()) / step_norm", "scale = target / step_norm",
           ("tests/test_outer_ppo.py::test_sigma_eff_rescales_the_adamw_step_to_sigma_times_g",)),
    Mutant("A07", "Outer-PPO's outer SGD without Nesterov", "algorithms/outer_ppo.py",
           "nesterov = opt_cfg.nesterov and opt_cfg.momentum > 0", "nesterov = False",
           ("tests/test_outer_ppo.py::test_nesterov_outer_momentum_matches_hand_computation",)),
    Mutant("A08", "HP3O+'s distance threshold doubled", "algorithms/hp3o.py",
           "(distances <= cfg.baseline_distance_threshold)", "(distances <= 2 * cfg.baseline_distance_threshold)",
           ("tests/test_hp3o.py::test_best_trajectory_baseline_replaces_only_close_higher_values",)),
    Mutant("A09", "HP3O's recomputed advantages from the stored values", "algorithms/hp3o.py",
           "values = list(torch.split(all_values, [len(t) for t in trajectories]))",
           "values = [t.values for t in trajectories]",
           ("tests/test_hp3o.py::test_recomputed_advantages_use_the_current_critic",)),
    Mutant("A10", "Outer-PPO's outer lr never annealed", "algorithms/outer_ppo.py",
           "return self.annealed_lr(iteration, base_lr=outer.lr, anneal=outer.anneal_lr)",
           "return self.annealed_lr(iteration, base_lr=outer.lr, anneal=False)",
           ("tests/test_outer_ppo.py::test_an_annealed_outer_lr_decays_as_ppos_and_a_constant_one_does_not",)),
    Mutant("S01", "P(improvement) counts a tie as a win", "benchmarks/statistics.py",
           "+ 0.5 * (pairs_x == pairs_y).sum(axis=(0, 1))", "+ 1.0 * (pairs_x == pairs_y).sum(axis=(0, 1))",
           ("tests/test_claims.py::test_a_candidate_better_on_every_seed_and_task_has_probability_one",)),
    Mutant("S02", "the IQM trims 20%, not 25%", "benchmarks/statistics.py",
           "low = int(0.25 * count)", "low = int(0.2 * count)", (REPORT_NUMBERS,)),
    Mutant("S03", "the bootstrap interval at 90%, not 95%", "benchmarks/statistics.py",
           "means, [(1 - level) / 2, (1 + level) / 2]", "means, [(1 - level), level]", (REPORT_NUMBERS,)),
    Mutant("S04", "the area under a curve divided by its last step", "benchmarks/statistics.py",
           "np.trapezoid(curve.to_numpy(), steps) / span)", "np.trapezoid(curve.to_numpy(), steps) / steps[-1])",
           (REPORT_NUMBERS,)),
    Mutant("S05", "the detectable improvement with twice the variance", "benchmarks/statistics.py",
           "(2 * seeds + 1) / (12 * seeds**2 * tasks)", "(2 * seeds + 1) / (6 * seeds**2 * tasks)", (DETECTABLE,)),
    Mutant("S06", "the detectable std ratio with n, not n - 1, degrees of freedom", "benchmarks/statistics.py",
           "np.exp(-Z95 / np.sqrt((seeds - 1) * tasks))", "np.exp(-Z95 / np.sqrt(seeds * tasks))", (DETECTABLE,)),
    Mutant("S07", "the regression check's minimum effect ignored", "benchmarks/regression.py",
           "threshold = -min_effect * abs(progress)", "threshold = 0.0",
           ("tests/test_regression_check.py::test_clear_drop_is_a_regression_and_noise_is_not",)),
    Mutant("R01", "a checkpoint read without checking its payload's digest", "benchmarks/engine/checkpoint.py",
           'if hashlib.sha256(stored["payload"]).hexdigest() != stored["sha256"]:',
           'if False and hashlib.sha256(stored["payload"]).hexdigest() != stored["sha256"]:',
           ("tests/test_resume.py::test_a_damaged_newest_checkpoint_is_set_aside_and_the_previous_one_takes_its_place",)),
]


def run_tests(worktree: Path, tests: tuple[str, ...]) -> subprocess.CompletedProcess:
    """The tests run in the worktree (its own code first on the import path); pytest's exit code 0: all passed,
    1: a test failed, anything else: no verdict (a collection or import error, no test found)."""
    environment = {**os.environ, "PYTHONPATH": str(worktree), "MPLBACKEND": "Agg"}
    command = [sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", *tests]
    return subprocess.run(command, cwd=worktree, capture_output=True, text=True, env=environment)


def last_lines(run: subprocess.CompletedProcess, count: int = 15) -> str:
    return "\n".join((run.stdout + run.stderr).strip().splitlines()[-count:])


def main(names: list[str]) -> int:
    unknown = sorted(set(names) - {mutant.name for mutant in MUTANTS})
    if unknown:
        print(f"error: no mutant {', '.join(unknown)} (have: {', '.join(m.name for m in MUTANTS)})", file=sys.stderr)
        return 2
    chosen = [mutant for mutant in MUTANTS if not names or mutant.name in names]
    with tempfile.TemporaryDirectory() as scratch:
        worktree = Path(scratch) / "tree"
        made = subprocess.run(["git", "worktree", "add", "--detach", "-q", str(worktree), "HEAD"], cwd=ROOT,
                              capture_output=True, text=True)
        if made.returncode != 0:
            print(f"error: cannot make a scratch worktree of HEAD: {made.stderr.strip()}", file=sys.stderr)
            return 2
        try:
            tests = tuple(dict.fromkeys(test for mutant in chosen for test in mutant.tests))
            unchanged = run_tests(worktree, tests)
            if unchanged.returncode != 0:
                print(f"error: the named tests do not pass on the unchanged code (HEAD):\n{last_lines(unchanged)}",
                      file=sys.stderr)
                return 2
            survived = []
            for mutant in chosen:
                source = worktree / mutant.path
                text = source.read_text()
                if text.count(mutant.old) != 1:
                    print(f"error: {mutant.name}: {mutant.path} holds {text.count(mutant.old)} copies of the line to "
                          f"change, not one (the code moved on: update the mutant)", file=sys.stderr)
                    return 2
                source.write_text(text.replace(mutant.old, mutant.new))
                start = time.perf_counter()
                run = run_tests(worktree, mutant.tests)
                source.write_text(text)
                if run.returncode not in (0, 1):
                    print(f"error: {mutant.name}: its tests gave no verdict (pytest exit {run.returncode}):\n"
                          f"{last_lines(run)}", file=sys.stderr)
                    return 2
                caught = run.returncode == 1
                print(f"{mutant.name}  {'caught  ' if caught else 'SURVIVED'}  {time.perf_counter() - start:5.1f} s  "
                      f"{mutant.bug}", flush=True)
                if not caught:
                    survived.append(mutant.name)
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", str(worktree)], cwd=ROOT, check=False)
    print(f"{len(chosen) - len(survived)} of {len(chosen)} mutants caught" +
          (f"; survived: {', '.join(survived)}" if survived else ""))
    return 1 if survived else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
