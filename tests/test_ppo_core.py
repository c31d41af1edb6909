"""The PPO pieces of rlhf_lab.ppo / rlhf_lab.reward against the two source documents and first principles.

Expected values are literal numbers from the lesson and the PyTorch module, or independent
float64 NumPy formulas; never values produced by the code under test.
"""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from rlhf_lab import ppo, reward

# ---------------------------------------------------------------------------------------------
# Clipped surrogate


def test_clipped_terms_both_directions_match_the_lesson():
    # (rho, A) = (1.5, 2) -> products 3 and 2.4 -> 2.4 ; (0.5, -2) -> -1 and -1.6 -> -1.6
    terms = ppo.clipped_surrogate(jnp.array([1.5, 0.5]), jnp.array([2.0, -2.0]), 0.2)
    np.testing.assert_allclose(np.asarray(terms), [2.4, -1.6], rtol=0, atol=1e-6)


# The PyTorch module's five cases and its printed table (epsilon 0.2).
FIVE_RATIOS = [1.8, 1.05, 1.8, 0.3, 0.3]
FIVE_ADVANTAGES = [1.0, 1.0, -1.0, -1.0, 1.0]
FIVE_UNCLIPPED = [1.8, 1.05, -1.8, -0.3, 0.3]
FIVE_CLIPPED = [1.2, 1.05, -1.8, -0.8, 0.3]
FIVE_DIVERGE = [True, False, False, True, False]


def test_five_cases_of_the_pytorch_module():
    ratio = jnp.array(FIVE_RATIOS, jnp.float32)
    adv = jnp.array(FIVE_ADVANTAGES, jnp.float32)
    unclipped = np.asarray(ratio * adv)
    clipped = np.asarray(ppo.clipped_surrogate(ratio, adv, 0.2))
    np.testing.assert_allclose(unclipped, FIVE_UNCLIPPED, atol=1e-6)
    np.testing.assert_allclose(clipped, FIVE_CLIPPED, atol=1e-6)
    diverge = np.abs(unclipped - clipped) > 1e-6
    assert diverge.tolist() == FIVE_DIVERGE


def test_clip_never_softens_a_wrong_way_move():
    # negative advantage with a growing ratio keeps the full (more negative) unclipped product
    for rho in (1.3, 1.8, 3.0):
        assert float(ppo.clipped_surrogate(rho, -1.0, 0.2)) == pytest.approx(-rho, abs=1e-6)


@settings(max_examples=100, deadline=None)
@given(
    ratio=st.floats(0.01, 5.0),
    adv=st.floats(-5.0, 5.0),
    eps=st.floats(0.01, 0.99),
)
def test_clipped_surrogate_is_the_signed_min(ratio, adv, eps):
    expected = min(ratio * adv, min(max(ratio, 1 - eps), 1 + eps) * adv)
    got = float(ppo.clipped_surrogate(jnp.float32(ratio), jnp.float32(adv), jnp.float32(eps)))
    assert got == pytest.approx(expected, rel=1e-5, abs=1e-5)


def test_clip_fraction_counts_ratios_outside_the_interval():
    ratio = jnp.array([0.7, 0.85, 1.0, 1.15, 1.3, 2.0])
    assert float(ppo.clip_fraction(ratio, 0.2)) == pytest.approx(3 / 6)


# ---------------------------------------------------------------------------------------------
# KL


POLICY = [2.0, 0.5, 0.1, -1.0]
REF_CLOSE = [1.8, 0.6, 0.0, -0.9]
REF_FAR = [-1.0, 2.0, 1.5, 0.8]


def test_kl_example_of_the_pytorch_module():
    logp = jax.nn.log_softmax(jnp.array(POLICY))
    close = float(ppo.categorical_kl(logp, jax.nn.log_softmax(jnp.array(REF_CLOSE))))
    far = float(ppo.categorical_kl(logp, jax.nn.log_softmax(jnp.array(REF_FAR))))
    assert abs(close - 0.0072039) <= 1e-6
    assert abs(far - 1.9827589) <= 1e-6
    # the module's penalised rewards with raw reward 1.0 and beta 0.1
    assert abs((1.0 - 0.1 * close) - 0.9992796) <= 1e-6
    assert abs((1.0 - 0.1 * far) - 0.8017241) <= 1e-6


