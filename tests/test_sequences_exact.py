"""Exact evaluators against brute force: one NumPy forward pass per (response, position), on a
small language with random networks; KL, values and the optimum against their definitions."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rlhf_lab import sequences as sq
from rlhf_lab.sequences import exact
from seq_support import brute_force_responses, log_softmax_np, response_logp_np, tokens_of

SMALL = sq.Language(n_prompts=2, n_tokens=3, max_len=3)


def _params(seed, scale=1.0, layers=1):
    p = sq.init_policy(jax.random.key(seed), SMALL.n_features, SMALL.n_actions, hidden=8, layers=layers)
    p["w_out"] = p["w_out"] * (10.0 * scale)  # far from uniform
    return p


@pytest.fixture(scope="module")
def small():
    tree = sq.prefix_tree(SMALL)
    feats = jnp.asarray(tree.prefix_features)
    pi, ref = _params(1, layers=2), _params(2)  # both depths through the brute-force forward pass
    node, resp = exact.policy_tables(pi, feats, SMALL)
    ref_node, ref_resp = exact.policy_tables(ref, feats, SMALL)
    brute = np.array([[response_logp_np(pi, 2, 3, 3, p, tokens_of(r, SMALL.pad)) for r in tree.response_tokens]
                      for p in range(2)])
    brute_ref = np.array([[response_logp_np(ref, 2, 3, 3, p, tokens_of(r, SMALL.pad)) for r in tree.response_tokens]
                          for p in range(2)])
    return dict(tree=tree, feats=feats, pi=pi, ref=ref, node=node, resp=resp, ref_node=ref_node, ref_resp=ref_resp,
                brute=brute, brute_ref=brute_ref)


def test_response_logp_matches_token_by_token_brute_force(small):
    np.testing.assert_allclose(np.asarray(small["resp"]), small["brute"], atol=2e-5)


def test_probabilities_of_all_responses_sum_to_one(small):
    np.testing.assert_allclose(np.exp(small["brute"]).sum(axis=1), 1.0, atol=1e-9)  # the expectation itself
    np.testing.assert_allclose(np.exp(np.asarray(small["resp"], np.float64)).sum(axis=1), 1.0, atol=1e-5)


def test_probabilities_sum_to_one_default_language():
    task = sq.default_task()
    total = np.exp(np.asarray(task.arrays.ref_resp_logp, np.float64)).sum(axis=1)
    np.testing.assert_allclose(total, 1.0, atol=1e-4)


def test_reach_logp_is_product_of_conditionals(small):
    reach = np.asarray(exact.reach_logp(small["node"], SMALL))
    for j, row in enumerate(small["tree"].prefix_tokens):
        prefix = tokens_of(row, SMALL.pad)
        for p in range(2):
            # sum over all responses that start with this prefix
            mass = sum(np.exp(small["brute"][p, i]) for i, r in enumerate(small["tree"].response_tokens)
                       if tokens_of(r, SMALL.pad)[:len(prefix)] == prefix and len(tokens_of(r, SMALL.pad)) > len(prefix))
            np.testing.assert_allclose(np.exp(reach[p, j]), mass, rtol=1e-4)


def test_sequence_kl_two_ways_and_brute_force(small):
    pi, ref = small["brute"], small["brute_ref"]
    expected = (np.exp(pi) * (pi - ref)).sum(axis=1)
    np.testing.assert_allclose(exact.sequence_kl(small["node"], small["ref_node"], SMALL), expected, rtol=1e-4)
    np.testing.assert_allclose(exact.response_kl(small["resp"], small["ref_resp"]), expected, rtol=1e-4)
    assert np.all(expected > 0.01)


def test_kl_is_exactly_zero_at_the_reference(small):
    assert np.all(np.asarray(exact.sequence_kl(small["ref_node"], small["ref_node"], SMALL)) == 0.0)
    task = sq.default_task()
    kl = exact.sequence_kl(task.arrays.ref_node_logp, task.arrays.ref_node_logp, task.lang)
    assert np.all(np.asarray(kl) == 0.0)


def test_expectation_brute_force(small):
    score = np.random.default_rng(0).normal(size=small["brute"].shape)
    expected = (np.exp(small["brute"]) * score).sum(axis=1)
    np.testing.assert_allclose(exact.expectation(small["resp"], jnp.asarray(score, jnp.float32)), expected, rtol=1e-4,
                               atol=1e-5)


def _values_brute(small, score, beta, gamma):
    """V(prefix) by recursion over explicit strings (dicts, no tables)."""
    tree = small["tree"]
    index = {tokens_of(r, SMALL.pad): i for i, r in enumerate(tree.response_tokens)}
    pi_node = np.asarray(small["node"], np.float64)
    ref_node = np.asarray(small["ref_node"], np.float64)
    pre_index = {tokens_of(r, SMALL.pad): i for i, r in enumerate(tree.prefix_tokens)}

    def v(p, prefix):
        j = pre_index[prefix]
        total = 0.0
        for a in range(SMALL.n_actions):
            prob = np.exp(pi_node[p, j, a])
            r = -beta * (pi_node[p, j, a] - ref_node[p, j, a])
            nxt = prefix + (a,)
            if a == SMALL.eos or len(nxt) == SMALL.max_len:
                r += score[p, index[nxt]]
            else:
                r += gamma * v(p, nxt)
            total += prob * r
        return total

    return np.array([[v(p, tokens_of(row, SMALL.pad)) for row in tree.prefix_tokens] for p in range(2)])


@pytest.mark.parametrize("gamma", [1.0, 0.7])
def test_prefix_values_match_recursion(small, gamma):
    score = np.random.default_rng(1).normal(size=small["brute"].shape)
    beta = 0.3
    got = exact.prefix_values(small["node"], small["ref_node"], jnp.asarray(score, jnp.float32), beta, SMALL, gamma)
    np.testing.assert_allclose(got, _values_brute(small, score, beta, gamma), rtol=1e-4, atol=1e-5)


def test_value_of_empty_prefix_is_the_objective(small):
    score = np.random.default_rng(2).normal(size=small["brute"].shape)
    beta = 0.5
    v = np.asarray(exact.prefix_values(small["node"], small["ref_node"], jnp.asarray(score, jnp.float32), beta, SMALL))
    pi, ref = small["brute"], small["brute_ref"]
    objective = (np.exp(pi) * (score - beta * (pi - ref))).sum(axis=1)
    np.testing.assert_allclose(v[:, 0], objective, rtol=1e-4)


def test_optimum_closed_form_and_beats_every_policy(small):
    score = np.random.default_rng(3).normal(size=small["brute"].shape)
    ref = small["brute_ref"]
    for beta in (0.1, 1.0, 5.0):
        w = np.exp(ref + score / beta)
        opt = np.log(w / w.sum(axis=1, keepdims=True))
        got = np.asarray(exact.optimal_logp(jnp.asarray(ref, jnp.float32), jnp.asarray(score, jnp.float32), beta))
        np.testing.assert_allclose(got, opt, atol=1e-4)
        j_opt = (np.exp(opt) * (score - beta * (opt - ref))).sum(axis=1)
        np.testing.assert_allclose(exact.optimal_objective(jnp.asarray(ref), jnp.asarray(score), beta), j_opt, rtol=1e-4)
        # any other policy (here: pi and the reference) has a smaller objective and a positive regret
        for other in (small["brute"], ref):
            j = (np.exp(other) * (score - beta * (other - ref))).sum(axis=1)
            assert np.all(j <= j_opt + 1e-6)
            assert float(exact.regret(jnp.asarray(other), jnp.asarray(ref), jnp.asarray(score), beta)) >= -1e-5


def test_regret_of_the_optimum_is_zero():
    task = sq.default_task()
    a = task.arrays
    opt = exact.optimal_logp(a.ref_resp_logp, a.score, 0.1)
    assert abs(float(exact.regret(opt, a.ref_resp_logp, a.score, 0.1))) < 1e-4


def test_init_policy_layers():
    assert set(_params(0)) == {"w1", "b1", "w_out", "b_out"}
    assert set(_params(0, layers=2)) == {"w1", "b1", "w2", "b2", "w_out", "b_out"}
    with pytest.raises(ValueError, match="layers must be 1 or 2"):
        sq.init_policy(jax.random.key(0), 3, 4, layers=3)


def test_check_beta_gamma():
    with pytest.raises(ValueError, match="beta"):
        exact.check_beta_gamma(0.0, 1.0)
    with pytest.raises(ValueError, match=r"gamma \(discount\) must lie in \[0, 1\]"):
        exact.check_beta_gamma(0.1, 1.5)


def test_exact_bad_input(small):
    with pytest.raises(ValueError, match="node_logp must end in shape"):
        exact.response_logp(small["node"][:, :5], SMALL)
    with pytest.raises(ValueError, match="mismatched shapes"):
        exact.sequence_kl(small["node"], small["ref_node"][:1], SMALL)
    with pytest.raises(ValueError, match="beta .KL coefficient. must be > 0"):
        exact.optimal_logp(small["ref_resp"], jnp.zeros_like(small["ref_resp"]), 0.0)
    with pytest.raises(ValueError, match="mismatched shapes"):
        exact.optimal_objective(small["ref_resp"], jnp.zeros((2, 3)), 0.5)
    with pytest.raises(ValueError, match="lang must be"):
        exact.reach_logp(small["node"], "small")
