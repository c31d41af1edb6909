"""RLOO and the length-biased reward model (a3, notebook 03, sections 7 and 8): library and checks.

* :func:`rlhf_lab.sequences.rloo_advantages` and the length-bias module against values written
  out by hand or computed by brute force in float64 (not by the functions under test).
* The two judged checks fail each classic mistake by name, on every seed, and pass a correct
  answer written differently from the model answer.
"""
from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest

from rlhf_lab import sequences as sq
from rlhf_lab.judging import CHECKS, core
from rlhf_lab.judging.core import GradingError, LocalStudent

REF = core.library_reference()
SEEDS = (0, 1, 2, 3)
lb = sq.length_bias


def _run(name, answers, seed):
    CHECKS[name].run(LocalStudent(answers), np.random.default_rng(seed), REF)


# ------------------------------------------------------------------------------------------------
# library


def test_rloo_advantages_by_hand():
    got = np.asarray(sq.rloo_advantages(jnp.array([[1.0, 2.0, 3.0, 6.0], [4.0, 4.0, 4.0, 4.0]])))
    # baselines of row 0: (2+3+6)/3, (1+3+6)/3, (1+2+6)/3, (1+2+3)/3
    np.testing.assert_allclose(got[0], [1 - 11 / 3, 2 - 10 / 3, 3 - 3.0, 6 - 2.0], rtol=1e-6)
    np.testing.assert_array_equal(got[1], 0.0)
    # both advantage signs, and the K / (K - 1) relation to the centred reward
    assert got[0, 0] < 0 < got[0, 3]
    np.testing.assert_allclose(got[0], 4 / 3 * (np.array([1, 2, 3, 6]) - 3.0), rtol=1e-6)
    with pytest.raises(ValueError, match="at least 2"):
        sq.rloo_advantages(jnp.ones((3, 1)))


def test_rloo_loss_is_the_clipped_surrogate_without_kl():
    logp = jnp.log(jnp.array([[0.5, 0.25], [0.2, 0.1]]))
    old_logp = jnp.log(jnp.array([[0.25, 0.25], [0.4, 0.1]]))
    mask = jnp.array([[1.0, 1.0], [1.0, 0.0]])
    adv = jnp.array([1.0, -2.0])
    # ratios: 2 (clipped to 1.2 for A > 0), 1, 0.5 (clipped to 0.8 for A < 0: min(-1, -1.6) = -1.6)
    want = -(1.2 * 1.0 + 1.0 * 1.0 + 0.8 * -2.0) / 3
    np.testing.assert_allclose(float(sq.rloo_loss(logp, old_logp, adv, mask, 0.2)), want, rtol=1e-6)


def _brute_slope(score, length, ref_logp):
    """The pooled within-prompt slope by explicit loops in float64."""
    num = den = 0.0
    for p in range(score.shape[0]):
        w = [float(np.exp(x)) for x in ref_logp[p]]
        total = sum(w)
        w = [x / total for x in w]
        ms = sum(wi * float(si) for wi, si in zip(w, score[p]))
        ml = sum(wi * float(li) for wi, li in zip(w, length))
        num += sum(wi * (float(si) - ms) * (float(li) - ml) for wi, si, li in zip(w, score[p], length))
        den += sum(wi * (float(li) - ml) ** 2 for wi, li in zip(w, length))
    return num / den


def test_length_slope_and_normalised_score_by_brute_force():
    rng = np.random.default_rng(0)
    score = rng.normal(size=(3, 9))
    length = rng.integers(0, 7, size=9).astype(float)
    logits = rng.normal(size=(3, 9))
    ref_logp = logits - np.log(np.exp(logits).sum(axis=1, keepdims=True))
    c = _brute_slope(score, length, ref_logp)
    assert lb.length_slope(score, length, ref_logp) == pytest.approx(c, rel=1e-10)
    out = lb.length_normalised_score(score, length, ref_logp)
    probs = np.exp(ref_logp)
    lbar = (probs * length).sum(axis=1, keepdims=True)
    np.testing.assert_allclose(out, score - c * (length - lbar), rtol=1e-10)
    # what it promises: each prompt's reference mean kept, no pooled covariance with length left
    np.testing.assert_allclose((probs * out).sum(axis=1), (probs * score).sum(axis=1), rtol=1e-10)
    assert abs(float(np.sum(probs * out * (length - lbar)))) < 1e-10
    # a constant length: slope 0, the score unchanged
    np.testing.assert_array_equal(lb.length_normalised_score(score, np.full(9, 3.0), ref_logp), score)