def test_kl_is_zero_exactly_at_the_reference():
    for logits in ([0.2, 0.0, -0.2], POLICY, [5.0, -3.0, 0.0, 1e-3, 2.5]):
        ref_logp = jax.nn.log_softmax(jnp.array(logits, jnp.float32))
        assert float(ppo.categorical_kl(ref_logp, ref_logp)) == 0.0


logit_vectors = st.integers(2, 5).flatmap(
    lambda n: st.tuples(
        arrays(np.float32, n, elements=st.floats(-6, 6, width=32)),
        arrays(np.float32, n, elements=st.floats(-6, 6, width=32)),
    )
)


_kl_of_logits = jax.jit(lambda a, b: ppo.categorical_kl(jax.nn.log_softmax(a), jax.nn.log_softmax(b)))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(pair=logit_vectors)
def test_kl_is_nonnegative_and_matches_float64(pair):
    a, b = pair
    kl = float(_kl_of_logits(jnp.asarray(a), jnp.asarray(b)))
    p = np.exp(a - np.logaddexp.reduce(a.astype(np.float64)))
    expected = float(np.sum(p * ((a - np.logaddexp.reduce(a.astype(np.float64))) - (b - np.logaddexp.reduce(b.astype(np.float64))))))
    assert kl >= -1e-6
    assert kl == pytest.approx(expected, rel=1e-4, abs=1e-5)


# ---------------------------------------------------------------------------------------------
# The loss treats behaviour log-probs and advantages as constants


def _batch(seed, sign, drift=0.0):
    rng = np.random.default_rng(seed)
    n, batch = 4, 16
    logits = jnp.asarray(rng.normal(size=n), jnp.float32)
    actions = jnp.asarray(rng.integers(0, n, size=batch))
    # drift 0: behaviour = current policy, every ratio is 1 and the unclipped branch is active;
    # drift > 0: the current policy has moved away, so some ratios sit outside [1-eps, 1+eps]
    behaviour = logits + jnp.asarray(drift * rng.normal(size=n), jnp.float32)
    old_logp = jax.nn.log_softmax(behaviour)[actions]
    adv = jnp.asarray(sign * np.abs(rng.normal(size=batch)) + 0.1 * sign, jnp.float32)
    ref_logp = jax.nn.log_softmax(jnp.asarray(rng.normal(size=n), jnp.float32))
    return logits, old_logp, actions, adv, ref_logp


_loss_grads = jax.jit(jax.grad(ppo.ppo_loss, argnums=(0, 1, 3)))


@pytest.mark.parametrize("drift", [0.0, 0.7], ids=["on-policy", "after-updates"])
@pytest.mark.parametrize("sign", [1.0, -1.0], ids=["positive-advantages", "negative-advantages"])
def test_gradient_wrt_old_logp_and_advantages_is_exactly_zero(sign, drift):
    logits, old_logp, actions, adv, ref_logp = _batch(3, sign, drift)
    g_logits, g_old, g_adv = _loss_grads(logits, old_logp, actions, adv, ref_logp, 0.2, 0.2)
    assert np.all(np.asarray(g_old) == 0.0), g_old
    assert np.all(np.asarray(g_adv) == 0.0), g_adv
    # ... while the loss really does depend on the current logits
    assert float(jnp.max(jnp.abs(g_logits))) > 1e-3


