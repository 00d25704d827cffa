"""The RLHF-style token tasks (benchmarks/rlhf): tasks, models, the token env, the language-model policy,
the per-token KL penalty, and a run through the shared trainer, killed and resumed."""

from __future__ import annotations

import json
import math
import signal

import numpy as np
import pandas as pd
import pytest
import torch

pytest.importorskip("transformers", reason="the token tasks need the optional extra: pip install -e .[rlhf]")

from algorithms.lm_policy import CausalLMActorCritic  # noqa: E402
from benchmarks.engine.reference_kl import ADAPTIVE_CLIP, EpisodeInfoMeans, ReferenceKLPenalty, whiten_rewards  # noqa: E402
from benchmarks.engine.config import compose_config  # noqa: E402
from benchmarks.engine.trainer import train  # noqa: E402
from benchmarks.engine.validate import ConfigError, validate_config  # noqa: E402
from algorithms.lm_policy import next_token_log_probs  # noqa: E402
from benchmarks.rlhf.env import EOS_ID, TokenVectorEnv  # noqa: E402
from benchmarks.rlhf.models import build_tokenizer, model_dir, resolve_init_from  # noqa: E402
from benchmarks.rlhf.tasks import BOS, EOS, get_task  # noqa: E402
from tests.conftest import QUIET  # noqa: E402
from tests.test_resume import assert_same_metrics, launch, wait_for_rows  # noqa: E402

ARITHMETIC, PRAISE = get_task("arithmetic"), get_task("praise")


# -- tasks -------------------------------------------------------------------------


def test_arithmetic_judge_wants_the_exact_sum_then_eos():
    prompt = [BOS, "7", "+", "5", "="]
    assert ARITHMETIC.judge(prompt, ["1", "2", EOS]) == 1.0
    assert ARITHMETIC.judge(prompt, ["1", "3", EOS]) == 0.0
    assert ARITHMETIC.judge(prompt, ["1", "2"]) == 0.0            # cut off before <eos>
    assert ARITHMETIC.judge(prompt, ["1", "+", EOS]) == 0.0
    assert ARITHMETIC.judge(prompt, [EOS]) == 0.0


def test_arithmetic_reference_corpus_is_right_30_percent_and_one_too_many_40_percent():
    rng = np.random.default_rng(0)
    prompts = [ARITHMETIC.prompt(rng) for _ in range(5000)]
    answers = [int("".join(ARITHMETIC.reference_response(p, rng)[:-1])) - ARITHMETIC.answer(p) for p in prompts]
    assert abs(np.mean(np.equal(answers, 0)) - 0.3) < 0.02
    assert abs(np.mean(np.equal(answers, 1)) - 0.4) < 0.02


def review(*adjectives: str) -> list[str]:
    words = [adjectives[0]]
    for adjective in adjectives[1:]:
        words += ["and", "the", "room", "was", adjective]
    return words + [".", EOS]


def test_praise_judge_is_mean_sentiment_of_a_well_formed_review_and_the_labeller_sums():
    prompt = [BOS, "the", "food", "was"]
    assert PRAISE.judge(prompt, review("good")) == 1.0
    assert PRAISE.judge(prompt, review("good", "rude", "ok")) == 0.0
    assert PRAISE.judge(prompt, review("good", "great")) == 1.0
    assert PRAISE.labeller(prompt, review("good", "great")) == 2.0      # the length bias
    # a fourth clause: the labeller pays for it, the judge calls it ill-formed
    assert PRAISE.labeller(prompt, review("good", "good", "good", "good")) == 4.0
    assert PRAISE.judge(prompt, review("good", "good", "good", "good")) == -1.0
    assert PRAISE.judge(prompt, ["good", "good", ".", EOS]) == -1.0
    assert PRAISE.judge(prompt, ["good", "."]) == -1.0                  # no <eos>


def test_the_longest_well_formed_review_and_one_clause_more_fit_the_response_room():
    assert len(review("good", "good", "good", "good")) == PRAISE.max_new_tokens


def test_tokenizer_is_a_transformers_tokenizer_over_the_task_vocabulary():
    tokenizer = build_tokenizer(ARITHMETIC)
    ids = tokenizer("<bos> 7 + 5 = 1 2 <eos>")["input_ids"]
    assert ids == [ARITHMETIC.vocabulary.index(t) for t in "<bos> 7 + 5 = 1 2 <eos>".split()]
    assert (tokenizer.pad_token_id, tokenizer.bos_token_id, tokenizer.eos_token_id) == (0, 1, EOS_ID)


# -- models and the env ----------------------------------------------------------------


@pytest.fixture(scope="module")
def praise_env():
    env = TokenVectorEnv(num_envs=3, task="praise", reward="model", temperature=0.7)
    env.reset(seed=0)
    return env


def force(env: TokenVectorEnv, words: list[str]):
    """Write the same response in every env; the steps' results."""
    steps = []
    for word in words:
        action = np.full(env.num_envs, PRAISE.vocabulary.index(word))
        steps.append(env.step(action))
    return steps


