"""Building a task: gold reward by hand, the SFT fit against the hidden chain, the proxy's
normalisation, preference loss, determinism, and bad input."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rlhf_lab import sequences as sq
from rlhf_lab.sequences import sft, task as task_mod
from seq_support import tokens_of

LANG = sq.DEFAULT_LANGUAGE
EOS, PAD = LANG.eos, LANG.pad


@pytest.fixture(scope="module")
def task():
    return sq.default_task()


def _gold(**kw):
    base = dict(target=[0, 1, 2, 3], bigram_first=[1, 2, 3, 4], bigram_second=[2, 3, 4, 0],
                preferred_length=[2, 3, 4, 2])
    base.update(kw)
    return sq.make_gold(LANG, **base)


def test_gold_terms_by_hand():
    g = _gold()
    tokens = jnp.array([
        [0, 0, 1, 2, EOS, PAD],   # prompt 0: c = 2 copies of 'a', one 'b c' bigram, length 4, ended
        [1, 1, 1, 1, 1, 1],       # prompt 1: c = 6 copies of 'b', truncated, length 6
        [EOS, PAD, PAD, PAD, PAD, PAD],  # prompt 2: empty response, length 0
    ])
    mask = sq.response_mask(tokens, EOS, PAD)
    terms = {k: np.asarray(v) for k, v in sq.gold_terms(g, LANG, jnp.array([0, 1, 2]), tokens, mask).items()}
    np.testing.assert_allclose(terms["target"], [2 - 4 / 4, 6 - 36 / 4, 0.0], atol=1e-6)
    np.testing.assert_allclose(terms["bigram"], [-1.0, 0.0, 0.0])
    np.testing.assert_allclose(terms["length"], [-0.3 * 2, -0.3 * 3, -0.3 * 4], atol=1e-6)
    np.testing.assert_allclose(terms["missing_eos"], [0.0, -1.0, 0.0])
    total = np.asarray(sq.gold_reward(g, LANG, jnp.array([0, 1, 2]), tokens, mask))
    np.testing.assert_allclose(total, sum(terms.values()), atol=1e-6)


def test_gold_bigram_is_not_counted_across_the_end():
    g = _gold()  # prompt 0 forbids 'b c' (1, 2)
    tokens = jnp.array([[1, EOS, PAD, PAD, PAD, PAD], [1, 2, 1, 2, EOS, PAD]])
    mask = sq.response_mask(tokens, EOS, PAD)
    np.testing.assert_allclose(sq.gold_terms(g, LANG, jnp.array([0, 0]), tokens, mask)["bigram"], [0.0, -2.0])


def test_gold_table_matches_batched_function(task):
    tree = sq.prefix_tree(LANG)
    rows = np.random.default_rng(0).choice(LANG.n_responses, 300, replace=False)
    for p in range(LANG.n_prompts):
        got = np.asarray(sq.gold_reward(task.gold, LANG, np.full(rows.size, p), tree.response_tokens[rows],
                                        tree.response_mask[rows]))
        np.testing.assert_allclose(np.asarray(task.arrays.gold)[p, rows], got, atol=1e-5)


@pytest.mark.parametrize("kw, match", [
    (dict(target=[0, 1, 2]), "target must be 4 integer token ids"),
    (dict(target=[0, 1, 2, 5]), r"target must hold content-token ids in \[0, 4\]"),
    (dict(preferred_length=[1, 2, 3, 9]), "preferred_length must lie in"),
    (dict(target_peak=0.0), "target_peak must be > 0"),
    (dict(bigram_penalty=-1.0), "bigram_penalty must be >= 0"),
])
def test_gold_validation(kw, match):
    with pytest.raises(ValueError, match=match):
        _gold(**kw)


def test_demonstrations_are_well_formed():
    chain = sq.random_chain(LANG, 3)
    prompts, tokens, mask = sq.sample_demonstrations(chain, LANG, 64, 3)
    assert list(prompts[:5]) == [0, 1, 2, 3, 0]
    for row, m in zip(tokens, mask):
        toks = tokens_of(row, PAD)
        assert len(toks) == m.sum() >= 1
        assert EOS not in toks[:-1]  # EOS only at the end
        assert toks[-1] == EOS or len(toks) == LANG.max_len


def test_demonstration_counts_give_the_same_loss_as_masked_nll(task):
    prompts, tokens, mask = task.demos
    params = task.sft.params
    feats = sq.context_features(LANG, prompts, tokens)
    direct = float(sq.masked_nll(sq.token_logp(params, feats, jnp.asarray(tokens)), jnp.asarray(mask)))
    uf, counts = sq.demonstration_counts(LANG, prompts, tokens, mask)
    via_counts = -float(np.sum(counts * np.asarray(sq.policy_logp(params, jnp.asarray(uf)), np.float64)) / counts.sum())
    assert abs(direct - via_counts) < 1e-4
    assert counts.sum() == mask.sum()


def test_sft_reference_is_close_to_the_hidden_chain(task):
    chain_logp = task_mod.chain_table(task)
    ref = np.asarray(task.arrays.ref_resp_logp, np.float64)
    kl = (np.exp(chain_logp) * (chain_logp - ref)).sum(axis=1)
    # chain entropy per prompt: the fitted NLL can only approach it from above
    assert np.all(kl < 0.35), kl
    assert float(task.sft.loss_history[-1]) < float(task.sft.loss_history[0]) - 0.3


def test_preference_loss_by_hand():
    got = float(sq.preference_loss(jnp.array([1.0, 0.0]), jnp.array([0.0, 0.0])))
    expected = 0.5 * (np.log1p(np.exp(-1.0)) + np.log(2.0))
    assert abs(got - expected) < 1e-6
    # large margins do not underflow to inf/NaN
    assert np.isfinite(float(sq.preference_loss(jnp.array([-200.0]), jnp.array([200.0]))))


def test_pairs_labels_follow_bradley_terry(task):
    pr = task.pairs
    gap = pr.gold_chosen - pr.gold_rejected
    # the preferred response is better on average, and not always (labels are noisy draws)
    assert gap.mean() > 0.2
    assert (gap < 0).mean() > 0.05


def test_proxy_is_normalised_under_the_reference(task):
    ref = np.exp(np.asarray(task.arrays.ref_resp_logp, np.float64))
    ref /= ref.sum(axis=1, keepdims=True)
    proxy = np.asarray(task.arrays.proxy, np.float64)
    mean = np.mean((ref * proxy).sum(axis=1))
    var = np.mean((ref * (proxy - mean) ** 2).sum(axis=1))
    assert abs(mean) < 1e-4 and abs(var - 1.0) < 1e-3


def test_proxy_table_matches_proxy_reward(task):
    tree = sq.prefix_tree(LANG)
    rows = np.arange(0, LANG.n_responses, 97)
    for p in range(LANG.n_prompts):
        got = sq.proxy_reward(task.proxy, LANG, np.full(rows.size, p), tree.response_tokens[rows], tree.response_mask[rows])
        np.testing.assert_allclose(np.asarray(task.arrays.proxy)[p, rows], got, atol=1e-5)


def test_score_is_proxy_minus_missing_eos_penalty(task):
    tree = sq.prefix_tree(LANG)
    diff = np.asarray(task.arrays.proxy) - np.asarray(task.arrays.score)
    np.testing.assert_allclose(diff, np.broadcast_to(1.0 - tree.has_eos, diff.shape), atol=1e-6)


def test_proxy_cannot_see_order():
    """Two responses with the same counts, length and EOS get the same proxy score, whatever the gold says."""
    task = sq.default_task()
    g = task.gold
    x, y = int(g.bigram_first[0]), int(g.bigram_second[0])
    a = jnp.array([[x, y, EOS, PAD, PAD, PAD], [y, x, EOS, PAD, PAD, PAD]])
    mask = sq.response_mask(a, EOS, PAD)
    proxy = np.asarray(sq.proxy_reward(task.proxy, LANG, jnp.array([0, 0]), a, mask))
    gold = np.asarray(sq.gold_reward(g, LANG, jnp.array([0, 0]), a, mask))
    assert proxy[0] == pytest.approx(proxy[1], abs=1e-6)
    assert gold[0] < gold[1] - 0.5


def test_make_task_is_deterministic_and_seeds_differ(task):
    again = sq.make_task(sq.DEFAULT_SEED)
    np.testing.assert_array_equal(np.asarray(again.arrays.ref_resp_logp), np.asarray(task.arrays.ref_resp_logp))
    np.testing.assert_array_equal(np.asarray(again.arrays.proxy), np.asarray(task.arrays.proxy))
    other = sq.make_task(7)
    assert not np.allclose(np.asarray(other.arrays.gold), np.asarray(task.arrays.gold))
    assert "prompt 0" in other.describe()


def test_top_responses(task):
    top = task.top_responses(task.arrays.ref_resp_logp, prompt=1, k=3)
    probs = [p for _, p in top]
    assert probs == sorted(probs, reverse=True) and len(top) == 3
    assert abs(sum(np.exp(np.asarray(task.arrays.ref_resp_logp[1], np.float64))) - 1) < 1e-4
    with pytest.raises(ValueError, match=r"prompt must be in \[0, 3\]"):
        task.top_responses(task.arrays.ref_resp_logp, prompt=4)


@pytest.mark.parametrize("kw, match", [
    (dict(seed=-1), "seed must be an integer >= 0"),
    (dict(missing_eos_penalty=-0.5), "missing_eos_penalty must be >= 0"),
    (dict(bt_temperature=0.0), "bt_temperature .Bradley-Terry temperature. must be > 0"),
    (dict(lang="small"), "lang must be"),
    (dict(hidden=0), "hidden must be an integer >= 1"),
])
def test_make_task_validation(kw, match):
    with pytest.raises(ValueError, match=match):
        sq.make_task(**kw)


def test_fit_reference_validation(task):
    prompts, tokens, mask = task.demos
    with pytest.raises(ValueError, match="mismatched shapes"):
        sq.fit_reference(LANG, prompts, tokens, mask[:, :5])
    with pytest.raises(ValueError, match="learning_rate must be > 0"):
        sq.fit_reference(LANG, prompts, tokens, mask, learning_rate=0.0)


def test_evaluate_policy_of_the_reference(task):
    ev = sq.evaluate_policy(task, task.ref_params, beta=0.1)
    assert ev["kl"] == 0.0 and ev["proxy"] == pytest.approx(0.0, abs=1e-4)
    ref = np.exp(np.asarray(task.arrays.ref_resp_logp, np.float64))
    assert ev["gold"] == pytest.approx(np.mean((ref * np.asarray(task.arrays.gold)).sum(1)), abs=1e-5)
    assert ev["regret"] == pytest.approx(ev["optimum"] - ev["score"], abs=1e-6) and ev["regret"] > 0
    tree = sq.prefix_tree(LANG)
    assert ev["p_truncated"] == pytest.approx(np.mean((ref * (1 - tree.has_eos)).sum(1)), abs=1e-5)
    with pytest.raises(ValueError, match="beta"):
        sq.evaluate_policy(task, task.ref_params, beta=0.0)


def test_optimum_summary_kl_grows_as_beta_falls(task):
    kls = [sq.optimum_summary(task, b)["kl"] for b in (3.0, 1.0, 0.3, 0.1)]
    assert all(a < b for a, b in zip(kls, kls[1:]))
    s = sq.optimum_summary(task, 0.3)
    assert s["objective"] == pytest.approx(s["score"] - 0.3 * s["kl"], abs=1e-3)