@pytest.mark.parametrize("sign", [1.0, -1.0])
def test_the_zero_gradient_check_would_catch_a_missing_stop_gradient(sign):
    # control: the same loss written without stop_gradient has non-zero gradients on this batch,
    # so the exact-zero assertion above is not trivially true.
    logits, old_logp, actions, adv, ref_logp = _batch(3, sign)

    def leaky(logits, old_logp, advantages):
        logp = jax.nn.log_softmax(logits)
        ratio = jnp.exp(logp[actions] - old_logp)
        surr = jnp.mean(ppo.clipped_surrogate(ratio, advantages, 0.2))
        return -surr + 0.2 * ppo.categorical_kl(logp, ref_logp)

    g_old, g_adv = jax.jit(jax.grad(leaky, argnums=(1, 2)))(logits, old_logp, adv)
    assert float(jnp.max(jnp.abs(g_old))) > 0 and float(jnp.max(jnp.abs(g_adv))) > 0


def test_loss_value_matches_the_formula_in_float64():
    rng = np.random.default_rng(7)
    n, batch, beta, eps = 3, 32, 0.3, 0.15
    logits = rng.normal(size=n).astype(np.float32)
    behaviour = rng.normal(size=n).astype(np.float32)
    actions = rng.integers(0, n, size=batch)
    old_logp_all = behaviour - np.logaddexp.reduce(behaviour.astype(np.float64))
    old_logp = old_logp_all[actions]
    adv = rng.normal(size=batch)
    ref = rng.normal(size=n)
    ref_logp = ref - np.logaddexp.reduce(ref)
    logp = logits - np.logaddexp.reduce(logits.astype(np.float64))
    rho = np.exp(logp[actions] - old_logp)
    surr = np.minimum(rho * adv, np.clip(rho, 1 - eps, 1 + eps) * adv).mean()
    expected = -surr + beta * np.sum(np.exp(logp) * (logp - ref_logp))
    got = float(ppo.ppo_loss(jnp.asarray(logits), jnp.asarray(old_logp, jnp.float32), jnp.asarray(actions),
                             jnp.asarray(adv, jnp.float32), jnp.asarray(ref_logp, jnp.float32), beta, eps))
    assert got == pytest.approx(expected, rel=1e-5, abs=1e-5)


# ---------------------------------------------------------------------------------------------
# Baseline cancellation, advantages, expected reward


LESSON_REWARDS = np.array([1.9811294, 0.327278, -2.3084073])
_enumerated = jax.jit(ppo.enumerated_baseline_gradient)
_exact = jax.jit(ppo.exact_reward_gradient)


@pytest.mark.parametrize("probe", [[0.3, -0.2, 0.1], [2.0, -1.0, 0.5], [-3.0, 0.0, 3.0]])
@pytest.mark.parametrize("baseline", [0.0, "expected", -3.0, 10.0, 0.123])
def test_enumerated_baseline_gradient_equals_exact_gradient(probe, baseline):
    logits = jnp.asarray(probe, jnp.float32)
    rewards = jnp.asarray(LESSON_REWARDS, jnp.float32)
    p = np.exp(np.asarray(probe) - np.logaddexp.reduce(np.asarray(probe, np.float64)))
    c = float(np.sum(p * LESSON_REWARDS)) if baseline == "expected" else baseline
    # independent float64 formula: d/dz_j sum_a p_a r_a = p_j (r_j - E_p[r])
    exact_np = p * (LESSON_REWARDS - np.sum(p * LESSON_REWARDS))
    enumerated = np.asarray(_enumerated(logits, rewards, jnp.float32(c)))
    exact = np.asarray(_exact(logits, rewards))
    np.testing.assert_allclose(exact, exact_np, atol=2e-6)
    np.testing.assert_allclose(enumerated, exact, atol=2e-5 * max(1.0, abs(c)))


def test_exact_advantages_have_zero_mean_under_the_behaviour_policy():
    rewards = jnp.asarray(LESSON_REWARDS, jnp.float32)
    old_logp_all = jax.nn.log_softmax(jnp.array([0.4, -0.1, 0.3]))
    adv_per_action = np.asarray(ppo.exact_advantages(jnp.arange(3), rewards, old_logp_all))
    p = np.exp(np.asarray(old_logp_all, np.float64))
    np.testing.assert_allclose(adv_per_action, LESSON_REWARDS - np.sum(p * LESSON_REWARDS), atol=1e-6)
    assert abs(np.sum(p * adv_per_action)) < 1e-6


