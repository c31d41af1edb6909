"""Sequence PPO pieces against hand computations and brute-force loops, edge cases (lambda 0 and 1,
length-1 and truncated responses, EOS vs padding), bad input, and the default run: proxy up,
gold over-optimised, regret towards the exact optimum."""
import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rlhf_lab import sequences as sq
from rlhf_lab.sequences import ppo

LANG = sq.DEFAULT_LANGUAGE
EOS, PAD = LANG.eos, LANG.pad

# three responses: ended after 2 content tokens, length 1 (EOS only), truncated (6 tokens, no EOS)
TOKENS = jnp.array([[0, 1, EOS, PAD, PAD, PAD], [EOS, PAD, PAD, PAD, PAD, PAD], [2, 2, 2, 2, 2, 2]])
MASK = sq.response_mask(TOKENS, EOS, PAD)


def test_last_token_is_the_last_real_token():
    np.testing.assert_array_equal(np.asarray(sq.last_token(MASK)),
                                  [[0, 0, 1, 0, 0, 0], [1, 0, 0, 0, 0, 0], [0, 0, 0, 0, 0, 1]])


def test_per_token_rewards_by_hand():
    logp = jnp.array([[-1.0, -2.0, -0.5, 0, 0, 0], [-0.1, 0, 0, 0, 0, 0], [-1.0] * 6])
    ref_logp = jnp.array([[-1.5, -1.0, -0.5, 0, 0, 0], [-0.3, 0, 0, 0, 0, 0], [-2.0] * 6])
    score = jnp.array([2.0, -1.0, 0.5])
    r = np.asarray(sq.per_token_rewards(logp, ref_logp, score, MASK, 0.1))
    expected = np.zeros((3, 6))
    expected[0, :3] = [-0.1 * 0.5, -0.1 * -1.0, 0.0]
    expected[0, 2] += 2.0  # score on the EOS token
    expected[1, 0] = -0.1 * 0.2 - 1.0  # length 1: KL term and score on the same token
    expected[2, :] = -0.1 * 1.0
    expected[2, 5] += 0.5  # truncated: score on the last real token
    np.testing.assert_allclose(r, expected, atol=1e-6)
    # summed over a response: score - beta (log pi(y) - log pi_ref(y))
    np.testing.assert_allclose(r.sum(1), [2.0 - 0.1 * (-3.5 + 3.0), -1.0 - 0.1 * 0.2, 0.5 - 0.1 * 6.0], atol=1e-6)


def test_per_token_rewards_are_zero_on_padding_even_with_garbage_logps():
    logp = jnp.full((3, 6), -5.0)
    ref_logp = jnp.full((3, 6), -1.0)
    r = np.asarray(sq.per_token_rewards(logp, ref_logp, jnp.ones(3), MASK, 0.5))
    assert np.all(r[np.asarray(MASK) == 0] == 0.0)


def gae_loop(rewards, values, mask, gamma, lam):
    """GAE written as a plain double loop from the definition (no scan, no shifted arrays)."""
    r, v, m = (np.asarray(x, np.float64) for x in (rewards, values, mask))
    adv = np.zeros_like(r)
    for b in range(r.shape[0]):
        n = int(m[b].sum())
        for t in range(n):
            total = 0.0
            for u in range(t, n):
                v_next = v[b, u + 1] if u + 1 < n else 0.0
                delta = r[b, u] + gamma * v_next - v[b, u]
                total += (gamma * lam) ** (u - t) * delta
            adv[b, t] = total
    return adv, (adv + v) * m


@pytest.mark.parametrize("gamma, lam", list(itertools.product([1.0, 0.9], [0.0, 0.5, 0.95, 1.0])))
def test_gae_matches_definition(gamma, lam):
    rng = np.random.default_rng(0)
    rewards = rng.normal(size=(3, 6)) * np.asarray(MASK)
    values = rng.normal(size=(3, 6))  # garbage on padding must not leak
    adv, ret = sq.gae(jnp.asarray(rewards, jnp.float32), jnp.asarray(values, jnp.float32), MASK, gamma, lam)
    e_adv, e_ret = gae_loop(rewards, values * np.asarray(MASK), MASK, gamma, lam)
    np.testing.assert_allclose(adv, e_adv, atol=1e-5)
    np.testing.assert_allclose(ret, e_ret, atol=1e-5)