def test_reward_only_at_the_end_and_the_next_prompt_starts_in_the_same_step(praise_env):
    env = praise_env
    env.reset(seed=1)
    words = review("good", "great")
    steps = force(env, words)
    for _, reward, terminated, _, info in steps[:-1]:
        assert (reward == 0).all() and not terminated.any() and not info["_episode_metrics"].any()
    obs, reward, terminated, truncated, info = steps[-1]
    assert terminated.all() and not truncated.any()
    assert info["_episode_metrics"].all() and (info["episode_metrics"]["judge"] == 1.0).all()
    # the reward model's score of the finished sequence, normalised by the reference's mean and std
    assert info["_final_obs"].all()
    final_obs = info["final_obs"]
    assert [PRAISE.vocabulary[int(i)] for i in final_obs[0, PRAISE.prompt_tokens:len(words) + PRAISE.prompt_tokens]] == words
    build = json.loads((model_dir("praise", "reward_model") / "build.json").read_text())
    ids = torch.as_tensor(final_obs[:1]).long()
    with torch.inference_mode():
        raw = env.reward_model(input_ids=ids, attention_mask=(ids != 0).long()).logits.item()
    assert reward[0] == pytest.approx((raw - build["score_mean"]) / build["score_std"], rel=1e-5)
    # SAME_STEP autoreset: the step that ended the response returned the next prompt, and the next step writes its
    # first token (a reference log-probability, the token in the sequence): no step is a no-op
    assert (env.lengths == PRAISE.prompt_tokens).all() and (obs[:, PRAISE.prompt_tokens:] == 0).all()
    obs, reward, terminated, _, info = env.step(np.full(env.num_envs, PRAISE.vocabulary.index("good")))
    assert (info["ref_log_prob"] < 0).all() and (env.lengths == PRAISE.prompt_tokens + 1).all()
    assert (obs[:, PRAISE.prompt_tokens] == PRAISE.vocabulary.index("good")).all()


def test_next_step_autoreset_of_stored_runs_starts_the_next_prompt_a_step_later_and_ignores_its_action():
    env = TokenVectorEnv(num_envs=2, task="praise", reward="judge", autoreset="next_step")
    env.reset(seed=1)
    final_obs, reward, terminated, _, info = force(env, review("good"))[-1]
    assert terminated.all() and (reward == 1.0).all() and "final_obs" not in info
    assert (final_obs[:, PRAISE.prompt_tokens] == PRAISE.vocabulary.index("good")).all()  # the finished sequence
    obs, reward, terminated, _, info = env.step(np.full(env.num_envs, EOS_ID))
    assert (reward == 0).all() and not terminated.any() and (info["ref_log_prob"] == 0).all()
    assert (env.lengths == PRAISE.prompt_tokens).all() and (obs[:, PRAISE.prompt_tokens:] == 0).all()
    with pytest.raises(ValueError, match="autoreset must be 'same_step' or 'next_step', got 'never'"):
        TokenVectorEnv(num_envs=1, task="praise", autoreset="never")


def test_a_response_cut_off_at_max_length_ends_and_pays_the_missing_eos_penalty():
    env = TokenVectorEnv(num_envs=2, task="arithmetic", reward="judge", missing_eos_penalty=0.5)
    env.reset(seed=0)
    digit = ARITHMETIC.vocabulary.index("1")
    for step in range(ARITHMETIC.max_new_tokens):
        _, reward, terminated, _, _ = env.step(np.full(2, digit))
        assert terminated.all() == (step == ARITHMETIC.max_new_tokens - 1)
    assert (reward == -0.5).all()  # judge 0 (no <eos>), minus the penalty


def test_reference_log_prob_is_of_the_tempered_distribution_and_padding_changes_nothing(praise_env):
    env = praise_env
    env.reset(seed=2)
    context = env.tokens[:, :PRAISE.prompt_tokens].copy()
    action = np.full(env.num_envs, PRAISE.vocabulary.index("good"))
    _, _, _, _, info = env.step(action)
    with torch.inference_mode():  # the context alone, unpadded
        logits = env.reference(input_ids=torch.as_tensor(context)).logits[:, -1]
    expected = tempered_log_probs(logits, 0.7)[:, action[0]].numpy()
    np.testing.assert_allclose(info["ref_log_prob"], expected, rtol=1e-5, atol=1e-6)


def test_the_policy_starts_as_the_reference_with_a_separate_value_model_at_zero(praise_env):
    env = praise_env
    env.reset(seed=3)
    policy = CausalLMActorCritic(len(PRAISE.vocabulary), resolve_init_from("rlhf/praise"), temperature=0.7)
    obs = torch.as_tensor(env.tokens, dtype=torch.float32)
    with torch.inference_mode():
        expected = next_token_log_probs(env.reference, torch.as_tensor(env.tokens), 0.7, torch.as_tensor(env.lengths))
        torch.testing.assert_close(policy.next_token_log_probs(obs), expected)
        assert (policy.value(obs) == 0).all()
    # the value loss moves the value model only
    (policy.value(obs) - 1).pow(2).sum().backward()
    assert all(p.grad is None for p in policy.actor_parameters())
    assert policy.critic.head.bias.grad.abs().sum() > 0


def test_policy_log_probs_and_entropy_are_of_the_tempered_next_token_distribution():
    policy = CausalLMActorCritic(len(ARITHMETIC.vocabulary), resolve_init_from("rlhf/arithmetic"), temperature=2.0)
    tokens = torch.tensor([[1, 10, 13, 5, 14, 0, 0, 0, 0]])  # <bos> 7 + 2 = and padding
    with torch.inference_mode():
        logits = policy.actor(input_ids=tokens[:, :5]).logits[:, -1]
        expected = tempered_log_probs(logits, 2.0)
        actions = torch.tensor([4.0])
        log_prob, entropy = policy.evaluate_actor(tokens.float(), actions)
    torch.testing.assert_close(log_prob, expected[:, 4])
    torch.testing.assert_close(entropy, -(expected.exp() * expected).sum(-1))