def test_expected_reward_is_the_exact_sum():
    logp = jax.nn.log_softmax(jnp.array([0.2, 0.0, -0.2]))
    # the lesson's recorded initial reward: E_{pi_ref}[r]
    assert abs(float(ppo.expected_reward(logp, jnp.asarray(LESSON_REWARDS, jnp.float32))) - 0.28191882) < 1e-6


# ---------------------------------------------------------------------------------------------
# Regularised objective and the analytic optimum


def _np_logsoftmax(z):
    z = np.asarray(z, np.float64)
    return z - np.logaddexp.reduce(z)


def test_lesson_optimum_numbers():
    rewards = jnp.asarray(LESSON_REWARDS, jnp.float32)
    ref_logp = jax.nn.log_softmax(jnp.array([0.2, 0.0, -0.2]))
    opt = ppo.optimal_logp(ref_logp, rewards, 0.2)
    assert abs(float(ppo.regularised_objective(opt, rewards, ref_logp, 0.2)) - 1.7987912) < 1e-5
    assert abs(float(ppo.regularised_objective(ref_logp, rewards, ref_logp, 0.2)) - 0.28191882) < 1e-6


problem = st.integers(2, 5).flatmap(
    lambda n: st.tuples(
        arrays(np.float64, n, elements=st.floats(-4, 4)),  # reference logits
        arrays(np.float64, n, elements=st.floats(-3, 3)),  # rewards
        arrays(np.float64, n, elements=st.floats(-8, 8)),  # a random policy's logits
        st.one_of(st.floats(1e-3, 1e-2), st.floats(1e-2, 10.0)),  # beta, small values included
    )
)


@jax.jit
def _bound_case(ref_logits, rewards, logits, beta):
    """(optimum log-probs, J(optimum), J(random policy), J(reference)) with the library functions."""
    ref_logp = jax.nn.log_softmax(ref_logits)
    opt_logp = ppo.optimal_logp(ref_logp, rewards, beta)
    j = lambda logp: ppo.regularised_objective(logp, rewards, ref_logp, beta)  # noqa: E731
    return opt_logp, j(opt_logp), j(jax.nn.log_softmax(logits)), j(ref_logp)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(problem=problem)
def test_analytic_optimum_bounds_the_objective_of_random_policies(problem):
    ref_logits, r, logits, beta = problem
    f32 = lambda x: jnp.asarray(x, jnp.float32)  # noqa: E731
    opt_logp, j_opt, j_rand, j_ref = _bound_case(f32(ref_logits), f32(r), f32(logits), f32(beta))
    assert np.all(np.isfinite(np.asarray(opt_logp))), "optimum overflowed (not computed in log space?)"
    j_opt, j_rand, j_ref = float(j_opt), float(j_rand), float(j_ref)
    assert np.isfinite(j_opt) and np.isfinite(j_rand)
    # closed form of the optimum's value, in float64: beta * logsumexp(log pi_ref + r / beta)
    closed = beta * np.logaddexp.reduce(_np_logsoftmax(ref_logits.astype(np.float32)) + r.astype(np.float32) / beta)
    tol = 1e-4 * (1.0 + np.max(np.abs(r)))
    assert j_opt == pytest.approx(closed, abs=tol)
    assert j_opt >= j_rand - tol
    assert j_opt >= j_ref - tol


def test_optimum_probabilities_match_the_float64_formula():
    ref_logits = np.array([0.2, 0.0, -0.2])
    for beta in (0.05, 0.2, 1.0, 5.0):
        w = np.exp(_np_logsoftmax(ref_logits)) * np.exp(LESSON_REWARDS / beta)
        expected = w / w.sum()
        got = np.exp(np.asarray(ppo.optimal_logp(jax.nn.log_softmax(jnp.asarray(ref_logits, jnp.float32)),
                                                 jnp.asarray(LESSON_REWARDS, jnp.float32), beta)))
        np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-7)


