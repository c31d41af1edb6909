"""The compiled trainer reproduces the lesson's recorded run, agrees with the seed-style loop,
keeps the reference fixed, and never recompiles when beta, epsilon or the learning rate move."""
import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rlhf_lab import lesson, sweep, trainer
from rlhf_lab.ppo import optimal_logp, regularised_objective

# The recorded reference execution of the lesson (JAX 0.9.2, CPU): literal numbers from the lesson.
RECORDED_INITIAL_REWARD = 0.28191882371902466
RECORDED_FINAL_REWARD = 1.9185447692871094
RECORDED_FINAL_KL = 0.7824773192405701
RECORDED_OBJECTIVE = (0.28191882371902466, 1.7620493173599243, 1.7987911701202393)  # reference/trained/optimum
LESSON_REWARDS = [1.9811294, 0.327278, -2.3084073]
LESSON_INIT_LOGITS = (0.2, 0.0, -0.2)

# A small shape used only by the compilation tests of this module (keeps them fast).
SMALL = dict(iterations=6, batch_size=24, epochs=2)
# One grid shape ([3] betas x [2] epsilons) for every sweep test, so it compiles once.
GRID_BETAS, GRID_EPSILONS = [0.05, 0.2, 1.0], [0.1, 0.3]


@pytest.fixture(scope="module")
def lesson_config():
    config = trainer.PPOConfig()
    # the defaults are the lesson's configuration
    assert (config.seed, config.iterations, config.batch_size, config.epochs) == (11, 40, 128, 3)
    assert (config.learning_rate, config.beta, config.epsilon) == (0.15, 0.2, 0.2)
    assert config.init_logits == LESSON_INIT_LOGITS
    return config


@pytest.fixture(scope="module")
def lesson_run(lesson_config):
    ref_before = np.asarray(jax.nn.log_softmax(jnp.asarray(LESSON_INIT_LOGITS, jnp.float32))).copy()
    result, summary = lesson.run_lesson(lesson_config)
    return result, summary, ref_before


def test_lesson_rewards(lesson_run):
    np.testing.assert_allclose(np.asarray(trainer.lesson_rewards()), LESSON_REWARDS, atol=1e-6)


def test_recorded_reward_and_kl_within_1e5(lesson_run):
    result, summary, _ = lesson_run
    assert abs(float(result.initial_reward) - RECORDED_INITIAL_REWARD) <= 1e-5
    assert abs(float(result.reward[-1]) - RECORDED_FINAL_REWARD) <= 1e-5
    assert abs(float(result.kl[-1]) - RECORDED_FINAL_KL) <= 1e-5
    assert abs(summary["final_reward"] - RECORDED_FINAL_REWARD) <= 1e-5
    assert abs(summary["final_kl"] - RECORDED_FINAL_KL) <= 1e-5


def test_recorded_regularised_objective_within_1e5(lesson_run):
    result, summary, _ = lesson_run
    got = (summary["objective_reference"], summary["objective_trained"], summary["objective_optimum"])
    np.testing.assert_allclose(got, RECORDED_OBJECTIVE, rtol=0, atol=1e-5)
    assert got[2] >= got[1] >= got[0]  # the optimum bounds the trained policy, which beats the reference


def test_reference_is_unchanged_after_training(lesson_run, lesson_config):
    result, _, ref_before = lesson_run
    np.testing.assert_array_equal(np.asarray(result.ref_logp), ref_before)
    assert lesson_config.init_logits == LESSON_INIT_LOGITS
    # KL is measured against that fixed reference: recompute the final KL from the final probabilities
    p = np.asarray(result.probs[-1], np.float64)
    kl = float(np.sum(p * (np.log(p) - ref_before)))
    assert kl == pytest.approx(RECORDED_FINAL_KL, abs=1e-5)


def test_series_are_exact_expectations(lesson_run):
    result, _, _ = lesson_run
    r = np.asarray(LESSON_REWARDS)
    probs = np.asarray(result.probs, np.float64)
    assert result.reward.shape == (40,) and result.kl.shape == (40,) and probs.shape == (40, 3)
    np.testing.assert_allclose(probs.sum(axis=1), 1.0, atol=1e-6)
    np.testing.assert_allclose(np.asarray(result.reward), probs @ r, atol=1e-5)
    assert np.all(np.asarray(result.kl) >= 0)
    assert np.all((np.asarray(result.clip_frac) >= 0) & (np.asarray(result.clip_frac) <= 1))
    assert result.reward[-1] > result.initial_reward and result.kl[-1] > 0  # the lesson's own asserts