def test_length_bonus_adds_exactly_bonus_times_length_and_control_removes_any_bonus():
    task = sq.default_task()
    lengths = lb.response_lengths(task)
    assert lengths.min() == 0 and lengths.max() == task.lang.max_len
    biased = lb.with_length_bonus(task, 0.75)
    np.testing.assert_allclose(np.asarray(biased.arrays.score) - np.asarray(task.arrays.score),
                               0.75 * np.broadcast_to(lengths, task.arrays.score.shape), atol=1e-5)
    np.testing.assert_array_equal(np.asarray(biased.arrays.gold), np.asarray(task.arrays.gold))
    # the sampled score (what the trainers compute from the weights) pays the bonus too
    prompts = jnp.arange(8, dtype=jnp.int32) % task.lang.n_prompts
    import jax
    tokens, mask = sq.sample_responses(jax.random.key(0), task.arrays.ref_params, task.lang, prompts)
    base = sq.ppo.response_score(task.arrays, task.lang, prompts, tokens, mask)
    paid = sq.ppo.response_score(biased.arrays, task.lang, prompts, tokens, mask)
    content = np.sum((np.asarray(tokens) < task.lang.n_tokens) * np.asarray(mask), axis=1)
    np.testing.assert_allclose(np.asarray(paid) - np.asarray(base), 0.75 * content, atol=1e-5)
    # length control: the same reward model (up to per-prompt constants) whatever the bonus
    ref = task.arrays.ref_resp_logp
    controlled = [np.asarray(lb.with_length_control(lb.with_length_bonus(task, b)).arrays.score, np.float64)
                  for b in (0.0, 0.25, 1.0)]
    for other in controlled[1:]:
        diff = other - controlled[0]
        np.testing.assert_allclose(diff - diff[:, :1], 0.0, atol=1e-4)
    assert abs(lb.length_slope(controlled[2], lengths, ref)) < 1e-5
    with pytest.raises(ValueError, match="bonus"):
        lb.with_length_bonus(task, -1.0)


def test_rloo_ends_near_the_optimum_and_grpo_beyond_it():
    """The reveal of section 7, as numbers any run of the library must show (not the figures themselves)."""
    task = sq.default_task()
    cfg = sq.GRPOConfig(iterations=200, beta=0.05)
    star = sq.optimum_summary(task, 0.05)
    rloo, grpo = sq.train_rloo(task, cfg), sq.train_grpo(task, cfg)
    assert abs(float(rloo.kl[-1]) - star["kl"]) < 1.0 < float(grpo.kl[-1]) - star["kl"]
    assert float(rloo.regret[-1]) < 0.25 * float(grpo.regret[-1])


# ------------------------------------------------------------------------------------------------
# the judged checks


def rloo_numpy_loop(rewards):
    """A correct answer in another style: NumPy float64, the other rewards' mean by an explicit loop."""
    r = np.asarray(rewards, np.float64)
    out = np.empty_like(r)
    for i in range(r.shape[0]):
        for j in range(r.shape[1]):
            others = [r[i, k] for k in range(r.shape[1]) if k != j]
            out[i, j] = r[i, j] - sum(others) / len(others)
    return out


def length_numpy(score, length, ref_logp):
    """A correct answer in another style: NumPy float64, the slope by explicit weighted moments."""
    s = np.asarray(score, np.float64)
    L = np.broadcast_to(np.asarray(length, np.float64), s.shape)
    w = np.exp(np.asarray(ref_logp, np.float64))
    ml = (w * L).sum(axis=1, keepdims=True)
    cov = (w * s * (L - ml)).sum()  # sum w (s - ms)(L - ml) = sum w s (L - ml): the weights of a row sum to 1
    var = (w * (L - ml) ** 2).sum()
    return s - cov / var * (L - ml)