def test_tiny_beta_optimum_does_not_overflow():
    ref_logp = jax.nn.log_softmax(jnp.array([0.2, 0.0, -0.2]))
    rewards = jnp.asarray(LESSON_REWARDS, jnp.float32)
    opt = np.asarray(ppo.optimal_logp(ref_logp, rewards, 1e-3))
    assert np.all(np.isfinite(opt))
    assert np.exp(opt)[0] == pytest.approx(1.0, abs=1e-6)  # all mass on the best action
    j = float(ppo.regularised_objective(jnp.asarray(opt), rewards, ref_logp, 1e-3))
    assert np.isfinite(j)


def _np_frontier(ref_logits, rewards, betas):
    """(KL(pi* || pi_ref), E_pi*[r]) per beta by direct enumeration in float64 (no library code)."""
    ref = _np_logsoftmax(ref_logits)
    r = np.asarray(rewards, np.float64)
    kls, rs = [], []
    for b in betas:
        logp = _np_logsoftmax(ref + r / b)
        p = np.exp(logp)
        kls.append(np.sum(p * (logp - ref)))
        rs.append(np.sum(p * r))
    return np.array(kls), np.array(rs)


def test_frontier_matches_the_float64_enumeration():
    rng = np.random.default_rng(3)
    for n in (2, 3, 5):
        ref_logits, r = rng.normal(size=n), rng.normal(scale=1.5, size=n)
        betas = np.array([0.05, 0.2, 1.0, 4.0])
        kls, rs = ppo.reward_kl_frontier(jax.nn.log_softmax(jnp.asarray(ref_logits, jnp.float32)),
                                         jnp.asarray(r, jnp.float32), betas)
        want_kl, want_r = _np_frontier(ref_logits.astype(np.float32), r.astype(np.float32), betas)
        assert kls.shape == rs.shape == (4,)
        np.testing.assert_allclose(np.asarray(kls), want_kl, rtol=1e-4, atol=1e-6)
        np.testing.assert_allclose(np.asarray(rs), want_r, rtol=1e-4, atol=1e-6)


def test_frontier_kl_and_reward_grow_as_beta_falls():
    ref_logp = jax.nn.log_softmax(jnp.array([0.2, 0.0, -0.2]))
    rewards = jnp.asarray(LESSON_REWARDS, jnp.float32)
    betas = np.geomspace(5.0, 0.1, 25)  # falling; below about 0.05 float32 saturates at the best action
    kls, rs = (np.asarray(x, np.float64) for x in ppo.reward_kl_frontier(ref_logp, rewards, betas))
    assert np.all(np.diff(kls) > 0), kls
    assert np.all(np.diff(rs) > 0), rs
    kls, rs = (np.asarray(x, np.float64) for x in ppo.reward_kl_frontier(ref_logp, rewards, np.geomspace(5, 1e-3, 40)))
    assert np.all(np.diff(kls) >= -1e-7) and np.all(np.diff(rs) >= -1e-7)
    # the two ends: the reference (KL 0, E_ref[r]) and the best action (KL -log pi_ref(0), r(0))
    p_ref = np.exp(np.asarray(ref_logp, np.float64))
    big_kl, big_r = ppo.reward_kl_frontier(ref_logp, rewards, [1e6])
    assert float(big_kl[0]) == pytest.approx(0.0, abs=1e-6)
    assert float(big_r[0]) == pytest.approx(float(p_ref @ LESSON_REWARDS), abs=1e-4)
    small_kl, small_r = ppo.reward_kl_frontier(ref_logp, rewards, [1e-3])
    assert float(small_kl[0]) == pytest.approx(-np.log(p_ref[0]), abs=1e-4)
    assert float(small_r[0]) == pytest.approx(LESSON_REWARDS[0], abs=1e-4)


def _above_frontier(kl, reward, front_kl, front_r, tol):
    """Points (kl, reward) that beat a frontier point with at least its KL: reward > front_r at kl <= front_kl."""
    kl, reward = np.asarray(kl, np.float64).ravel(), np.asarray(reward, np.float64).ravel()
    # strictly less KL (by a float32 margin: along the curve the reward rises with slope beta per nat)
    beaten = (kl[:, None] <= front_kl[None, :] - 1e-6) & (reward[:, None] > front_r[None, :] + tol)
    return np.argwhere(beaten)