def test_last_batch_keeps_behaviour_log_probs_frozen(lesson_run):
    result, _, _ = lesson_run
    actions = np.asarray(result.last_actions)
    assert actions.shape == (128,)
    # behaviour policy of the last batch = policy after rollout 39 (recorded in probs[-2])
    behaviour_logp = np.log(np.asarray(result.probs[-2], np.float64))
    np.testing.assert_allclose(np.asarray(result.last_old_logp), behaviour_logp[actions], atol=1e-5)
    # exact-baseline advantages w.r.t. that behaviour policy
    r = np.asarray(LESSON_REWARDS)
    expected_adv = r[actions] - np.exp(behaviour_logp) @ r
    np.testing.assert_allclose(np.asarray(result.last_advantages), expected_adv, atol=1e-5)
    # ratios after the inner steps are measured against the frozen snapshot, so they moved off 1
    final_logp = np.log(np.asarray(result.probs[-1], np.float64))
    np.testing.assert_allclose(np.asarray(result.last_ratio), np.exp(final_logp[actions] - behaviour_logp[actions]), rtol=1e-4)
    assert np.max(np.abs(np.asarray(result.last_ratio) - 1.0)) > 1e-4


def test_seed_style_loop_and_compiled_trainer_agree(lesson_run, lesson_config):
    result, _, _ = lesson_run
    slow = lesson.seed_style_train(lesson_config)
    assert len(slow["reward"]) == 40
    np.testing.assert_allclose(slow["reward"], np.asarray(result.reward), rtol=0, atol=1e-5)
    np.testing.assert_allclose(slow["kl"], np.asarray(result.kl), rtol=0, atol=1e-5)
    np.testing.assert_allclose(np.asarray(slow["final_logits"]), np.asarray(result.final_logits), atol=1e-5)
    assert abs(slow["reward"][-1] - RECORDED_FINAL_REWARD) <= 1e-5
    assert abs(slow["kl"][-1] - RECORDED_FINAL_KL) <= 1e-5


# ---------------------------------------------------------------------------------------------
# Compilation counting


class CompileCounter:
    """Counts XLA backend compilations through jax.monitoring (independent of TRACE_COUNTS)."""

    def __init__(self):
        self.count = 0

    def __call__(self, event, duration, **kwargs):
        if event == "/jax/core/compile/backend_compile_duration":
            self.count += 1

    def __enter__(self):
        jax.monitoring.register_event_duration_secs_listener(self)
        return self

    def __exit__(self, *exc):
        jax.monitoring.unregister_event_duration_listener(self)


def _cache_size(fn):
    return fn._cache_size() if hasattr(fn, "_cache_size") else None


def test_moving_beta_epsilon_lr_triggers_no_new_compilation():
    base = trainer.PPOConfig(**SMALL, beta=0.2, epsilon=0.2, learning_rate=0.15)
    fn = trainer.make_train(*base.shape)
    first = trainer.train(base)  # warm-up: compiles this shape once (if not already)
    traces = trainer.TRACE_COUNTS["train"]
    cache = _cache_size(fn)
    finals = {tuple(np.asarray(first.reward).tolist())}
    with CompileCounter() as compiles:
        for beta, eps, lr in [(0.05, 0.2, 0.15), (1.5, 0.2, 0.15), (0.2, 0.05, 0.15), (0.2, 0.02, 0.15),
                              (0.2, 0.2, 0.01), (0.7, 0.3, 0.4), (3, 0.9, 1)]:
            res = trainer.train(dataclasses.replace(base, beta=beta, epsilon=eps, learning_rate=lr))
            finals.add(tuple(np.asarray(res.reward).tolist()))
    assert trainer.TRACE_COUNTS["train"] == traces, "changing beta/epsilon/lr re-traced the trainer"
    assert compiles.count == 0, f"{compiles.count} XLA compilations while only beta/epsilon/lr changed"
    if cache is not None:
        assert _cache_size(fn) == cache == 1
    assert len(finals) == 8  # the hyperparameters really reached the computation


