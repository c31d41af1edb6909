"""Best-of-n (hand cases, brute force over all n-tuples, the log n - (n-1)/n formula), GRPO and
DPO losses by hand, and (slow) the contrast runs against the exact optimum."""
import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rlhf_lab import sequences as sq


def test_best_of_n_by_hand():
    ref = np.log([0.5, 0.3, 0.2])
    q = np.exp(sq.best_of_n_logp(ref, np.array([1.0, 3.0, 2.0]), 2))
    np.testing.assert_allclose(q, [0.25, 1 - 0.49, 0.49 - 0.25], atol=1e-12)


def test_best_of_n_ties_share_in_proportion_to_the_reference():
    ref = np.log([0.2, 0.3, 0.5])
    q = np.exp(sq.best_of_n_logp(ref, np.array([1.0, 1.0, 2.0]), 2))
    np.testing.assert_allclose(q, [0.25 * 0.4, 0.25 * 0.6, 0.75], atol=1e-12)


def _brute_best_of_n(p, s, n):
    """Enumerate every n-tuple of draws; the winner is a uniformly chosen draw among those with top score."""
    out = np.zeros(len(p))
    for tup in itertools.product(range(len(p)), repeat=n):
        prob = np.prod([p[i] for i in tup])
        top = max(s[i] for i in tup)
        winners = [i for i in tup if s[i] == top]
        for w in winners:
            out[w] += prob / len(winners)
    return out


@pytest.mark.parametrize("n", [1, 2, 3, 4])
def test_best_of_n_matches_brute_force(n):
    rng = np.random.default_rng(n)
    p = rng.dirichlet(np.ones(5))
    s = np.array([0.3, -1.0, 0.3, 2.0, 0.0])  # one tie
    q = np.exp(sq.best_of_n_logp(np.log(p), s, n))
    np.testing.assert_allclose(q, _brute_best_of_n(p, s, n), atol=1e-12)


def test_best_of_n_kl_formula_in_the_continuous_limit():
    """Many equally likely responses with distinct rewards: the exact KL approaches log n - (n-1)/n."""
    R = 20000
    ref = np.full(R, -np.log(R))
    s = np.random.default_rng(0).permutation(R).astype(float)
    for n in (2, 4, 16):
        q = sq.best_of_n_logp(ref, s, n)
        kl = float(np.sum(np.exp(q) * (q - ref)))
        assert kl == pytest.approx(np.log(n) - (n - 1) / n, abs=2e-3)
        assert sq.best_of_n_kl_formula(n) == pytest.approx(np.log(n) - (n - 1) / n)


def test_best_of_n_on_the_task():
    task = sq.default_task()
    kls, golds = [], []
    for n in (1, 2, 8, 32):
        s = sq.best_of_n_summary(task, n)
        assert s["kl"] <= s["kl_formula"] + 1e-6  # the formula bounds the exact KL
        kls.append(s["kl"])
        golds.append(s["gold"])
    assert kls[0] == pytest.approx(0.0, abs=1e-6)
    assert all(a < b for a, b in zip(kls, kls[1:]))
    # the distribution sums to one
    q = sq.best_of_n_logp(task.arrays.ref_resp_logp, task.arrays.score, 8)
    np.testing.assert_allclose(np.exp(q).sum(axis=1), 1.0, atol=1e-9)


def test_best_of_n_bad_input():
    with pytest.raises(ValueError, match="n must be an integer >= 1"):
        sq.best_of_n_logp(np.log([0.5, 0.5]), np.array([0.0, 1.0]), 0)
    with pytest.raises(ValueError, match="mismatched shapes"):
        sq.best_of_n_logp(np.log([0.5, 0.5]), np.array([0.0, 1.0, 2.0]), 2)


def test_group_advantages_by_hand():
    s = jnp.array([[1.0, 2.0, 3.0, 6.0], [5.0, 5.0, 5.0, 5.0]])
    a = np.asarray(sq.group_advantages(s))
    row = np.array([1.0, 2.0, 3.0, 6.0])
    np.testing.assert_allclose(a[0], (row - 3.0) / (row.std() + 1e-6), rtol=1e-5)
    np.testing.assert_allclose(a[1], 0.0)
    with pytest.raises(ValueError, match="at least 2 responses"):
        sq.group_advantages(jnp.ones((3, 1)))


def test_group_advantages_of_equal_float32_scores_are_exactly_zero():
    """In float32 the mean of equal numbers is often an ulp off; a constant group still gets exactly 0."""
    rng = np.random.default_rng(0)
    for k in (2, 3, 5, 6, 7, 8, 9, 16, 64):
        values = rng.normal(scale=2.0, size=200).astype(np.float32)
        scores = np.repeat(values[:, None], k, axis=1)
        a = np.asarray(sq.group_advantages(jnp.asarray(scores)))
        assert np.all(a == 0.0), f"group size {k}: {np.count_nonzero(np.any(a != 0, axis=1))} of 200 constant groups"
    np.testing.assert_array_equal(np.asarray(sq.group_advantages(jnp.zeros((2, 4)))), 0.0)