def test_no_random_policy_lies_above_the_frontier():
    """Brute force: thousands of random policies, none with more reward at no more KL than pi*_beta."""
    rng = np.random.default_rng(8)
    for n in (2, 3, 4):
        ref_logits, r = rng.normal(size=n), rng.normal(scale=2.0, size=n)
        ref = _np_logsoftmax(ref_logits.astype(np.float32))
        policies = rng.dirichlet(np.full(n, 0.5), size=4000)  # [4000, n], float64
        logp = np.log(np.maximum(policies, 1e-300))
        kl = np.sum(policies * (logp - ref), axis=1)
        reward = policies @ r.astype(np.float32)
        betas = np.geomspace(10.0, 0.01, 40)
        front_kl, front_r = (np.asarray(x, np.float64) for x in ppo.reward_kl_frontier(
            jnp.asarray(ref, jnp.float32), jnp.asarray(r, jnp.float32), betas))
        assert _above_frontier(kl, reward, front_kl, front_r, tol=1e-5).size == 0
        # the check can fail: a point just above a frontier point is caught
        assert _above_frontier([front_kl[5] - 1e-4], [front_r[5] + 1e-3], front_kl, front_r, tol=1e-5).size > 0


def test_no_ppo_run_of_a_sweep_lies_above_the_frontier():
    from rlhf_lab import PPOConfig, sweep_grid

    betas, epsilons = np.array([0.05, 0.2, 1.0]), np.array([0.1, 0.3])
    cfg = PPOConfig(iterations=10, batch_size=32, epochs=2)
    grid = sweep_grid(cfg, betas, epsilons)
    ref_logp = jax.nn.log_softmax(jnp.asarray(cfg.init_logits, jnp.float32))
    front_kl, front_r = (np.asarray(x, np.float64) for x in ppo.reward_kl_frontier(
        ref_logp, jnp.asarray(LESSON_REWARDS, jnp.float32), np.geomspace(10.0, 0.01, 60)))
    assert _above_frontier(grid.final_kl, grid.final_reward, front_kl, front_r, tol=1e-5).size == 0
    # every run gained reward over the reference, so the comparison is not vacuous
    assert np.all(np.asarray(grid.final_reward) > front_r[0] + 0.1)


# ---------------------------------------------------------------------------------------------
# Reward model


def test_preference_loss_formula():
    rng = np.random.default_rng(0)
    w = rng.normal(size=2)
    chosen, rejected = rng.normal(size=(5, 2)), rng.normal(size=(5, 2))
    expected = np.mean(np.log1p(np.exp(-((chosen - rejected) @ w))))
    got = float(reward.preference_loss(jnp.asarray(w, jnp.float32), jnp.asarray(chosen, jnp.float32), jnp.asarray(rejected, jnp.float32)))
    assert got == pytest.approx(expected, rel=1e-5)
    # zero weights: log 2 per pair
    assert float(reward.preference_loss(jnp.zeros(2), jnp.asarray(chosen), jnp.asarray(rejected))) == pytest.approx(np.log(2), rel=1e-6)


def test_fit_reward_reproduces_the_lesson_rewards_and_freezes_them():
    fitted = reward.fit_reward()
    np.testing.assert_allclose(np.asarray(fitted.rewards), [1.9811294, 0.327278, -2.3084073], atol=1e-6)
    assert fitted.loss_history.shape == (100,)
    assert float(fitted.loss_history[0]) == pytest.approx(np.log(2), rel=1e-6)
    assert np.all(np.diff(np.asarray(fitted.loss_history)) < 0)  # gradient descent decreases the loss
    # rewards are the features scored by the fitted weights
    np.testing.assert_allclose(np.asarray(fitted.rewards), reward.LESSON_FEATURES @ np.asarray(fitted.weights), atol=1e-6)