def test_a_new_shape_compiles_once_and_is_then_cached():
    config = trainer.PPOConfig(iterations=5, batch_size=9, epochs=1)  # a shape no other test uses
    before = trainer.TRACE_COUNTS["train"]
    with CompileCounter() as compiles:
        trainer.train(config)
    assert trainer.TRACE_COUNTS["train"] == before + 1
    assert compiles.count >= 1
    fn = trainer.make_train(*config.shape)
    assert trainer.make_train(5, 9, 1) is fn  # one cached program per shape
    with CompileCounter() as compiles:
        trainer.train(dataclasses.replace(config, beta=0.9, epsilon=0.4, learning_rate=0.3, seed=5))
    assert trainer.TRACE_COUNTS["train"] == before + 1
    assert compiles.count == 0
    if _cache_size(fn) is not None:
        assert _cache_size(fn) == 1


def test_sweep_grid_does_not_recompile_for_new_values():
    config = trainer.PPOConfig(**SMALL)
    sweep.sweep_grid(config, GRID_BETAS, GRID_EPSILONS)
    traces = trainer.TRACE_COUNTS["sweep"]
    with CompileCounter() as compiles:
        sweep.sweep_grid(config, [0.3, 2.0, 0.01], [0.05, 0.9])
    assert trainer.TRACE_COUNTS["sweep"] == traces
    assert compiles.count == 0


# ---------------------------------------------------------------------------------------------
# Sweeps equal single runs


def test_sweep_grid_entries_equal_single_runs():
    config = trainer.PPOConfig(**SMALL, seed=3)
    betas, epsilons = GRID_BETAS, GRID_EPSILONS
    grid = sweep.sweep_grid(config, betas, epsilons)
    assert grid.final_reward.shape == (3, 2)
    rewards = trainer.lesson_rewards()
    for i, b in enumerate(betas):
        for j, e in enumerate(epsilons):
            single = trainer.train(dataclasses.replace(config, beta=b, epsilon=e))
            assert float(grid.final_reward[i, j]) == pytest.approx(float(single.reward[-1]), abs=1e-5)
            assert float(grid.final_kl[i, j]) == pytest.approx(float(single.kl[-1]), abs=1e-5)
            assert float(grid.clip_frac[i, j]) == pytest.approx(float(single.clip_frac[-1]), abs=1e-6)
            final_logp = jax.nn.log_softmax(single.final_logits)
            obj = float(regularised_objective(final_logp, rewards, single.ref_logp, b))
            assert float(grid.objective[i, j]) == pytest.approx(obj, abs=1e-5)
            opt = float(regularised_objective(optimal_logp(single.ref_logp, rewards, b), rewards, single.ref_logp, b))
            assert float(grid.optimum[i, j]) == pytest.approx(opt, abs=1e-5)
            assert float(grid.optimum[i, j]) >= float(grid.objective[i, j]) - 1e-5


def test_sweep_seeds_entries_equal_single_runs():
    config = trainer.PPOConfig(**SMALL)
    seeds = [0, 11, 12345]
    runs = sweep.sweep_seeds(config, seeds)
    assert runs.reward.shape == (3, SMALL["iterations"])
    for k, s in enumerate(seeds):
        single = trainer.train(dataclasses.replace(config, seed=s))
        np.testing.assert_allclose(np.asarray(runs.reward[k]), np.asarray(single.reward), atol=1e-5)
        np.testing.assert_allclose(np.asarray(runs.kl[k]), np.asarray(single.kl), atol=1e-5)
        np.testing.assert_array_equal(np.asarray(runs.last_actions[k]), np.asarray(single.last_actions))
    # different seeds draw different batches
    assert not np.array_equal(np.asarray(runs.last_actions[0]), np.asarray(runs.last_actions[1]))


def test_sweep_objective_stays_finite_when_a_probability_underflows():
    # A huge learning rate drives one action's probability to exactly 0.0 in float32; the objective
    # must still be computed from the log-probabilities (no 0 * -inf = NaN).
    config = trainer.PPOConfig(**SMALL, learning_rate=300.0, epsilon=0.9)
    single = trainer.train(dataclasses.replace(config, beta=0.001))
    assert float(np.min(np.asarray(single.probs[-1]))) == 0.0, "precondition: a probability underflowed"
    grid = sweep.sweep_grid(config, [0.001, 0.2, 1.0], [0.9, 0.5])
    assert np.all(np.isfinite(np.asarray(grid.objective))), grid.objective
    rewards = trainer.lesson_rewards()
    final_logp = jax.nn.log_softmax(single.final_logits)
    expected = float(regularised_objective(final_logp, rewards, single.ref_logp, 0.001))
    assert float(grid.objective[0, 0]) == pytest.approx(expected, abs=1e-5)
    assert float(grid.optimum[0, 0]) >= float(grid.objective[0, 0]) - 1e-5