@pytest.mark.parametrize("seed", SEEDS)
def test_correct_answers_of_another_style_pass(seed):
    _run("test_seq_rloo_advantages", {"rloo_advantages": rloo_numpy_loop}, seed)
    _run("test_seq_length_normalised_score", {"length_normalised_score": length_numpy}, seed)


def _rloo(fn):
    return lambda rewards: fn(jnp.asarray(rewards, jnp.float32))


RLOO_MISTAKES = {
    "baseline includes the response": (_rloo(lambda r: r - r.mean(axis=1, keepdims=True)),
                                       "the baseline includes the response itself"),
    "divided by K": (_rloo(lambda r: r - (r.sum(axis=1, keepdims=True) - r) / r.shape[1]), "divided by K"),
    "GRPO std": (_rloo(lambda r: (r - r.mean(axis=1, keepdims=True)) / (r.std(axis=1, keepdims=True) + 1e-6)),
                 "divided by the group's std"),
    "batch baseline": (_rloo(lambda r: r - (r.sum() - r) / (r.size - 1)), "the mean of the whole batch"),
    "sign reversed": (_rloo(lambda r: (r.sum(axis=1, keepdims=True) - r) / (r.shape[1] - 1) - r),
                      "the sign is reversed"),
}


def _length_variant(weights="ref", centre="prompt", pooled=True, subtract_mean=True, divide=False):
    def answer(score, length, ref_logp):
        s = jnp.asarray(score, jnp.float32)
        L = jnp.broadcast_to(jnp.asarray(length, jnp.float32), s.shape)
        if divide:
            return s / jnp.maximum(L, 1.0)
        lp = jnp.asarray(ref_logp, jnp.float32)
        w = {"ref": jnp.exp(lp), "uniform": jnp.ones_like(s) / s.shape[1], "logp": lp}[weights]
        axis = 1 if centre == "prompt" else None
        ms = jnp.sum(w * s, axis=axis, keepdims=True) / jnp.sum(w, axis=axis, keepdims=True)
        ml = jnp.sum(w * L, axis=axis, keepdims=True) / jnp.sum(w, axis=axis, keepdims=True)
        num, den = w * (s - ms) * (L - ml), w * (L - ml) ** 2
        c = (num.sum(axis=1, keepdims=True) / den.sum(axis=1, keepdims=True)) if not pooled else num.sum() / den.sum()
        return s - c * (L - ml) if subtract_mean else s - c * L
    return answer


LENGTH_MISTAKES = {
    "uniform weights": (_length_variant(weights="uniform"), "weighs every response equally"),
    "log-probs as weights": (_length_variant(weights="logp"), "log-probabilities were used as weights"),
    "a slope per prompt": (_length_variant(pooled=False), "one slope per prompt"),
    "centred on all prompts": (_length_variant(centre="all"), "centred on means over all prompts"),
    "c * L subtracted": (_length_variant(subtract_mean=False), "c * L was subtracted"),
    "divided by length": (_length_variant(divide=True), "divided by the length"),
}


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("case", sorted(RLOO_MISTAKES))
def test_rloo_mistakes_fail_by_name(case, seed):
    answer, message = RLOO_MISTAKES[case]
    with pytest.raises(GradingError) as err:
        _run("test_seq_rloo_advantages", {"rloo_advantages": answer}, seed)
    assert message in str(err.value), str(err.value)


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("case", sorted(LENGTH_MISTAKES))
def test_length_mistakes_fail_by_name(case, seed):
    answer, message = LENGTH_MISTAKES[case]
    with pytest.raises(GradingError) as err:
        _run("test_seq_length_normalised_score", {"length_normalised_score": answer}, seed)
    assert message in str(err.value), str(err.value)