def test_gae_lambda_one_gamma_one_is_return_minus_value():
    rng = np.random.default_rng(1)
    m = np.asarray(MASK)
    rewards = rng.normal(size=(3, 6)) * m
    values = rng.normal(size=(3, 6)) * m
    adv, ret = sq.gae(jnp.asarray(rewards, jnp.float32), jnp.asarray(values, jnp.float32), MASK, 1.0, 1.0)
    reward_to_go = np.flip(np.cumsum(np.flip(rewards, 1), 1), 1) * m
    np.testing.assert_allclose(adv, reward_to_go - values, atol=1e-5)
    np.testing.assert_allclose(ret, reward_to_go, atol=1e-5)


def test_gae_lambda_zero_is_one_step_td_error():
    m = np.asarray(MASK)
    rewards = np.arange(18, dtype=np.float64).reshape(3, 6) * m
    values = (np.arange(18, dtype=np.float64).reshape(3, 6) / 10) * m
    adv, _ = sq.gae(jnp.asarray(rewards, jnp.float32), jnp.asarray(values, jnp.float32), MASK, 0.9, 0.0)
    # response 0 has 3 real tokens: the last one has no successor (terminal)
    expected0 = [rewards[0, 0] + 0.9 * values[0, 1] - values[0, 0],
                 rewards[0, 1] + 0.9 * values[0, 2] - values[0, 1],
                 rewards[0, 2] - values[0, 2]]
    np.testing.assert_allclose(np.asarray(adv)[0, :3], expected0, atol=1e-5)
    np.testing.assert_allclose(np.asarray(adv)[1, 0], rewards[1, 0] - values[1, 0], atol=1e-5)
    assert np.all(np.asarray(adv)[m == 0] == 0)


def test_whiten_uses_real_tokens_only():
    adv = jnp.array([[1.0, 2.0, 3.0, 0, 0, 0], [4.0, 0, 0, 0, 0, 0], [0.0] * 6])
    mask = jnp.array([[1.0, 1, 1, 0, 0, 0], [1.0, 0, 0, 0, 0, 0], [0.0] * 6])
    real = np.array([1.0, 2.0, 3.0, 4.0])
    expected = (real - real.mean()) / np.sqrt(real.var() + 1e-8)
    got = np.asarray(sq.whiten(adv, mask))
    np.testing.assert_allclose(got[np.asarray(mask) > 0], expected, atol=1e-6)
    assert np.all(got[np.asarray(mask) == 0] == 0)
    # whitening over padding too (the classic mistake) gives different numbers
    wrong = (np.asarray(adv) - np.asarray(adv).mean()) / np.asarray(adv).std()
    assert not np.allclose(wrong[np.asarray(mask) > 0], expected, atol=1e-3)


@pytest.mark.parametrize("adv, ratio, expected", [
    (1.0, 1.5, 1.2),    # A > 0: gain capped at 1 + eps
    (1.0, 0.5, 0.5),    # A > 0, ratio fell: no cap from below
    (-1.0, 0.5, -0.8),  # A < 0: capped at 1 - eps
    (-1.0, 1.5, -1.5),  # A < 0, ratio grew: never softened
    (2.0, 1.1, 2.2),    # inside the range: unclipped
])
def test_policy_loss_signed_clipping(adv, ratio, expected):
    mask = jnp.array([[1.0, 0.0]])
    logp = jnp.array([[np.log(ratio), 5.0]])
    old_logp = jnp.array([[0.0, -3.0]])
    advantages = jnp.array([[adv, 100.0]])  # the padding entry must not count
    loss = float(sq.policy_loss(logp, old_logp, advantages, mask, 0.2))
    assert loss == pytest.approx(-expected, rel=1e-5)


def test_policy_loss_gradient_vanishes_when_clipped():
    mask = jnp.ones((1, 1))
    g_clip = jax.grad(lambda lp: sq.policy_loss(lp, jnp.zeros((1, 1)), jnp.ones((1, 1)), mask, 0.2))(jnp.full((1, 1), np.log(1.5)))
    g_free = jax.grad(lambda lp: sq.policy_loss(lp, jnp.zeros((1, 1)), jnp.ones((1, 1)), mask, 0.2))(jnp.full((1, 1), np.log(1.1)))
    assert float(g_clip[0, 0]) == 0.0
    assert float(g_free[0, 0]) == pytest.approx(-1.1, rel=1e-5)


