"""The a3 checks run the inputs their task statements cover that the course's sampler never makes.

The sampler only makes well-formed batches: PAD right after EOS, log-probs 0 on padding, mixed
advantages, groups with spread. Each answer below is wrong by its task statement but right on
such batches; each must fail its check, on every seed, with the message that names the mistake
(or, where the mistake has no classic name, with a message that says which edge input it failed).
The correct answers of every style pass the same edge inputs in ``tests/test_alternative_answers.py``.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rlhf_lab import sequences as sq
from rlhf_lab.judging import CHECKS, core, sequences_checks
from rlhf_lab.judging.core import GradingError, LocalStudent

REF = core.library_reference()
LANG = sq.DEFAULT_LANGUAGE
EOS, PAD = LANG.eos, LANG.pad
SEEDS = (0, 1, 2, 3)


def mask_not_pad(tokens, eos, pad):
    """Right only while PAD follows EOS: counts whatever comes after the first EOS."""
    return (jnp.asarray(tokens) != pad).astype(jnp.float32)


def mask_rows_only(tokens, eos, pad):
    """Right on [B, T] batches only: it makes every input a batch, so one response comes back as [1, T]."""
    tokens = jnp.atleast_2d(jnp.asarray(tokens))
    is_eos = (tokens == eos).astype(jnp.int32)
    return ((tokens != pad) & (jnp.cumsum(is_eos, axis=1) - is_eos == 0)).astype(jnp.float32)


def rewards_unmasked_kl(logp, ref_logp, score, mask, beta):
    """Right only while the log-probs are 0 on padding: the penalty is not multiplied by the mask."""
    return -beta * (logp - ref_logp) + score[:, None] * sq.last_token(mask)


def whiten_sum_over_real_count(advantages, mask):
    """Right only while padding holds zeros: sum(A) / sum(m) instead of sum(A m) / sum(m)."""
    mu = jnp.sum(advantages) / jnp.sum(mask)
    var = jnp.sum((advantages - mu) ** 2 * mask) / jnp.sum(mask)
    return (advantages - mu) / jnp.sqrt(var + 1e-8) * mask


def whiten_without_epsilon(advantages, mask):
    """Right while the advantages have spread: 0 / 0 when they are all equal."""
    mu = jnp.sum(advantages * mask) / jnp.sum(mask)
    sd = jnp.sqrt(jnp.sum((advantages - mu) ** 2 * mask) / jnp.sum(mask))
    return (advantages - mu) / sd * mask


def policy_loss_renormalised(logp, old_logp, advantages, mask, epsilon):
    """A guard that differs from the statement only when the advantages have no spread: there it
    whitens them again inside the loss (0 / 0, NaN)."""
    n = jnp.sum(mask)
    mu = jnp.sum(advantages * mask) / n
    adv = (advantages - mu) / jnp.sqrt(jnp.sum((advantages - mu) ** 2 * mask) / n) * mask
    adv = jnp.where(jnp.std(advantages) > 0, jax.lax.stop_gradient(advantages), adv)  # only differs at 0
    ratio = jnp.exp(logp - jax.lax.stop_gradient(old_logp))
    terms = jnp.minimum(ratio * adv, jnp.clip(ratio, 1 - epsilon, 1 + epsilon) * adv)
    return -jnp.sum(terms * mask) / n


def batch_rewards_not_pad(policy_params, ref_params, prompts, tokens, score, beta):
    """Builds its mask as tokens != PAD: right on sampled batches, wrong after a non-PAD token past EOS."""
    mask = (tokens != PAD).astype(jnp.float32)
    feats = sq.context_features(LANG, prompts, tokens)
    logp = sq.token_logp(policy_params, feats, tokens) * mask
    ref_logp = sq.token_logp(ref_params, feats, tokens) * mask
    return sq.per_token_rewards(logp, ref_logp, score, mask, beta)


def ppo_epochs_not_pad(params, prompts, tokens, old_logp, advantages, epsilon, learning_rate, epochs):
    """The epochs of the task, with the mask built as tokens != PAD."""
    mask = (tokens != PAD).astype(jnp.float32)
    feats = sq.context_features(LANG, prompts, tokens)

    def loss(p):
        return sq.policy_loss(sq.token_logp(p, feats, tokens), old_logp, advantages, mask, epsilon)

    for _ in range(epochs):
        g = jax.grad(loss)(params)
        params = jax.tree_util.tree_map(lambda p, d: p - learning_rate * d, params, g)
    return params


def ppo_epochs_normalised(params, prompts, tokens, old_logp, advantages, epsilon, learning_rate, epochs):
    """A guard that differs from the statement only when every advantage is 0: there it pushes every
    real token up instead of leaving the policy as it is."""
    mask = sq.response_mask(tokens, EOS, PAD)
    feats = sq.context_features(LANG, prompts, tokens)
    adv = jnp.where(jnp.any(advantages != 0), advantages, mask)  # "no signal? push every token up"

    def loss(p):
        return sq.policy_loss(sq.token_logp(p, feats, tokens), old_logp, adv, mask, epsilon)

    for _ in range(epochs):
        g = jax.grad(loss)(params)
        params = jax.tree_util.tree_map(lambda p, d: p - learning_rate * d, params, g)
    return params


def kl_flat(logp, ref_logp):
    """Right on 1-D inputs only: flattens its result."""
    r = jnp.ravel(ref_logp) - jnp.ravel(logp)
    return {"k1": -r, "k2": 0.5 * r**2, "k3": jnp.expm1(r) - r}


def fit_with_intercept(kl, gain):
    """np.polyfit of degree 2: fits an intercept the model does not have."""
    c2, c1, _ = np.polyfit(np.sqrt(kl), gain, 2)
    return np.array([c1, -c2])


def group_eps_in_sqrt(scores):
    """The 1e-6 under the square root: the same as the statement unless the group is near-constant."""
    mu = jnp.mean(scores, axis=1, keepdims=True)
    return (scores - mu) / jnp.sqrt(jnp.var(scores, axis=1, keepdims=True) + 1e-6)


def dpo_log_sigmoid(logp_chosen, logp_rejected, ref_logp_chosen, ref_logp_rejected, beta):
    """-log(sigmoid(.)) instead of softplus: overflows for a badly ranked pair."""
    margin = (logp_chosen - ref_logp_chosen) - (logp_rejected - ref_logp_rejected)
    return jnp.mean(-jnp.log(jax.nn.sigmoid(beta * margin)))


def sequence_logprob_squeezed(token_logp, mask):
    """Squeezes its result: a batch of one response loses its batch axis."""
    return jnp.squeeze(jnp.sum(token_logp * mask, axis=-1))


CASES = {
    "tokens after EOS counted": ("test_seq_response_mask", "response_mask", mask_not_pad,
                                 "tokens after the first EOS counted"),
    "response mask on 2-D batches only": ("test_seq_response_mask", "response_mask", mask_rows_only,
                                          "single response"),
    "KL penalty not masked": ("test_seq_rewards_kl", "per_token_rewards", rewards_unmasked_kl,
                              "the KL penalty is not masked"),
    "whitening mean over padding": ("test_seq_whiten", "whiten", whiten_sum_over_real_count,
                                    "padding entered the mean or the variance"),
    "whitening without its epsilon": ("test_seq_whiten", "whiten", whiten_without_epsilon, "NaN"),
    "policy loss re-whitens its advantages": ("test_seq_policy_loss", "policy_loss", policy_loss_renormalised,
                                              "every advantage 0"),
    "batch mask built as tokens != PAD": ("test_seq_batch_rewards", "batch_rewards", batch_rewards_not_pad,
                                          "the mask counts the tokens after the first EOS"),
    "epochs mask built as tokens != PAD": ("test_seq_ppo_epochs", "ppo_epochs", ppo_epochs_not_pad,
                                           "the mask counts the tokens after the first EOS"),
    "epochs move on zero advantages": ("test_seq_ppo_epochs", "ppo_epochs", ppo_epochs_normalised,
                                       "every advantage 0"),
    "KL estimators flattened": ("test_seq_kl_estimators", "kl_estimators", kl_flat, "[3, 4]"),
    "fit with an intercept": ("test_seq_overopt_fit", "fit_overoptimisation", fit_with_intercept,
                              "an intercept was fitted"),
    "GRPO epsilon under the square root": ("test_seq_group_advantages", "group_advantages", group_eps_in_sqrt,
                                           "the 1e-6 went under the square root"),
    "DPO through -log(sigmoid)": ("test_seq_dpo_loss", "dpo_loss", dpo_log_sigmoid, "NaN or inf"),
    "sequence log-prob squeezed": ("test_seq_sequence_logprob", "sequence_logprob", sequence_logprob_squeezed,
                                   "batch of one response"),
}


def _namespace(name, fn):
    ns = {"response_mask": sq.response_mask, "per_token_rewards": sq.per_token_rewards,
          "policy_loss": sq.policy_loss, "context_features": sq.context_features, "token_logp": sq.token_logp}
    ns[name] = fn
    return ns


@pytest.mark.parametrize("case", sorted(CASES))
def test_an_answer_right_only_on_sampled_batches_fails_by_name(case):
    grade_id, name, fn, message = CASES[case]
    for seed in SEEDS:
        with pytest.raises(GradingError) as err:
            CHECKS[grade_id].run(LocalStudent(_namespace(name, fn)), np.random.default_rng(seed), REF)
        assert message in str(err.value), (seed, str(err.value))


@pytest.mark.parametrize("case", ["tokens after EOS counted", "KL penalty not masked", "whitening mean over padding",
                                  "batch mask built as tokens != PAD"])
def test_the_same_answer_is_right_on_what_the_sampler_makes(case):
    """Each of these mistakes gives the right numbers on a well-formed batch (PAD after EOS, zeros on
    padding): only the edge inputs can tell it apart from a correct answer."""
    grade_id, name, fn, _ = CASES[case]
    rng = np.random.default_rng(7)
    tokens, mask, _ = sequences_checks.fresh_responses(rng, 8)
    logp = np.where(mask > 0, -rng.uniform(0.1, 2.0, size=mask.shape), 0.0).astype(np.float32)
    ref_logp = np.where(mask > 0, logp + rng.normal(scale=0.4, size=mask.shape), 0.0).astype(np.float32)
    score = rng.normal(size=8).astype(np.float32)
    if name == "response_mask":
        got, want = fn(tokens, EOS, PAD), sq.response_mask(tokens, EOS, PAD)
    elif name == "per_token_rewards":
        got, want = fn(logp, ref_logp, score, mask, 0.2), sq.per_token_rewards(logp, ref_logp, score, mask, 0.2)
    elif name == "whiten":
        adv = np.where(mask > 0, rng.normal(loc=2.0, size=mask.shape), 0.0).astype(np.float32)
        got, want = fn(adv, mask), sq.whiten(adv, mask)
    else:
        params = sequences_checks._params(3)
        prompts = np.arange(8, dtype=np.int32) % LANG.n_prompts
        args = (params, params, prompts, tokens, score, 0.2)
        got = fn(*args)
        feats = sq.context_features(LANG, prompts, tokens)
        lp = sq.token_logp(params, feats, tokens) * mask
        want = sq.per_token_rewards(lp, lp, score, mask, 0.2)
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-5, atol=1e-6)


def test_junk_after_eos_keeps_the_mask_and_never_writes_pad():
    for seed in range(20):
        rng = np.random.default_rng(seed)
        tokens, mask, _ = sequences_checks.fresh_responses(rng, 8)
        junk = sequences_checks.junk_after_eos(rng, tokens, mask)
        np.testing.assert_array_equal(np.asarray(sq.response_mask(junk, EOS, PAD)), mask)
        assert not np.any(junk[mask == 0] == PAD)
        np.testing.assert_array_equal(junk[mask > 0], tokens[mask > 0])
        assert junk[0, 1] < LANG.eos  # row 0 (EOS alone) is followed by a content token