def test_group_advantages_near_constant_rule():
    """std <= 1e-4 * max |score| is constant (0); a spread just above it keeps the formula."""
    below = np.array([[100.0, 100.0, 100.0, 100.019]])   # population std 0.0082 < 0.0100019
    above = np.array([[100.0, 100.0, 100.0, 100.05]])    # population std 0.0217 > 0.010005
    np.testing.assert_array_equal(np.asarray(sq.group_advantages(jnp.asarray(below))), 0.0)
    got = np.asarray(sq.group_advantages(jnp.asarray(above)))
    sd = np.std(above[0])
    np.testing.assert_allclose(got[0], (above[0] - above[0].mean()) / (sd + 1e-6), rtol=2e-3)
    assert sq.contrasts.CONSTANT_GROUP_RTOL == 1e-4


def test_grpo_loss_by_hand():
    # one response, two real tokens, one padding token with garbage values
    logp = jnp.array([[np.log(1.5), np.log(0.5), 3.0]])
    old_logp = jnp.array([[0.0, 0.0, -9.0]])
    ref_logp = jnp.array([[np.log(0.5), 0.0, 2.0]])
    mask = jnp.array([[1.0, 1.0, 0.0]])
    adv = jnp.array([1.0])
    beta = 0.1
    # token 0: ratio 1.5 clipped to 1.2; k3 = 0.5/1.5 - 1 - log(0.5/1.5); token 1: ratio 0.5, k3 = 2 - 1 - log 2
    k3_0 = 1 / 3 - 1 - np.log(1 / 3)
    k3_1 = 2 - 1 - np.log(2)
    expected = ((-1.2 + beta * k3_0) + (-0.5 + beta * k3_1)) / 2
    assert float(sq.grpo_loss(logp, old_logp, ref_logp, adv, mask, beta, 0.2)) == pytest.approx(expected, rel=1e-5)


def test_dpo_loss_by_hand_and_as_preference_loss_of_implicit_rewards():
    lc, lr = jnp.array([-1.0, -2.0]), jnp.array([-3.0, -1.0])
    rc, rr = jnp.array([-1.5, -2.0]), jnp.array([-2.0, -2.0])
    beta = 0.5
    margins = np.array([(-1.0 + 1.5) - (-3.0 + 2.0), (-2.0 + 2.0) - (-1.0 + 2.0)])
    expected = np.mean(np.log1p(np.exp(-beta * margins)))
    assert float(sq.dpo_loss(lc, lr, rc, rr, beta)) == pytest.approx(expected, rel=1e-6)
    implicit = float(sq.preference_loss(beta * (lc - rc), beta * (lr - rr)))
    assert implicit == pytest.approx(expected, rel=1e-6)
    with pytest.raises(ValueError, match="beta"):
        sq.dpo_loss(lc, lr, rc, rr, 0.0)


@pytest.mark.parametrize("kw, match", [
    (dict(group_size=1), "group_size must be an integer >= 2"),
    (dict(batch_size=100, group_size=8), "multiple of group_size"),
    (dict(batch_size=16, minibatch_size=32, group_size=8), "smaller than minibatch_size"),
    (dict(beta=0.0), "beta"),
])
def test_grpo_config_validation(kw, match):
    with pytest.raises(ValueError, match=match):
        sq.GRPOConfig(**kw)


def test_contrast_runs_validate():
    task = sq.default_task()
    with pytest.raises(ValueError, match="must be a multiple of eval_every"):
        sq.train_dpo(task, steps=15, eval_every=10)
    with pytest.raises(ValueError, match="beta"):
        sq.exact_gradient_ascent(task, beta=-1.0)
    with pytest.raises(ValueError, match="config must be a GRPOConfig"):
        sq.train_grpo(task, sq.SeqPPOConfig())


@pytest.mark.slow
def test_exact_gradient_ascent_reaches_the_optimum():
    task = sq.default_task()
    r = sq.exact_gradient_ascent(task, beta=0.3, steps=400, learning_rate=3e-3)
    regret = np.asarray(r.regret)
    assert regret[-1] < 0.05 * regret[0]
    assert np.all(np.diff(np.asarray(r.objective)) > -0.02)  # noise-free: (almost) monotone


@pytest.mark.slow
def test_dpo_and_grpo_improve_the_gold_reward_at_moderate_beta():
    task = sq.default_task()
    d = sq.train_dpo(task, beta=0.3, steps=200)
    assert float(d.gold[-1]) > float(d.gold[0]) + 0.3
    assert float(d.kl[-1]) > 0.1
    g = sq.train_grpo(task, sq.GRPOConfig(iterations=100, beta=0.3))
    assert float(g.proxy[-1]) > float(g.proxy[0]) + 0.5
    assert float(g.regret[-1]) < float(g.regret[0])