def test_value_loss_clipped_by_hand():
    mask = jnp.array([[1.0, 1.0, 0.0]])
    values = jnp.array([[1.0, 0.0, 50.0]])
    old_values = jnp.array([[0.0, 0.0, 0.0]])
    returns = jnp.array([[2.0, 1.0, -50.0]])
    # token 0: v=1, clipped 0.2 -> max((1-2)^2, (0.2-2)^2) = 3.24; token 1: v=0 -> 1.0; token 2 is padding
    assert float(sq.value_loss(values, old_values, returns, mask, 0.2)) == pytest.approx(0.5 * (3.24 + 1.0) / 2, rel=1e-6)


def test_adaptive_kl_controller_by_hand():
    assert float(sq.adaptive_kl_update(0.1, 6.0, 3.0, 10000.0, 128)) == pytest.approx(0.1 * (1 + 0.2 * 128 / 10000), rel=1e-6)
    assert float(sq.adaptive_kl_update(0.1, 2.7, 3.0, 10000.0, 128)) == pytest.approx(0.1 * (1 - 0.1 * 128 / 10000), rel=1e-5)


@pytest.mark.parametrize("call, match", [
    (lambda: sq.gae(jnp.zeros((2, 6)), jnp.zeros((2, 6)), jnp.ones((2, 6)), 1.0, 1.5), r"lam \(GAE lambda\) must lie in \[0, 1\]"),
    (lambda: sq.gae(jnp.zeros((2, 6)), jnp.zeros((2, 6)), jnp.ones((2, 6)), -0.1, 0.5), r"gamma \(discount\) must lie in \[0, 1\]"),
    (lambda: sq.gae(jnp.zeros((2, 6)), jnp.zeros((2, 5)), jnp.ones((2, 6)), 1.0, 0.5), "mismatched shapes"),
    (lambda: sq.per_token_rewards(jnp.zeros((2, 6)), jnp.zeros((2, 6)), jnp.zeros(2), jnp.ones((2, 6)), 0.0), "beta .KL coefficient. must be > 0"),
    (lambda: sq.per_token_rewards(jnp.zeros((2, 6)), jnp.zeros((2, 6)), jnp.zeros(3), jnp.ones((2, 6)), 0.1), "mismatched shapes"),
    (lambda: sq.policy_loss(jnp.zeros((2, 6)), jnp.zeros((2, 6)), jnp.zeros((2, 6)), jnp.ones((2, 6)), 1.0), "clip range"),
    (lambda: sq.value_loss(jnp.zeros((2, 6)), jnp.zeros((2, 6)), jnp.zeros((2, 6)), jnp.ones((2, 6)), 0.0), "value_clip must be > 0"),
    (lambda: sq.whiten(jnp.zeros((2, 6)), jnp.ones((2, 5))), "mismatched shapes"),
])
def test_bad_input_of_pure_functions(call, match):
    with pytest.raises(ValueError, match=match):
        call()


@pytest.mark.parametrize("kw, match", [
    (dict(batch_size=16, minibatch_size=32), r"batch_size \(16\) is smaller than minibatch_size \(32\)"),
    (dict(batch_size=100, minibatch_size=32), "must be a multiple of minibatch_size"),
    (dict(beta=0.0), "beta .KL coefficient. must be > 0"),
    (dict(beta=-1.0), "beta .KL coefficient. must be > 0"),
    (dict(lam=1.01), r"lam must lie in \[0, 1\]"),
    (dict(gamma=-0.5), r"gamma must lie in \[0, 1\]"),
    (dict(epsilon=1.0), "clip range"),
    (dict(learning_rate=float("nan")), "learning_rate must be finite"),
    (dict(iterations=205), "must be a multiple of eval_every"),
    (dict(seed=-3), "seed must be an integer >= 0"),
    (dict(adaptive_kl="yes"), "adaptive_kl must be True or False"),
])
def test_config_validation(kw, match):
    with pytest.raises(ValueError, match=match):
        sq.SeqPPOConfig(**kw)


