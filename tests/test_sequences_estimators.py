"""KL estimators: values against exact sums, gradients of each placement against finite
differences of the exact forward and reverse KL, Monte Carlo convergence, and the sequence level."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rlhf_lab import sequences as sq
from rlhf_lab.sequences import exact

LOGITS = np.array([0.5, -1.0, 0.2, 1.0])
REF = np.log(np.array([0.1, 0.2, 0.3, 0.4]))


def _np_kl(logits, ref_logp, reverse=False):
    z = logits - logits.max()
    logp = z - np.log(np.exp(z).sum())
    if reverse:
        return float(np.sum(np.exp(ref_logp) * (ref_logp - logp)))
    return float(np.sum(np.exp(logp) * (logp - ref_logp)))


def _fd_grad(f, x, h=1e-6):
    g = np.zeros_like(x)
    for i in range(x.size):
        e = np.zeros_like(x)
        e[i] = h
        g[i] = (f(x + e) - f(x - e)) / (2 * h)
    return g


def test_estimator_values_by_hand():
    logp, ref = jnp.array([-1.0, -0.5]), jnp.array([-0.5, -1.5])
    np.testing.assert_allclose(sq.k1(logp, ref), [-0.5, 1.0], atol=1e-6)
    np.testing.assert_allclose(sq.k2(logp, ref), [0.125, 0.5], atol=1e-6)
    np.testing.assert_allclose(sq.k3(logp, ref), [np.exp(0.5) - 1 - 0.5, np.exp(-1.0) - 1 + 1.0], atol=1e-6)
    assert np.all(np.asarray(sq.k3(jnp.linspace(-5, 0, 11), jnp.linspace(0, -5, 11))) >= 0)


def test_expected_estimates_against_exact_sums():
    out = sq.expected_estimates(LOGITS, REF)
    p = np.exp(LOGITS - LOGITS.max())
    p /= p.sum()
    logp = np.log(p)
    kl = np.sum(p * (logp - REF))
    assert out["kl"] == pytest.approx(kl, rel=1e-5)
    assert out["k1"] == pytest.approx(kl, rel=1e-4)  # unbiased
    assert out["k3"] == pytest.approx(kl, rel=1e-4)  # unbiased
    assert out["k2"] == pytest.approx(np.sum(p * 0.5 * (logp - REF) ** 2), rel=1e-4)
    assert abs(out["k2"] - kl) > 0.01  # biased away from the reference
    assert out["reverse_kl"] == pytest.approx(_np_kl(LOGITS, REF, reverse=True), rel=1e-5)


def test_exact_token_kl_is_zero_at_the_reference():
    assert float(sq.exact_token_kl(jnp.asarray(REF), jnp.asarray(REF))) == 0.0


def test_placement_gradients_follow_forward_or_reverse_kl():
    g = {k: np.asarray(v, np.float64) for k, v in sq.placement_gradients(LOGITS, REF).items()}
    fd_forward = _fd_grad(lambda z: _np_kl(z, REF), LOGITS.astype(np.float64))
    fd_reverse = _fd_grad(lambda z: _np_kl(z, REF, reverse=True), LOGITS.astype(np.float64))
    np.testing.assert_allclose(g["kl"], fd_forward, atol=1e-5)
    np.testing.assert_allclose(g["reverse_kl"], fd_reverse, atol=1e-5)
    np.testing.assert_allclose(g["k1_in_reward"], fd_forward, atol=1e-5)   # PPO's placement
    np.testing.assert_allclose(g["k2_in_loss"], fd_forward, atol=1e-5)
    np.testing.assert_allclose(g["k3_in_loss"], fd_reverse, atol=1e-5)     # GRPO's placement
    np.testing.assert_allclose(g["k1_in_loss"], 0.0, atol=1e-6)            # no KL gradient at all
    assert np.linalg.norm(fd_forward - fd_reverse) > 0.05  # the two targets really differ here


def test_sampled_gradients_converge_to_exact():
    exact_g = sq.placement_gradients(LOGITS, REF)
    mc = sq.sampled_placement_gradients(jax.random.key(0), LOGITS, REF, 200_000)
    for name in ("k1_in_reward", "k2_in_loss", "k3_in_loss", "k1_in_loss"):
        np.testing.assert_allclose(mc[name], exact_g[name], atol=0.01)


@pytest.mark.parametrize("call, match", [
    (lambda: sq.placement_gradients([0.1], [0.0]), "at least 2 actions"),
    (lambda: sq.placement_gradients([0.1, 0.2], [0.0, 0.0, 0.0]), "mismatched shapes"),
    (lambda: sq.expected_estimates([0.1, float("nan")], [0.0, 0.0]), "non-finite"),
    (lambda: sq.k3(jnp.zeros(3), jnp.zeros(4)), "mismatched shapes"),
    (lambda: sq.sampled_placement_gradients(jax.random.key(0), [0.1, 0.2], [0.0, 0.0], 0), "n_samples"),
])
def test_estimator_bad_input(call, match):
    with pytest.raises(ValueError, match=match):
        call()


SMALL = sq.Language(n_prompts=2, n_tokens=3, max_len=3)


def test_sequence_level_placements_against_finite_differences_of_exact_kl():
    """Whole responses: k1 in the reward follows grad KL_seq(pi || pi_ref); per-token k2 in the loss does not."""
    tree = sq.prefix_tree(SMALL)
    feats = jnp.asarray(tree.prefix_features)
    pi = sq.init_policy(jax.random.key(3), SMALL.n_features, SMALL.n_actions, hidden=6)
    pi["w_out"] = pi["w_out"] * 20.0
    ref = sq.init_policy(jax.random.key(4), SMALL.n_features, SMALL.n_actions, hidden=6)
    grads = sq.sequence_placement_gradients(pi, ref, feats, SMALL)

    # finite differences on the output bias, of the exact KL computed response by response
    def kl_of_bias(b):
        p = dict(pi, b_out=jnp.asarray(b, jnp.float32))
        resp = np.asarray(exact.policy_tables(p, feats, SMALL)[1], np.float64)
        ref_resp = np.asarray(exact.policy_tables(ref, feats, SMALL)[1], np.float64)
        return float(np.mean(np.sum(np.exp(resp) * (resp - ref_resp), axis=1)))

    fd = _fd_grad(kl_of_bias, np.asarray(pi["b_out"], np.float64), h=1e-3)
    np.testing.assert_allclose(grads["kl"]["b_out"], fd, atol=2e-3)
    np.testing.assert_allclose(grads["k1_in_reward"]["b_out"], fd, atol=2e-3)
    assert np.linalg.norm(np.asarray(grads["k2_in_loss"]["b_out"]) - fd) > 0.01