def tempered_log_probs(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """log softmax(logits / T) over the tokens that may be generated (all but <pad> and <bos>)."""
    allowed = torch.ones(logits.shape[-1], dtype=torch.bool)
    allowed[[0, 1]] = False
    log_probs = torch.full_like(logits, -math.inf)
    log_probs[:, allowed] = torch.log_softmax(logits[:, allowed] / temperature, dim=-1)
    return log_probs.clamp_min(torch.finfo(logits.dtype).min)


def test_pad_and_bos_are_never_generated_and_their_zero_probability_keeps_entropy_and_gradients_finite():
    policy = CausalLMActorCritic(len(ARITHMETIC.vocabulary), resolve_init_from("rlhf/arithmetic"), temperature=1.0)
    favour_pad_and_bos = torch.zeros(len(ARITHMETIC.vocabulary))
    favour_pad_and_bos[[0, 1]] = 100.0  # the raw model now prefers <pad> and <bos> to everything
    policy.actor.lm_head.register_forward_hook(lambda module, inputs, logits: logits + favour_pad_and_bos)
    tokens = torch.tensor([[1, 10, 13, 5, 14, 0, 0, 0, 0]] * 64).float()
    assert policy.actor(input_ids=tokens[:1, :5].long()).logits[0, -1].argmax() in (0, 1)
    log_probs = policy.next_token_log_probs(tokens)
    assert (log_probs[:, :2].exp() == 0).all()
    torch.testing.assert_close(log_probs.exp().sum(-1), torch.ones(64))
    actions, _, _ = policy.act(tokens)
    assert (actions >= 2).all() and (policy.act_deterministic(tokens) >= 2).all()
    log_prob, entropy = policy.evaluate_actor(tokens, actions.float())
    assert torch.isfinite(entropy).all() and torch.isfinite(log_prob).all()
    (log_prob.mean() + entropy.mean()).backward()
    assert all(torch.isfinite(p.grad).all() for p in policy.actor_parameters() if p.grad is not None)


# -- the KL penalty ------------------------------------------------------------------------------


def kl_config(**extra):
    return {"coef": 0.1, "adaptive": False, "target": 6.0, "horizon": 10000, **extra}


def test_kl_penalty_charges_each_valid_token_and_sums_per_response():
    penalty = ReferenceKLPenalty(kl_config(), num_envs=2)
    valid, ended = np.array([True, True]), np.array([False, True])
    shaped = penalty(np.array([0.0, 1.0]), np.array([-1.0, -2.0]), np.array([-1.5, -1.0]), valid, ended)
    np.testing.assert_allclose(shaped, [0.0 - 0.1 * 0.5, 1.0 - 0.1 * (-1.0)])
    # env 1 ended (KL -1.0); a reset step of env 1 is not charged; env 0 ends with 0.5 + 0.25
    shaped = penalty(np.zeros(2), np.array([-1.0, -9.0]), np.array([-1.25, 0.0]), np.array([True, False]),
                     np.array([True, False]))
    np.testing.assert_allclose(shaped, [-0.1 * 0.25, 0.0])
    stats = penalty.end_rollout()
    assert stats == {"kl_coef": 0.1, "kl_to_reference": pytest.approx((-1.0 + 0.75) / 2)}
    assert penalty.end_rollout()["kl_to_reference"] != penalty.end_rollout()["kl_to_reference"]  # NaN: none ended


@pytest.mark.parametrize("kl, expected_error", [(6.0, 0.0), (6.6, 0.1), (100.0, ADAPTIVE_CLIP), (0.0, -ADAPTIVE_CLIP)])
def test_adaptive_coefficient_follows_the_proportional_controller(kl, expected_error):
    penalty = ReferenceKLPenalty(kl_config(adaptive=True, horizon=100), num_envs=4)
    penalty.finished_kl = [kl] * 4
    assert penalty.end_rollout()["kl_coef"] == 0.1  # the coefficient the rollout was charged with
    assert penalty.coef == pytest.approx(0.1 * (1 + expected_error * 4 / 100))


def test_a_fixed_coefficient_never_moves():
    penalty = ReferenceKLPenalty(kl_config(), num_envs=1)
    penalty.finished_kl = [50.0]
    penalty.end_rollout()
    assert penalty.coef == 0.1


def test_whiten_rewards_is_trls_masked_whiten_without_mean_shift():
    """TRL: whitened = (x - mean) * rsqrt(var + 1e-8) + mean over the mask, var unbiased; here by hand."""
    rewards = torch.tensor([[1.0, 3.0], [5.0, 100.0]])
    valid = torch.tensor([[True, True], [True, False]])
    whiten_rewards(rewards, valid)
    mean = (1.0 + 3.0 + 5.0) / 3  # 3
    variance = ((1 - mean) ** 2 + (3 - mean) ** 2 + (5 - mean) ** 2) / 2  # 4: Bessel's n / (n - 1)
    expected = [[(x - mean) / math.sqrt(variance + 1e-8) + mean for x in row] for row in ([1.0, 3.0], [5.0])]
    torch.testing.assert_close(rewards, torch.tensor([expected[0], [expected[1][0], 100.0]]))  # the reset step kept
    assert rewards[valid].mean().item() == pytest.approx(mean)  # the mean is kept (shift_mean=False), not x / std


def test_episode_metrics_are_averaged_over_the_episodes_that_ended_and_other_infos_ignored():
    means = EpisodeInfoMeans()
    means.add({"episode_metrics": {"judge": np.array([1.0, -1.0])}, "_episode_metrics": np.array([True, False]),
               "ref_log_prob": np.zeros(2)})
    means.add({"x_position": np.ones(2), "_x_position": np.ones(2, bool)})  # a MuJoCo reset info: not a metric
    means.add({"episode_metrics": {"judge": np.array([0.0, 0.5])}, "_episode_metrics": np.array([False, True])})
    assert means.end_rollout() == {"episode_judge": 0.75}
    assert math.isnan(means.end_rollout()["episode_judge"])


# -- configs and runs --------------------------------------------------------------------------


@pytest.mark.parametrize("override, message", [
    ("algo.backend=compiled", "algo.backend must be torch on token tasks"),
    ("env.kwargs.temperature=0.5", "env.kwargs.temperature must equal env.network.temperature"),
    ("env.kl_penalty.coef=-1", "env.kl_penalty.coef must be"),
    ("env.kwargs.reward=gold", "env.kwargs.reward must be one of"),
    ("env.network.init_from=rlhf/poetry", "env.network.init_from must be rlhf/<task>"),
    ("env.network.init_from=/no/such/model", "or an existing model directory, got '/no/such/model'"),
    ("env.normalize_obs=true", "env.normalize_obs must be false on token tasks (env.family=rlhf): the observations "
                               "are token ids"),  # they reached the embedding normalised: IndexError mid-run
    ("env.network.init_from=rlhf/arithmetic", "env.network.init_from=rlhf/arithmetic: its vocabulary has 15 tokens, "
                                              "the praise task's 29 (env=RLHFPraise)"),  # a traceback when built
    ("env.network.init_from=/", "env.network.init_from=/ is not a model directory with a config.json "
                                "giving its vocab_size (FileNotFoundError"),
])
def test_bad_token_task_configs_get_one_line_each(make_config, override, message):
    with pytest.raises(ConfigError) as error:
        validate_config(make_config(["env=RLHFPraise", override]))
    assert message in str(error.value) and len(str(error.value).splitlines()) == 1


def test_the_validator_knows_every_token_task():
    from benchmarks.engine.validate import TOKEN_TASKS
    from benchmarks.rlhf.tasks import TASKS

    assert set(TOKEN_TASKS) == set(TASKS)


def test_token_task_keys_are_refused_on_other_families(make_config):
    with pytest.raises(ConfigError, match="env.kl_penalty.coef is not a key of this config"):
        validate_config(make_config(["env=CartPole", "+env.kl_penalty.coef=0.1"]))


def test_a_token_task_trains_through_the_shared_trainer_and_logs_kl_and_judge(make_config, tmp_path, capsys):
    cfg = make_config(["env=RLHFArithmetic", "algo=outer_ppo", "total_steps=2048", "eval.every_steps=1024", *QUIET])
    summary = train(cfg, tmp_path)
    assert summary["status"] == "complete"
    log = pd.read_csv(tmp_path / "train.csv")
    assert {"kl_to_reference", "kl_coef", "episode_judge"} <= set(log.columns)
    assert log["kl_to_reference"].iloc[0] == pytest.approx(0.0, abs=1e-5)  # the policy starts as the reference
    # the episode return is the score alone (judge reward here), without the KL penalty
    np.testing.assert_allclose(log["episode_return_mean"], log["episode_judge"])
    # `python -m benchmarks.evaluate` rebuilds the language-model policy from the checkpoint
    from benchmarks.evaluate import main as evaluate_main

    # with the run's own evaluation: responses sampled to --episodes prompts from --seed
    from benchmarks.engine.checkpoint import read_checkpoint
    from benchmarks.rlhf.evaluation import SampledEvaluation

    capsys.readouterr()
    evaluate_main([str(tmp_path / "checkpoint.pt"), "--episodes", "64", "--seed", "5"])
    line = capsys.readouterr().out.strip().splitlines()[-1]
    policy = CausalLMActorCritic(len(ARITHMETIC.vocabulary), resolve_init_from("rlhf/arithmetic"))
    policy.load_state_dict(read_checkpoint(tmp_path / "checkpoint.pt")["algorithm"]["policy"])
    scored = SampledEvaluation("arithmetic", 64, seed=5, reward="judge").responses(policy.actor)
    assert line == (f"outer_ppo on benchmarks.rlhf.env:RLHF/Arithmetic-v0: sampled return {scored['reward'].mean():.2f} "
                    f"+- {scored['reward'].std():.2f} over 64 prompts, reward_model {scored['reward_model'].mean():.2f}, "
                    f"judge {scored['judge'].mean():.2f}, kl_to_reference {scored['kl_to_reference'].mean():.2f}, "
                    f"length {scored['length'].mean():.2f}")
    # without --episodes and --seed: the run's own evaluation prompts, so the final checkpoint scores its last row
    evaluate_main([str(tmp_path)])
    final = pd.read_csv(tmp_path / "eval.csv").iloc[-1]
    assert capsys.readouterr().out.strip().splitlines()[-1].startswith(
        f"outer_ppo on benchmarks.rlhf.env:RLHF/Arithmetic-v0: sampled return {final['eval_return_mean']:.2f} +- "
        f"{final['eval_return_std']:.2f} over {cfg.eval.episodes} prompts, ")


# -- the budget counts generated tokens ---------------------------------------------------------


def recording_updates(monkeypatch) -> list:
    """The (obs, valid) of every rollout the trainer hands to algorithm.update, recorded as it trains."""
    import benchmarks.engine.batch_trainer as trainer_module  # the loop builds the algorithm

    seen, build = [], trainer_module.build_algorithm

    def build_recording(*args, **kwargs):
        algorithm = build(*args, **kwargs)
        update = algorithm.update

        def recording_update(rollout, iteration):
            seen.append((rollout.obs.clone(), rollout.valid.clone()))
            return update(rollout, iteration)

        algorithm.update = recording_update
        return algorithm

    monkeypatch.setattr(trainer_module, "build_algorithm", build_recording)
    return seen


def tokens_generated(run_dir) -> tuple[int, int]:
    """(tokens a run generated, responses it finished): the finished responses' lengths (episodes.csv) and the
    tokens of those still being written when it ended (its checkpoint's env state)."""
    from benchmarks.engine.checkpoint import read_checkpoint

    episodes = pd.read_csv(run_dir / "episodes.csv")
    env = read_checkpoint(run_dir / "checkpoint.pt")["envs"]["own"]
    writing = ~env["needs_reset"].numpy()  # next_step: a finished response waits a step, counted in episodes.csv
    in_flight = int((env["lengths"].numpy() - ARITHMETIC.prompt_tokens)[writing].sum())
    return int(episodes["episode_length"].sum()) + in_flight, len(episodes)


@pytest.mark.slow
def test_a_token_tasks_seeds_train_as_one_eager_population_each_logging_what_it_logs_alone(tmp_path):
    """seeds=[...] on a token task: the one loop runs each seed's language-model policy, KL penalty and sampled
    evaluation inside the seed's own streams; every number equals the seed's single run's."""
    from benchmarks.engine.batch_trainer import train_batch
    from benchmarks.engine.config import compose_config
    from tests.conftest import assert_identical_logs

    overrides = ["env=RLHFArithmetic", "algo=ppo_kl", "total_steps=2048", "eval.every_steps=1024",
                 "env.kl_penalty.adaptive=true", "logging.progress_bar=false", "logging.tensorboard=false"]
    train_batch(compose_config([*overrides, "seeds=[0,1]"]), [tmp_path / "population" / f"seed{s}" for s in (0, 1)])
    for seed in (0, 1):
        train(compose_config([*overrides, f"seed={seed}"]), tmp_path / "alone" / f"seed{seed}")
        assert_identical_logs(tmp_path / "alone" / f"seed{seed}", tmp_path / "population" / f"seed{seed}")


def test_a_budget_of_n_steps_generates_n_tokens_and_every_row_of_the_update_is_a_token_written(
        make_config, tmp_path, monkeypatch):
    seen = recording_updates(monkeypatch)
    cfg = make_config(["env=RLHFArithmetic", "total_steps=2048", *QUIET])
    assert cfg.env.kwargs.autoreset == "same_step"
    summary = train(cfg, tmp_path)
    tokens, responses = tokens_generated(tmp_path)
    assert summary["env_steps"] == tokens == 2048 and responses > 500
    assert len(seen) == 2
    for obs, valid in seen:
        assert valid.all()  # no masked row
        # and no row is a finished response's no-op step: every observation is a response still being written
        ids = obs.long()
        assert not (ids == EOS_ID).any() and ((ids != 0).sum(-1) < ARITHMETIC.sequence_length).all()


def test_runs_stored_with_next_step_autoreset_spent_a_step_per_response_on_a_no_op(make_config, tmp_path, monkeypatch):
    seen = recording_updates(monkeypatch)
    train(make_config(["env=RLHFArithmetic", "total_steps=2048", "env.kwargs.autoreset=next_step", *QUIET]), tmp_path)
    tokens, responses = tokens_generated(tmp_path)
    no_ops = sum(int((~valid).sum()) for _, valid in seen)
    assert tokens + no_ops == 2048 and no_ops >= responses - 64  # less those whose no-op step had not come yet
    # the no-op rows are masked: each is a finished response's sequence
    for obs, valid in seen:
        ids = obs.long()[~valid]
        assert ((ids == EOS_ID).any(-1) | ((ids != 0).sum(-1) == ARITHMETIC.sequence_length)).all()


def test_a_stored_token_task_run_composes_with_the_autoreset_and_evaluation_it_ran_with():
    from omegaconf import OmegaConf

    from benchmarks.engine.config import numbers_relevant, with_later_keys
    from tests.conftest import ROOT

    run = ROOT / "results/runs/rlhf_kl/RLHFPraise/ppo/kl_coef=0.0/seed0"  # made before both keys existed
    stored = json.loads((run / "summary.json").read_text())["config"]
    assert "autoreset" not in stored["env"]["kwargs"] and "evaluation" not in stored["env"]
    filled = with_later_keys(stored)
    assert filled["env"]["kwargs"]["autoreset"] == "next_step"
    assert filled["env"]["evaluation"] == {"kind": "greedy", "seed": 0}
    # what `python -m benchmarks.reproduce` retrains: the stored config over today's defaults
    from benchmarks.reproduce import stored_config

    rerun = stored_config(run)
    assert rerun.env.kwargs.autoreset == "next_step" and rerun.env.evaluation.kind == "greedy"
    assert rerun.eval.episodes == rerun.env.eval_episodes == 64
    # today's command differs from it in those keys (and the evaluation's size): a rerun never takes it as its own
    current = numbers_relevant(OmegaConf.to_container(compose_config(["env=RLHFPraise", "algo=ppo"]), resolve=True))
    assert current["env"] != numbers_relevant(stored)["env"]
    # a classic task's stored run gets none of the token tasks' keys
    assert "kwargs" not in with_later_keys({"env": {"name": "CartPole", "family": "classic"}, "algo": {}})["env"]


# -- the sampled evaluation -----------------------------------------------------------------------


@pytest.fixture
def one_thread():
    """torch on one thread, as the trainer runs it (two threads on two busy cores made an evaluation 30x slower)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def test_the_sampled_evaluation_is_the_same_for_a_fixed_seed_and_samples_at_the_training_temperature(one_thread):
    from benchmarks.rlhf.evaluation import SampledEvaluation

    reference = CausalLMActorCritic(len(ARITHMETIC.vocabulary), resolve_init_from("rlhf/arithmetic")).actor.eval()
    evaluation = SampledEvaluation("arithmetic", 256, seed=7, reward="judge")
    first, again = evaluation.responses(reference), evaluation.responses(reference)
    for name in first:
        np.testing.assert_array_equal(first[name], again[name])
    other = SampledEvaluation("arithmetic", 256, seed=8, reward="judge").responses(reference)
    assert not np.array_equal(first["judge"], other["judge"])
    assert 0.2 < first["judge"].mean() < 0.4  # the reference's answers are right about 30% of the time
    assert (first["kl_to_reference"] == 0).all()  # the policy is the reference
    np.testing.assert_array_equal(first["reward"], first["judge"])  # RLHFArithmetic pays the judge
    # sampled: one prompt asked several times gets several answers; greedy decoding gives one
    prompts = [tuple(evaluation.env.prompt(i)) for i in range(256)]
    assert 50 < len(set(prompts)) < 256  # 256 prompts drawn from the seed, of 100 sums

    def answers(greedy: bool, evaluation=evaluation) -> set:
        evaluation.responses(reference, greedy=greedy)
        return {(prompts[i], tuple(evaluation.env.response(i))) for i in range(256)}

    assert len(answers(greedy=False)) > len(answers(greedy=True)) == len(set(prompts))
    # at the run's temperature: near 0 the tempered distribution is the most likely token, and so are the samples
    cold = SampledEvaluation("arithmetic", 256, seed=7, reward="judge", temperature=1e-4)
    assert answers(greedy=False, evaluation=cold) == answers(greedy=True)


def test_the_sampled_evaluation_scores_what_it_says(one_thread):
    from benchmarks.rlhf.evaluation import SampledEvaluation

    torch.manual_seed(0)
    policy = CausalLMActorCritic(len(PRAISE.vocabulary), resolve_init_from("rlhf/praise"), temperature=0.7).actor.eval()
    with torch.no_grad():  # another policy than the reference, so that the KL is not 0
        for parameter in policy.parameters():
            parameter.add_(0.05 * torch.randn_like(parameter))
    evaluation = SampledEvaluation("praise", 32, seed=3, reward="model", temperature=0.7, missing_eos_penalty=2.0)
    scored = evaluation.responses(policy)
    env = evaluation.env
    reward_dir = model_dir("praise", "reward_model")
    build = json.loads((reward_dir / "build.json").read_text())
    for i in range(32):
        prompt, response = env.prompt(i), env.response(i)
        assert scored["length"][i] == len(response) and 1 <= len(response) <= PRAISE.max_new_tokens
        assert scored["judge"][i] == PRAISE.judge(prompt, response)
        ids = torch.as_tensor([PRAISE.vocabulary.index(w) for w in prompt + response])[None]
        with torch.inference_mode():
            raw = env.reward_model(input_ids=ids).logits.item()
            # each response token's log-probability under both models, the context alone, unpadded, at 0.7
            log_ratio = sum(float(tempered_log_probs(policy(input_ids=ids[:, :t]).logits[:, -1], 0.7)[0, ids[0, t]]
                                  - tempered_log_probs(env.reference(input_ids=ids[:, :t]).logits[:, -1], 0.7)[0, ids[0, t]])
                            for t in range(PRAISE.prompt_tokens, ids.shape[1]))
        assert scored["reward_model"][i] == pytest.approx((raw - build["score_mean"]) / build["score_std"], abs=1e-4)
        assert scored["kl_to_reference"][i] == pytest.approx(log_ratio, abs=1e-4)
        cut_off = response[-1] != EOS
        assert scored["reward"][i] == pytest.approx(scored["reward_model"][i] - 2.0 * cut_off)
    assert scored["kl_to_reference"].mean() > 0.01


def test_a_token_tasks_evaluation_curve_and_final_score_are_the_sampled_evaluation(make_config, tmp_path):
    from benchmarks.engine.checkpoint import read_checkpoint
    from benchmarks.rlhf.evaluation import EVAL_COLUMNS, SampledEvaluation

    cfg = make_config(["env=RLHFArithmetic", "total_steps=1024", "logging.tensorboard=false",
                       "logging.progress_bar=false"])
    summary = train(cfg, tmp_path)
    log = pd.read_csv(tmp_path / "eval.csv")
    assert (log["eval_episodes"] == 256).all() and set(EVAL_COLUMNS) <= set(log.columns)
    assert log["eval_kl_to_reference_mean"].iloc[0] == 0.0  # at the start the policy is the reference
    np.testing.assert_array_equal(log["eval_return_mean"], log["eval_judge_mean"])  # RLHFArithmetic pays the judge
    # the final score is the evaluation of the final policy, reproduced from the checkpoint alone
    policy = CausalLMActorCritic(len(ARITHMETIC.vocabulary), resolve_init_from("rlhf/arithmetic"))
    policy.load_state_dict(read_checkpoint(tmp_path / "checkpoint.pt")["algorithm"]["policy"])
    again = SampledEvaluation("arithmetic", 256, seed=cfg.env.evaluation.seed, reward="judge").responses(policy.actor)
    assert summary["final_eval_return_mean"] == log["eval_return_mean"].iloc[-1] == float(again["reward"].mean())
    assert log["eval_kl_to_reference_mean"].iloc[-1] == pytest.approx(float(again["kl_to_reference"].mean()), rel=1e-6)


def test_a_token_task_run_records_its_models_weights_and_reproduce_names_other_ones(make_config, tmp_path, capsys):
    """The same build fingerprint can hold other weights (built on another machine or in another numerics mode):
    a run records the sha256 of the models it read, and a rerun against other weights says so in one line."""
    import hashlib

    from benchmarks.reproduce import main as reproduce_main

    train(make_config(["env=RLHFArithmetic", "total_steps=1024", "eval.episodes=8", *QUIET]), tmp_path)
    summary = json.loads((tmp_path / "summary.json").read_text())
    for what in ("reference", "reward_model"):
        shipped = model_dir("arithmetic", what)
        assert summary["task_models"][what] == {
            "name": shipped.name, "sha256": hashlib.sha256((shipped / "model.safetensors").read_bytes()).hexdigest()}
    summary["task_models"]["reward_model"]["sha256"] = "0" * 64  # as if its reward model had been built elsewhere
    (tmp_path / "summary.json").write_text(json.dumps(summary))
    capsys.readouterr()
    with pytest.raises(SystemExit) as rerun:
        reproduce_main([str(tmp_path)])
    assert rerun.value.code == 0  # the logs agree: the note explains, it does not judge
    name = model_dir("arithmetic", "reward_model").name
    now = hashlib.sha256((model_dir("arithmetic", "reward_model") / "model.safetensors").read_bytes()).hexdigest()
    notes = [line for line in capsys.readouterr().out.splitlines() if "note:" in line]
    assert notes == [f"  note: it read other trained models than its rerun: reward_model {name} (sha256 000000000000) "
                     f"then, {name} (sha256 {now[:12]}) now; a difference below may be these models' doing"]


# 4 iterations of 1024 tokens, a checkpoint after each; killed after the second
RESUME_RUN = ["env=RLHFPraise", "algo=hp3o", "total_steps=4096", "eval.every_steps=2048", "eval.episodes=8",
              "logging.checkpoint_every_steps=1024", "logging.progress_bar=false", "env.kl_penalty.adaptive=true"]


@pytest.mark.slow
def test_a_token_task_killed_mid_run_resumes_to_the_uninterrupted_numbers(tmp_path):
    train(compose_config(RESUME_RUN), tmp_path / "reference")  # in this process: the same numbers
    victim = launch(RESUME_RUN, tmp_path / "killed")
    wait_for_rows(tmp_path / "killed", 2, victim, timeout=300)
    victim.send_signal(signal.SIGKILL)
    victim.wait()
    resumed = launch(RESUME_RUN, tmp_path / "killed")
    _, stderr = resumed.communicate()
    assert resumed.returncode == 0, stderr
    assert "resuming" in stderr
    assert_same_metrics(tmp_path / "reference", tmp_path / "killed")


@pytest.mark.slow
def test_the_report_draws_the_kl_frontier_and_keeps_a_kl_sweep_out_of_the_tables(make_config, tmp_path):
    from benchmarks.report import main as report_main

    suite = tmp_path / "runs" / "kl_sweep"
    for coef in ("0.0", "0.05"):
        cfg = make_config(["env=RLHFPraise", f"env.kl_penalty.coef={coef}", "total_steps=2048", "eval.every_steps=1024",
                           *QUIET])
        train(cfg, suite / "RLHFPraise" / "ppo" / f"kl_coef={coef}" / "seed0")
    report_main([str(suite), "--out", str(tmp_path / "out")])
    assert (tmp_path / "out" / "plots" / "kl_sweep_RLHFPraise_kl_frontier.png").stat().st_size > 0
    assert not (tmp_path / "out" / "tables" / "kl_sweep.csv").exists()  # two settings are not one preset's seeds


# -- TRL side by side (benchmarks/rlhf/trl_reference.py) -----------------------------------------


def test_the_shared_scorer_gives_the_reference_zero_kl_and_its_judged_rewards():
    from benchmarks.engine.config import compose_config
    from benchmarks.rlhf.trl_reference import score_policy

    # the policy's start given as the model directory rlhf/arithmetic resolves to, as docs/rlhf.md allows
    # (the task was read from init_from: "unknown RLHF task '/.../reference-...'")
    cfg = compose_config(["env=RLHFArithmetic", "algo=ppo",
                          f"env.network.init_from={resolve_init_from('rlhf/arithmetic')}"])
    reference = CausalLMActorCritic(len(ARITHMETIC.vocabulary), resolve_init_from("rlhf/arithmetic")).actor.eval()
    scores = score_policy(reference, cfg, samples=128, seed=0)
    assert scores["kl_to_reference"] == pytest.approx(0.0, abs=1e-6)  # the policy is the reference
    assert scores["reward"] == scores["judge"]  # RLHFArithmetic pays the judge's score
    assert 0.15 < scores["judge"] < 0.45  # the reference is right about 30% of the time
    assert 1 <= scores["length"] <= ARITHMETIC.max_new_tokens
    assert score_policy(reference, cfg, samples=128, seed=0) == scores  # seeded


def test_trl_reads_the_reward_model_as_the_env_pays_it():
    pytest.importorskip("trl", reason="the TRL comparison's extra: pip install -e .[trl]")
    from transformers import AutoModelForSequenceClassification
    from trl.experimental.utils import get_reward

    from benchmarks.rlhf.trl_reference import NormalisedScore

    env = TokenVectorEnv(num_envs=2, task="praise", reward="model")
    env.reset(seed=5)
    steps = force(env, review("good", "great"))
    final_obs, reward = steps[-1][4]["final_obs"], steps[-1][1]
    reward_dir = model_dir("praise", "reward_model")
    model = AutoModelForSequenceClassification.from_pretrained(reward_dir).eval()
    build = json.loads((reward_dir / "build.json").read_text())
    model.score = NormalisedScore(model.score, build["score_mean"], build["score_std"])
    with torch.inference_mode():
        _, score, _ = get_reward(model, torch.as_tensor(final_obs).long(), 0, PRAISE.prompt_tokens)
    np.testing.assert_allclose(score.numpy(), reward, rtol=1e-5)


def test_building_a_model_leaves_the_process_torch_stream_as_it_was():
    # A run that builds the reference or reward model on its first start must draw the same numbers as one that
    # finds them cached (a fresh machine's first run and its resume otherwise differ from the first update on).
    from benchmarks.rlhf.models import one_thread_seeded

    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    with one_thread_seeded(0):
        torch.rand(5)
    np.testing.assert_array_equal(torch.rand(3).numpy(), expected.numpy())


@pytest.mark.parametrize("task, accuracy", [("praise", 0.99), ("arithmetic", 0.9)])
def test_the_reward_model_prefers_the_held_out_chosen_response(task, accuracy):
    # Bradley-Terry on the labeller's preferences: on pairs it never trained on (2,000 per task), the chosen response
    # scores above the rejected one at least this often (measured: 1.000 praise, 0.944 arithmetic).
    facts = json.loads((model_dir(task, "reward_model") / "build.json").read_text())
    assert facts["held_out_pairs"] >= 1000
    assert facts["held_out_accuracy"] >= accuracy


def test_every_model_ships_in_the_repository_under_its_current_fingerprint():
    # A fresh clone trains at once on the committed weights; a change to a task or a build names a new model,
    # and this asks for it to be shipped (else every fresh machine builds it and the committed runs' models go stale).
    from benchmarks.rlhf.models import BUILDS, SHIPPED, TASKS, build_name

    for task in TASKS:
        for what in BUILDS:
            name = build_name(task, what)
            assert (SHIPPED / task / name / "build.json").exists(), (
                f"{task} {what}: no shipped build {name}; run python -m benchmarks.rlhf.models --ship and commit it")
            assert model_dir(task, what) == SHIPPED / task / name
            assert [path.name for path in (SHIPPED / task).glob(f"{what}-*")] == [name], "stale shipped builds"


def test_a_change_to_a_word_list_a_task_reads_names_a_new_model(monkeypatch):
    """'fresh' moved from Praise's positive words to its negative ones: the same vocabulary, another judge and
    labeller, so other models. (The fingerprint hashed the task's class alone and named the stale models.)"""
    from benchmarks.rlhf import models, tasks

    before = {what: models.build_name("praise", what) for what in models.BUILDS}
    monkeypatch.setattr(tasks, "POSITIVE", ("good", "great", "nice", "clean"))
    monkeypatch.setattr(tasks, "NEGATIVE", ("fresh", "bad", "rude", "dirty", "cold", "poor"))
    assert tasks.get_task("praise").judge([], ["fresh", ".", "<eos>"]) == -1.0  # its judge reads them
    after = {what: models.build_name("praise", what) for what in models.BUILDS}
    assert all(after[what] != before[what] for what in models.BUILDS)
    # a value whose text could differ between processes is refused, not fingerprinted
    with pytest.raises(TypeError, match="^the task module's LOGGER is not a literal \\(object\\)"):
        models.literal_text("LOGGER", object())
    assert models.literal_text("WORDS", {"b", "a"}) == "['a', 'b']"
    # the base class's labeller and preferences are part of every task's definition
    assert any(part.startswith("@dataclass(frozen=True)\nclass Task:")
               for part in models.task_definition(tasks.get_task("arithmetic")))


@pytest.mark.filterwarnings("ignore:Converting a tensor with requires_grad")
def test_a_build_is_byte_identical_when_repeated(monkeypatch, tmp_path):
    # The build itself, on a tiny recipe (a new fingerprint, so nothing shipped answers): twice, into two caches,
    # the same bytes.
    from benchmarks.rlhf import models

    monkeypatch.setitem(models.REFERENCE_TRAINING, "examples", 64)
    monkeypatch.setitem(models.REFERENCE_TRAINING, "steps", 3)
    monkeypatch.setitem(models.REWARD_TRAINING, "pairs", 64)
    monkeypatch.setitem(models.REWARD_TRAINING, "held_out", 16)
    monkeypatch.setitem(models.REWARD_TRAINING, "steps", 3)
    weights = []
    for cache in ("first", "second"):
        monkeypatch.setenv("RLHF_CACHE", str(tmp_path / cache))
        built = [model_dir("arithmetic", what) for what in models.BUILDS]
        assert all(path.is_relative_to(tmp_path / cache) for path in built)
        weights.append([(path / "model.safetensors").read_bytes() for path in built])
    assert weights[0] == weights[1]


def test_random_scores_steps_a_token_task_and_a_gymnasium_task_and_refuses_an_unknown_name(capsys):
    """`python -m benchmarks.random_scores --tasks ...` (how a task just added gets its random_score): a token task
    is registered only as a vector env, with its family's arguments (env.kwargs); a Gymnasium task gives the number
    its conf/env file states (50 episodes of seed 0)."""
    from benchmarks.random_scores import main as random_scores

    random_scores(["--tasks", "RLHFArithmetic", "CartPole", "--episodes", "2"])
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split()[:4] == ["RLHFArithmetic", "benchmarks.rlhf.env:RLHF/Arithmetic-v0", "random_score", "0.00"]
    assert lines[1].split()[:3] == ["CartPole", "CartPole-v1", "random_score"] and len(lines) == 2
    random_scores(["--tasks", "CartPole"])
    assert float(capsys.readouterr().out.split()[3]) == compose_config(["env=CartPole"]).env.random_score
    with pytest.raises(SystemExit):
        random_scores(["--tasks", "Cartpole"])
    assert "error: argument --tasks: no conf/env/Cartpole.yaml; the tasks: Acrobot, Ant, CartPole," in capsys.readouterr().err