def test_train_validates_task_and_config():
    with pytest.raises(ValueError, match="task must be"):
        sq.train("task")
    with pytest.raises(ValueError, match="config must be a SeqPPOConfig"):
        sq.train(sq.default_task(), config={"beta": 0.1})
    with pytest.raises(ValueError, match="betas"):
        sq.sweep(sq.default_task(), sq.SeqPPOConfig(), [0.1, -0.1], [0, 1])
    with pytest.raises(ValueError, match="seeds must be"):
        sq.sweep(sq.default_task(), sq.SeqPPOConfig(), [0.1], [0.5])


def test_sampled_responses_are_well_formed():
    task = sq.default_task()
    prompts = jnp.arange(64) % LANG.n_prompts
    tokens, mask = jax.jit(lambda k: sq.sample_responses(k, task.ref_params, LANG, prompts))(jax.random.key(0))
    tokens, mask = np.asarray(tokens), np.asarray(mask)
    for row, m in zip(tokens, mask):
        n = int(m.sum())
        assert n >= 1
        assert all(t != PAD for t in row[:n]) and all(t == PAD for t in row[n:])
        assert EOS not in row[:n - 1]
        assert row[n - 1] == EOS or n == LANG.max_len


def test_sampling_frequencies_follow_exact_probabilities():
    """Empirical frequencies of the reference's samples agree with the enumerated probabilities."""
    task = sq.default_task()
    prompts = jnp.zeros(4000, jnp.int32)
    tokens, mask = jax.jit(lambda k: sq.sample_responses(k, task.ref_params, LANG, prompts))(jax.random.key(1))
    texts = [sq.decode(LANG, r) for r in np.asarray(tokens)]
    for text, p in task.top_responses(task.arrays.ref_resp_logp, 0, k=3):
        freq = texts.count(text) / len(texts)
        assert abs(freq - p) < 4 * np.sqrt(p * (1 - p) / len(texts)) + 1e-3, (text, freq, p)


@pytest.fixture(scope="module")
def default_run():
    task = sq.default_task()
    return task, sq.train(task, sq.SeqPPOConfig())


def test_default_run_improves_proxy_and_approaches_the_optimum(default_run):
    _, r = default_run
    proxy, regret = np.asarray(r.proxy), np.asarray(r.regret)
    assert proxy[0] == pytest.approx(0.0, abs=1e-4)  # the proxy is centred under the reference
    assert proxy[-1] > 1.5
    assert regret[-1] < 0.25 * regret[0]
    assert np.all(np.asarray(r.kl) >= -1e-6) and r.kl[0] == pytest.approx(0.0, abs=1e-6)


def test_default_run_over_optimises_the_gold_reward(default_run):
    """Small beta: the proxy keeps rising while the gold reward peaks early and then falls."""
    _, r = default_run
    gold, proxy = np.asarray(r.gold), np.asarray(r.proxy)
    peak = int(np.argmax(gold))
    assert 0 < peak < len(gold) - 5
    assert gold[peak] > gold[0] + 0.5
    assert gold[-1] < gold[peak] - 0.5
    assert proxy[-1] > proxy[peak] + 0.3


def test_default_run_records(default_run):
    task, r = default_run
    cfg = sq.SeqPPOConfig()
    assert r.score.shape == (cfg.iterations,) and r.gold.shape == (cfg.iterations // cfg.eval_every + 1,)
    assert np.all(np.asarray(r.beta) == np.float32(cfg.beta))
    b = r.last_batch
    # frozen old log-probs: the policy that sampled the last batch is not the final one
    assert b.tokens.shape == (cfg.batch_size, LANG.max_len)
    np.testing.assert_array_equal(np.asarray(b.mask), np.asarray(sq.response_mask(b.tokens, EOS, PAD)))
    assert np.all(np.asarray(b.advantages)[np.asarray(b.mask) == 0] == 0)
    m = np.asarray(b.mask) > 0
    assert abs(np.asarray(b.advantages)[m].mean()) < 1e-4 and abs(np.asarray(b.advantages)[m].std() - 1) < 1e-3
    # the exact metrics of the final policy equal a fresh evaluation
    ev = np.asarray(ppo.exact_metrics(r.policy_params, task.arrays, LANG, cfg.beta))
    np.testing.assert_allclose(ev[:4], [r.gold[-1], r.proxy[-1], r.exact_score[-1], r.kl[-1]], rtol=1e-5, atol=1e-5)


def test_trained_critic_approaches_the_exact_values(default_run):
    """The critic's values on the prefixes the final policy visits match the exact V^pi."""
    from rlhf_lab.sequences import exact

    task, r = default_run
    a = task.arrays
    node, resp = exact.policy_tables(r.policy_params, a.prefix_features, LANG)
    v_exact = np.asarray(exact.prefix_values(node, a.ref_node_logp, a.score, 0.05, LANG))
    reach = np.exp(np.asarray(exact.reach_logp(node, LANG), np.float64))
    w = reach / reach.sum()
    critic = np.asarray(sq.value(r.value_params, a.prefix_features))
    rmse = np.sqrt(np.sum(w * (critic - v_exact) ** 2))
    spread = np.sqrt(np.sum(w * (v_exact - np.sum(w * v_exact)) ** 2))
    assert rmse < 0.2 * spread, (rmse, spread)
    # and V(empty prefix) is the exact objective of the final policy
    np.testing.assert_allclose(v_exact[:, 0], exact.objective(resp, a.ref_resp_logp, a.score, 0.05), rtol=1e-4)


@pytest.mark.slow
def test_python_loop_is_the_same_algorithm():
    task = sq.default_task()
    cfg = sq.SeqPPOConfig(iterations=20, eval_every=10)
    compiled = sq.train(task, cfg)
    loop = sq.train_python_loop(task, cfg)
    np.testing.assert_allclose(loop["gold"], np.asarray(compiled.gold), atol=1e-3)
    np.testing.assert_allclose(loop["kl"], np.asarray(compiled.kl), atol=1e-3)


@pytest.mark.slow
def test_sweep_matches_single_runs_and_beta_orders_kl():
    task = sq.default_task()
    cfg = sq.SeqPPOConfig(iterations=60, eval_every=10)
    betas, seeds = [0.02, 0.5], [0, 1]
    res = sq.sweep(task, cfg, betas, seeds)
    assert res.gold.shape == (2, 2, 7)
    single = sq.train(task, sq.SeqPPOConfig(iterations=60, eval_every=10, beta=0.5, seed=1))
    np.testing.assert_allclose(np.asarray(res.kl[1, 1]), np.asarray(single.kl), atol=2e-3)
    assert np.all(np.asarray(res.kl[0, :, -1]) > np.asarray(res.kl[1, :, -1]))


@pytest.mark.slow
def test_adaptive_kl_moves_beta_towards_the_target():
    task = sq.default_task()
    cfg = sq.SeqPPOConfig(iterations=60, eval_every=10, adaptive_kl=True, beta=0.05, kl_target=1.0, kl_horizon=2000.0)
    r = sq.train(task, cfg)
    beta = np.asarray(r.beta)
    assert beta[-1] > beta[0] * 1.5  # KL above target: beta grows


@pytest.mark.slow
def test_other_language_end_to_end():
    """A fresh task on another language (3 prompts, 4 tokens, length 5): build, train, evaluate."""
    lang = sq.Language(n_prompts=3, n_tokens=4, max_len=5)
    task = sq.make_task(seed=11, lang=lang, n_demos=600, n_pairs=600)
    total = np.exp(np.asarray(task.arrays.ref_resp_logp, np.float64)).sum(axis=1)
    np.testing.assert_allclose(total, 1.0, atol=1e-4)
    r = sq.train(task, sq.SeqPPOConfig(iterations=40, batch_size=48, minibatch_size=16, eval_every=10, beta=0.1))
    assert r.gold.shape == (5,) and float(r.proxy[-1]) > float(r.proxy[0]) + 0.3
    assert float(r.regret[-1]) < float(r.regret[0])
    ev = sq.evaluate_policy(task, r.policy_params, 0.1)
    assert ev["kl"] == pytest.approx(float(r.kl[-1]), rel=1e-4, abs=1e-5)
