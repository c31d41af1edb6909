"""Checks of ``a3_ppo_sequences``: RLHF on a tiny language (:mod:`rlhf_lab.sequences`), piece by piece.

Every check draws fresh padded responses (ended by EOS, truncated, of length 1), fresh log-probs,
scores and hyperparameters, asks the student's function for its answer, computes the expected
answer with :mod:`rlhf_lab.sequences`, and names the classic mistake the answer matches: the score
on a padding position, EOS masked as if it were padding, the KL penalty with the wrong sign or
against the old policy, advantages whitened over padding, the value loss over padding, old
log-probs recomputed during the epochs.

The course's sampler only makes well-formed batches (PAD right after EOS, log-probs 0 on padding,
mixed scores), so an answer that relies on that would pass on its draws alone. Every check also
runs the inputs its task statement covers that the sampler never makes (:func:`junk_after_eos`,
junk on padding, one-response and one-token batches, constant and near-constant groups,
zero-variance and zero advantages, NumPy float64 inputs), and names the mistake where it is a
classic one.

Every input has a type, dtype and shape its task statement promises: arrays go in as JAX float32
arrays (:class:`~.core.Jax`), and as NumPy float64 arrays only to the tasks whose statement says
they are called with NumPy too (``masked_nll``, ``sequence_logprob``, ``preference_loss``,
``value_loss``, ``fit_overoptimisation``, ``rloo_advantages``, ``length_normalised_score``; and
``response_mask`` with a NumPy integer response of shape ``[T]``). A check reads the dtype where the
task asks for one (the float mask).
"""
from __future__ import annotations

import numpy as np

from .core import Jax, check, close, diagnose, field, to_float
from .registry import ALL
from .registry import check as register

A = "a3_ppo_sequences"
NB1, NB2, NB3 = "01_masks_and_sft.ipynb", "02_ppo_pieces.ipynb", "03_loop_and_analysis.ipynb"

#: The default language: content tokens 0-4, EOS 5, PAD 6, responses of at most 6 tokens.
N_TOKENS, EOS, PAD, T = 5, 5, 6, 6


def fresh_responses(rng, batch: int = 8):
    """``(tokens [B, T] int32, mask [B, T] float32, lengths [B])``: row 0 has length 1 (EOS only),
    row 1 is truncated (T content tokens, no EOS), the others random; PAD after the EOS."""
    lengths = rng.integers(1, T + 1, size=batch)
    lengths[0], lengths[1] = 1, T
    tokens = np.full((batch, T), PAD, np.int32)
    mask = np.zeros((batch, T), np.float32)
    for i, n in enumerate(lengths):
        truncated = i == 1 or (n == T and rng.random() < 0.5)
        content = n if truncated else n - 1
        tokens[i, :content] = rng.integers(0, N_TOKENS, size=content)
        if not truncated:
            tokens[i, content] = EOS
        mask[i, :n] = 1.0
    return tokens, mask, lengths


def _garbage(rng, mask, values):
    """``values`` with random finite numbers on the padding positions (they must never matter)."""
    return np.where(mask > 0, values, rng.normal(scale=3.0, size=values.shape)).astype(np.float32)


def _mmean(x, mask):
    return float(np.sum(x * mask) / max(np.sum(mask), 1.0))


def junk_after_eos(rng, tokens, mask):
    """``tokens`` with content tokens and further EOS (never PAD) after the first EOS of each response.

    A generator that keeps sampling after EOS writes such tokens; the response still ends at its
    first EOS, so the true mask is ``mask`` unchanged. Row 0 (EOS alone) always gets a content token
    right after its EOS, so every batch has at least one.
    """
    out = tokens.copy()
    after = (mask == 0)
    out[after] = rng.integers(0, N_TOKENS + 1, size=int(after.sum()))  # 0..4 content, 5 = EOS
    if after[0, 1]:
        out[0, 1] = int(rng.integers(0, N_TOKENS))
    return out


def one_token_batch(rng):
    """``(tokens [1, T], mask [1, T])``: a single response that is EOS alone (one real token)."""
    tokens = np.full((1, T), PAD, np.int32)
    tokens[0, 0] = EOS
    mask = np.zeros((1, T), np.float32)
    mask[0, 0] = 1.0
    return tokens, mask


def _dtype_kind(value) -> str | None:
    """The NumPy dtype kind of an array the student returned (``"f"`` float, ``"i"`` integer, ``"b"`` bool)."""
    try:
        return np.asarray(value).dtype.kind
    except Exception:  # noqa: BLE001 - a ragged nesting has no dtype
        return None


def f64(x):
    """``x`` as a NumPy float64 array (passed as NumPy, not as a JAX array: the student's code sees float64)."""
    return np.asarray(x, np.float64)


# ------------------------------------------------------------------------------------------------
# 01: masks, the SFT loss, the sequence log-likelihood, the preference loss


@register("test_seq_response_mask", task="response_mask", needs=("response_mask",), forbid=ALL,
          assignment=A, notebook=NB1)
def seq_response_mask(student, rng, ref):
    """Fresh padded responses: EOS counts, padding does not, a truncated response is all real, length 1 works."""
    from rlhf_lab import sequences as sq

    tokens, mask, _ = fresh_responses(rng, 10)
    got = student.call("response_mask", Jax(tokens), EOS, PAD)
    want = np.asarray(sq.response_mask(tokens, EOS, PAD))
    kind = _dtype_kind(got)
    check(kind == "f", f"response_mask must return a float mask (float32, as the statement asks), got "
                       f"{'dtype ' + str(np.asarray(got).dtype) if kind else type(got).__name__}: the mask multiplies "
                       f"log-probs and is summed into counts; convert it with .astype(jnp.float32)")
    diagnose(got, want, lambda: {
        "EOS itself is masked: EOS is a real token (it is sampled, has a log-prob and carries the "
        "score); the mask is 1 up to AND including the first EOS, 0 only on padding":
            ((tokens != EOS) & (tokens != PAD)).astype(np.float32),
        "EOS used as the padding token: padding must be its own id, the mask must be 0 on PAD":
            (tokens != EOS).astype(np.float32),
        "the mask is inverted: 1 on real tokens, 0 on padding": 1.0 - want,
    }, "response_mask", atol=1e-6)
    close(got, want, "response_mask on fresh responses (row 0: EOS only, row 1: truncated)", rtol=0.0, atol=1e-6)
    # a different EOS/PAD numbering: the ids must come from the arguments
    shifted = np.where(tokens == EOS, 9, np.where(tokens == PAD, 8, tokens)).astype(np.int32)
    close(student.call("response_mask", Jax(shifted), 9, 8), want, "response_mask with eos=9, pad=8",
          rtol=0.0, atol=1e-6, hint="use the eos and pad arguments, not fixed ids")
    # tokens after the first EOS that are not PAD: the response still ends at its first EOS
    junk = junk_after_eos(rng, tokens, mask)
    got = student.call("response_mask", Jax(junk), EOS, PAD)
    diagnose(got, want, lambda: {
        "tokens after the first EOS counted (a mask built as tokens != pad): the response ends at its "
        "first EOS, whatever follows it; the mask is 0 after it even where the token is not PAD":
            (junk != PAD).astype(np.float32),
        "EOS itself is masked: the mask is 1 up to AND including the first EOS":
            ((junk != EOS) & (junk != PAD)).astype(np.float32),
    }, "response_mask", atol=1e-6)
    close(got, want, "response_mask on responses followed by content tokens and a second EOS after their "
          "first EOS (not PAD)", rtol=0.0, atol=1e-6, hint="no EOS may occur before position t")
    # one response as a 1-D array, as NumPy int64: the statement's shape is [..., T], a batch [B, T] or one
    # response [T]
    close(student.call("response_mask", junk[2].astype(np.int64), EOS, PAD), want[2],
          "response_mask of a single response (a 1-D NumPy int64 array of shape (T,))", rtol=0.0, atol=1e-6,
          hint="tokens is [..., T]: work along the last axis (axis=-1, tokens[..., t]), not axis=1, and return "
               "the shape of `tokens`")


@register("test_seq_masked_nll", task="masked_nll", needs=("masked_nll",), forbid=ALL, assignment=A, notebook=NB1)
def seq_masked_nll(student, rng, ref):
    """SFT loss on fresh demonstrations: mean NLL per real token, padding (with junk log-probs) ignored."""
    import jax
    from rlhf_lab import sequences as sq

    tokens, mask, _ = fresh_responses(rng, 9)
    logp = _garbage(rng, mask, -rng.uniform(0.05, 3.0, size=mask.shape))
    got = student.call("masked_nll", Jax(logp), Jax(mask))
    want = float(sq.masked_nll(logp, mask))
    diagnose(got, want, lambda: {
        "padding counted: the mean must run over real tokens only (sum(mask * -logp) / sum(mask))":
            -float(np.mean(np.where(mask > 0, logp, 0.0))),
        "padding counted: junk log-probs on padding entered the loss": -float(np.mean(logp)),
        "summed instead of averaged over real tokens": -float(np.sum(logp * mask)),
        "the loss is the NEGATIVE log-likelihood": -want,
        "averaged per response, not per real token": -float(np.mean(np.sum(logp * mask, axis=1) / mask.sum(axis=1))),
    }, "masked_nll")
    close(got, want, "masked_nll on fresh demonstrations", rtol=1e-4, atol=1e-5)
    grad = student.grad("masked_nll", 0, Jax(logp), Jax(mask))
    close(grad, np.asarray(jax.grad(sq.masked_nll)(logp, mask)), "gradient of masked_nll w.r.t. token_logp",
          rtol=1e-4, atol=1e-6, hint="padding positions must get zero gradient; use jax.numpy operations")
    close(student.call("masked_nll", f64(logp), f64(mask)), want, "masked_nll on the same inputs as NumPy float64",
          rtol=1e-4, atol=1e-5)
    # one demonstration of one real token, large junk on its padding
    _, one = one_token_batch(rng)
    lp1 = np.where(one > 0, -float(rng.uniform(0.1, 3.0)), rng.choice([-1e4, 1e4], size=one.shape)).astype(np.float32)
    close(student.call("masked_nll", Jax(lp1), Jax(one)), -float(lp1[0, 0]),
          "masked_nll of one demonstration with one real token (junk of +-1e4 on its padding)", rtol=1e-4,
          atol=1e-5, hint="padding must not count, whatever numbers sit there")


@register("test_seq_sequence_logprob", task="sequence_logprob", needs=("sequence_logprob",), forbid=ALL,
          assignment=A, notebook=NB1)
def seq_sequence_logprob(student, rng, ref):
    """log pi(y) per response on fresh inputs with junk log-probs on padding."""
    from rlhf_lab import sequences as sq

    tokens, mask, _ = fresh_responses(rng, 7)
    logp = _garbage(rng, mask, -rng.uniform(0.05, 3.0, size=mask.shape))
    got = student.call("sequence_logprob", Jax(logp), Jax(mask))
    want = np.asarray(sq.sequence_logprob(logp, mask))
    diagnose(got, want, lambda: {
        "summed over padding too: only real tokens (mask 1) belong to the response": logp.sum(axis=1),
        "averaged instead of summed: log pi(y) is the SUM of the token log-probs": want / mask.sum(axis=1),
    }, "sequence_logprob")
    close(got, want, "sequence_logprob on fresh responses", rtol=1e-4, atol=1e-5)
    close(student.call("sequence_logprob", f64(logp), f64(mask)), want,
          "sequence_logprob on the same inputs as NumPy float64", rtol=1e-4, atol=1e-5)
    close(student.call("sequence_logprob", Jax(logp[2:3]), Jax(mask[2:3])), want[2:3],
          "sequence_logprob of a batch of one response (shape (1,))", rtol=1e-4, atol=1e-5,
          hint="sum over the last axis only; keep the batch axis")


@register("test_seq_preference_loss", task="preference_loss", needs=("preference_loss",), forbid=ALL,
          assignment=A, notebook=NB1)
def seq_preference_loss(student, rng, ref):
    """Bradley-Terry loss of fresh response pairs, including margins large enough to underflow a sigmoid."""
    import jax
    from rlhf_lab import sequences as sq

    n = int(rng.integers(5, 12))
    chosen = rng.normal(scale=2.0, size=n).astype(np.float32)
    rejected = rng.normal(scale=2.0, size=n).astype(np.float32)
    rejected[0] = chosen[0] + 120.0  # a margin of -120: log(sigmoid) underflows to -inf
    got = student.call("preference_loss", Jax(chosen), Jax(rejected))
    want = float(sq.preference_loss(chosen, rejected))
    margin = chosen.astype(np.float64) - rejected
    diagnose(got, want, lambda: {
        "the margin has the wrong sign: the loss must FALL as the chosen response outscores the rejected one":
            float(np.mean(np.logaddexp(0.0, margin))),
        "summed over pairs: average it": float(np.sum(np.logaddexp(0.0, -margin))),
        "you returned the log-likelihood; the loss is its negative": -want,
    }, "preference_loss")
    close(got, want, "preference_loss on fresh pairs (one margin of -120)", rtol=1e-4, atol=1e-4,
          hint="softplus(-margin) stays finite where -log(sigmoid(margin)) overflows")
    close(student.grad("preference_loss", 0, Jax(chosen), Jax(rejected)),
          np.asarray(jax.grad(sq.preference_loss)(chosen, rejected)), "gradient w.r.t. chosen_score",
          rtol=1e-4, atol=1e-6)
    tie = np.full(1, float(rng.normal()), np.float32)
    close(student.call("preference_loss", Jax(tie), Jax(tie)), float(np.log(2.0)),
          "preference_loss of one pair with equal scores (margin 0: log 2)", rtol=1e-5, atol=1e-6)
    close(student.call("preference_loss", f64(chosen[1:]), f64(rejected[1:])),
          float(np.mean(np.logaddexp(0.0, -margin[1:]))), "preference_loss on NumPy float64 scores",
          rtol=1e-4, atol=1e-5)


# ------------------------------------------------------------------------------------------------
# 02: per-token rewards, GAE, whitening, clipped losses


def _reward_inputs(rng, batch=8):
    tokens, mask, lengths = fresh_responses(rng, batch)
    logp = np.where(mask > 0, -rng.uniform(0.1, 2.5, size=mask.shape), 0.0).astype(np.float32)
    ref_logp = np.where(mask > 0, logp + rng.normal(scale=0.5, size=mask.shape), 0.0).astype(np.float32)
    score = rng.normal(scale=1.5, size=batch).astype(np.float32)
    beta = float(rng.uniform(0.05, 0.5))
    return logp, ref_logp, score, mask, lengths, beta


def _reward_mistakes(logp, ref_logp, score, mask, lengths, beta):
    b = mask.shape[0]
    kl = -beta * (logp - ref_logp) * mask
    last = np.zeros_like(mask)
    last[np.arange(b), lengths - 1] = 1.0
    final_col = np.zeros_like(mask)
    final_col[:, -1] = 1.0
    first_pad = np.zeros_like(mask)
    first_pad[np.arange(b)[lengths < T], lengths[lengths < T]] = 1.0
    s = score[:, None]
    return {
        "score put on a padding position (the last column T-1): it belongs on the last REAL token "
        "(the EOS, or the last token of a truncated response)": kl + s * final_col,
        "score put on a padding position (the first one after the response): it belongs on the last "
        "REAL token, index sum(mask) - 1": kl + s * first_pad + s * last * (lengths[:, None] == T),
        "the score is added to every token; it belongs on the last real token only": kl + s * mask,
        "the KL penalty has the wrong sign: r_t = -beta (log pi - log pi_ref) + score on the last token":
            -kl + s * last,
        "the KL penalty is missing (identically 0): measured against the old policy? It must use ref_logp":
            s * last,
        "the KL penalty is not masked: padding positions must get reward 0": -beta * (logp - ref_logp) + s * last,
        "the KL penalty is not multiplied by beta": kl / beta + s * last,
    }


@register("test_seq_rewards_score_position", task="per_token_rewards", needs=("per_token_rewards",), forbid=ALL,
          assignment=A, notebook=NB2)
def seq_rewards_score_position(student, rng, ref):
    """Fresh responses (EOS only, truncated, random), zero KL: only where the score lands matters."""
    from rlhf_lab import sequences as sq

    logp, _, score, mask, lengths, beta = _reward_inputs(rng)
    got = student.call("per_token_rewards", Jax(logp), Jax(logp), Jax(score), Jax(mask), beta)
    want = np.asarray(sq.per_token_rewards(logp, logp, score, mask, beta))
    diagnose(got, want, lambda: _reward_mistakes(logp, logp, score, mask, lengths, beta), "per_token_rewards")
    close(got, want, "per-token rewards with logp = ref_logp (all of the reward is the score)", rtol=1e-4,
          atol=1e-5, hint="the score sits on index sum(mask) - 1 of each response")


@register("test_seq_rewards_kl", task="per_token_rewards", needs=("per_token_rewards",), forbid=ALL,
          assignment=A, notebook=NB2)
def seq_rewards_kl(student, rng, ref):
    """Fresh policy and reference log-probs: the KL-shaped part, its sign and beta, the sum over a response."""
    from rlhf_lab import sequences as sq

    logp, ref_logp, score, mask, lengths, beta = _reward_inputs(rng)
    got = student.call("per_token_rewards", Jax(logp), Jax(ref_logp), Jax(score), Jax(mask), beta)
    want = np.asarray(sq.per_token_rewards(logp, ref_logp, score, mask, beta))
    diagnose(got, want, lambda: _reward_mistakes(logp, ref_logp, score, mask, lengths, beta), "per_token_rewards")
    close(got, want, "per-token rewards on fresh log-probs", rtol=1e-4, atol=1e-5)
    # junk log-probs on padding: the penalty must be masked, not rely on zeros there
    logp_j, ref_j = _garbage(rng, mask, logp), _garbage(rng, mask, ref_logp)
    got = student.call("per_token_rewards", Jax(logp_j), Jax(ref_j), Jax(score), Jax(mask), beta)
    diagnose(got, want, lambda: _reward_mistakes(logp_j, ref_j, score, mask, lengths, beta), "per_token_rewards")
    close(got, want, "per-token rewards with junk log-probs on padding (padding must get reward 0)", rtol=1e-4,
          atol=1e-5, hint="multiply the KL penalty by the mask")
    # batches of one response: EOS alone, and a truncated one
    for row, what in ((0, "EOS alone"), (1, "truncated, no EOS")):
        one = slice(row, row + 1)
        close(student.call("per_token_rewards", Jax(logp_j[one]), Jax(ref_j[one]), Jax(score[one]), Jax(mask[one]),
                           beta), want[one], f"per-token rewards of a batch of one response ({what})", rtol=1e-4,
              atol=1e-5, hint="the score sits on index sum(mask) - 1 of each response")


def _gae_inputs(rng, batch=8):
    tokens, mask, lengths = fresh_responses(rng, batch)
    rewards = np.where(mask > 0, rng.normal(size=mask.shape), 0.0).astype(np.float32)
    values = _garbage(rng, mask, rng.normal(size=mask.shape))  # junk on padding: must not bootstrap from it
    return rewards, values, mask


def _np_gae(rewards, values, mask, gamma, lam, mask_values=True):
    v = values * mask if mask_values else values
    b, t = rewards.shape
    adv = np.zeros((b, t))
    nxt = np.zeros(b)
    for k in reversed(range(t)):
        nm = mask[:, k + 1] if k + 1 < t else np.zeros(b)
        nv = v[:, k + 1] if k + 1 < t else np.zeros(b)
        if not mask_values:
            nm = np.ones(b) if k + 1 < t else np.zeros(b)
        delta = rewards[:, k] + gamma * nv * nm - v[:, k]
        nxt = (delta + gamma * lam * nm * nxt) * mask[:, k]
        adv[:, k] = nxt
    return adv, (adv + values * mask) * mask


def _gae_check(student, rewards, values, mask, gamma, lam, what):
    from rlhf_lab import sequences as sq

    got = student.call("gae", Jax(rewards), Jax(values), Jax(mask), gamma, lam)
    adv, ret = (np.asarray(x) for x in sq.gae(rewards, values, mask, gamma, lam))
    check(isinstance(got, (tuple, list)) and len(got) == 2, "gae must return the pair (advantages, returns)")
    wrong_adv, _ = _np_gae(rewards, values, mask, gamma, lam, mask_values=False)
    diagnose(got[0], adv, lambda: {
        "bootstrapped from a padding position: after the last real token V = 0 (the response ended); "
        "mask the values and the next-step mask": wrong_adv,
        "gamma and lambda swapped": _np_gae(rewards, values, mask, lam, gamma)[0],
        "lambda ignored (one-step TD errors)": _np_gae(rewards, values, mask, gamma, 0.0)[0],
    }, "gae")
    close(got[0], adv, f"advantages ({what})", rtol=1e-4, atol=1e-5)
    diagnose(got[1], ret, lambda: {"returns must be advantages + values (the critic's target)": adv,
                                   "returns must be 0 on padding": adv + values}, "gae")
    close(got[1], ret, f"returns ({what})", rtol=1e-4, atol=1e-5)


@register("test_seq_gae", task="gae", needs=("gae",), forbid=ALL, assignment=A, notebook=NB2)
def seq_gae(student, rng, ref):
    """GAE on fresh rewards and values (junk values on padding), fresh gamma and lambda."""
    rewards, values, mask = _gae_inputs(rng)
    gamma, lam = float(rng.uniform(0.8, 1.0)), float(rng.uniform(0.3, 0.97))
    _gae_check(student, rewards, values, mask, gamma, lam, f"gamma {gamma:.3f}, lambda {lam:.3f}")


@register("test_seq_gae_edges", task="gae", needs=("gae",), forbid=ALL, assignment=A, notebook=NB2)
def seq_gae_edges(student, rng, ref):
    """lambda = 0 (one-step TD errors), lambda = 1 with gamma = 1 (return-to-go minus V), a response of length 1."""
    rewards, values, mask = _gae_inputs(rng)
    _gae_check(student, rewards, values, mask, 1.0, 0.0, "lambda = 0: A_t = r_t + V_{t+1} - V_t")
    _gae_check(student, rewards, values, mask, 1.0, 1.0, "lambda = 1, gamma = 1: A_t = sum_{u>=t} r_u - V_t")
    got = student.call("gae", Jax(rewards[:1]), Jax(values[:1]), Jax(mask[:1]), 1.0, 0.95)
    check(isinstance(got, (tuple, list)) and len(got) == 2, "gae must return the pair (advantages, returns)")
    want = np.zeros((1, T), np.float32)
    want[0, 0] = rewards[0, 0] - values[0, 0]
    close(got[0], want, "advantages of a response of length 1 (EOS only): r_0 - V_0, then zeros", rtol=1e-4,
          atol=1e-5, hint="nothing follows the last real token: no bootstrap from padding")
    _gae_check(student, rewards[1:2], values[1:2], mask[1:2], 1.0, 1.0,
               "one truncated response, lambda = gamma = 1: A_t = sum_{u>=t} r_u - V_t, no bootstrap after T")
    _gae_check(student, rewards, values, mask, 0.0, 0.9, "gamma = 0: A_t = r_t - V_t")
    _gae_check(student, f64(rewards), f64(values), f64(mask), 0.9, 0.8,
               "gamma 0.9, lambda 0.8, expected values in float64")


@register("test_seq_whiten", task="whiten", needs=("whiten",), forbid=ALL, assignment=A, notebook=NB2)
def seq_whiten(student, rng, ref):
    """Whitening over the real tokens of fresh advantages; padding stays 0."""
    from rlhf_lab import sequences as sq

    _, mask, _ = fresh_responses(rng, 8)
    shift = float(rng.uniform(1.0, 3.0))
    adv = np.where(mask > 0, rng.normal(loc=shift, size=mask.shape), 0.0).astype(np.float32)
    got = student.call("whiten", Jax(adv), Jax(mask))
    want = np.asarray(sq.whiten(adv, mask))

    def wrong():
        mu, sd = adv.mean(), adv.std()
        mu_r = _mmean(adv, mask)
        sd_r = np.sqrt(_mmean((adv - mu_r) ** 2, mask))
        return {
            "advantages whitened over padding: mean and std must be taken over real tokens only "
            "(the zeros on padding drag the mean and shrink the spread)": (adv - mu) / sd * mask,
            "advantages whitened over padding, and padding left non-zero": (adv - mu) / sd,
            "padding must stay 0 after whitening (multiply by the mask)": (adv - mu_r) / sd_r,
            "only the mean was removed: divide by the standard deviation too": (adv - mu_r) * mask,
        }

    diagnose(got, want, wrong, "whiten", atol=1e-4)
    close(got, want, "whitened advantages", rtol=1e-3, atol=1e-4)
    # junk on padding: it must enter neither the mean nor the spread, and padding comes back 0
    adv_j = _garbage(rng, mask, adv)
    got = student.call("whiten", Jax(adv_j), Jax(mask))
    diagnose(got, want, lambda: {
        "padding entered the mean or the variance (they are only right when padding holds zeros): take "
        "sum(A m) / sum(m), not sum(A) / sum(m)": (adv_j - np.sum(adv_j) / mask.sum())
        / np.sqrt(np.sum((adv_j - np.sum(adv_j) / mask.sum()) ** 2 * mask) / mask.sum() + 1e-8) * mask,
    }, "whiten", atol=1e-4)
    close(got, want, "whitened advantages with junk on padding", rtol=1e-3, atol=1e-4,
          hint="mask the advantages before summing them")
    # zero variance: every real advantage equal (a power of two, so its mean is exact in any order)
    flat = np.where(mask > 0, float(rng.choice([-1.0, 1.0])) * 2.0 ** int(rng.integers(-2, 3)), 0.0)
    close(student.call("whiten", Jax(flat.astype(np.float32)), Jax(mask)), np.zeros_like(mask),
          "whitened advantages that are all equal (variance 0): every entry 0", rtol=0.0, atol=1e-6,
          hint="keep the 1e-8 under the square root: without it 0 / 0 is NaN")
    _, one = one_token_batch(rng)
    close(student.call("whiten", Jax(np.where(one > 0, adv[:1], 0.0).astype(np.float32)), Jax(one)),
          np.zeros_like(one), "whitened advantages of one real token (variance 0): 0", rtol=0.0, atol=1e-6,
          hint="keep the 1e-8 under the square root")


def _loss_inputs(rng, batch=8):
    _, mask, _ = fresh_responses(rng, batch)
    old = np.where(mask > 0, -rng.uniform(0.2, 2.0, size=mask.shape), 0.0).astype(np.float32)
    logp = (old + np.where(mask > 0, rng.normal(scale=0.35, size=mask.shape), rng.normal(scale=2.0, size=mask.shape)))
    adv = _garbage(rng, mask, rng.normal(size=mask.shape))
    return logp.astype(np.float32), old, adv, mask


@register("test_seq_policy_loss", task="policy_loss", needs=("policy_loss",), forbid=ALL, assignment=A, notebook=NB2)
def seq_policy_loss(student, rng, ref):
    """Clipped policy loss over real tokens (junk on padding), value and gradient; old log-probs detached."""
    import jax
    from rlhf_lab import sequences as sq

    logp, old, adv, mask = _loss_inputs(rng)
    eps = float(rng.uniform(0.1, 0.3))
    got = student.call("policy_loss", Jax(logp), Jax(old), Jax(adv), Jax(mask), eps)
    want = float(sq.policy_loss(logp, old, adv, mask, eps))

    def wrong():
        ratio = np.exp(logp.astype(np.float64) - old)
        clipped = np.clip(ratio, 1 - eps, 1 + eps)
        terms = np.minimum(ratio * adv, clipped * adv)
        return {
            "averaged over padding too: the mean runs over real tokens only": -float(np.mean(terms * mask)),
            "padding entered the loss (junk on padding positions must not count)": -float(np.mean(terms)),
            "ratio clipped but the signed min was dropped: take the min of the PRODUCTS rho*A and clip(rho)*A":
                -_mmean(np.minimum(ratio, clipped) * adv, mask),
            "the ratio is not clipped": -_mmean(ratio * adv, mask),
            "the loss is MINUS the clipped surrogate": -want,
        }

    diagnose(got, want, wrong, "policy_loss")
    close(got, want, f"policy_loss (epsilon {eps:.3f})", rtol=1e-4, atol=1e-5)
    g = student.grad("policy_loss", (0, 1), Jax(logp), Jax(old), Jax(adv), Jax(mask), eps)
    check(isinstance(g, (tuple, list)) and len(g) == 2, "policy_loss: jax.grad over (logp, old_logp) failed")
    close(g[0], np.asarray(jax.grad(sq.policy_loss)(logp, old, adv, mask, eps)), "gradient w.r.t. logp",
          rtol=1e-4, atol=1e-6)
    close(g[1], np.zeros_like(old), "gradient w.r.t. old_logp", rtol=0.0, atol=0.0,
          hint="old_logp belongs to the behaviour policy: wrap it in stop_gradient")
    # junk old log-probs on padding too
    old_j = _garbage(rng, mask, old)
    close(student.call("policy_loss", Jax(logp), Jax(old_j), Jax(adv), Jax(mask), eps), want,
          "policy_loss with junk old log-probs on padding", rtol=1e-4, atol=1e-5,
          hint="padding must not count, whatever numbers sit there")
    # every advantage 0 (a batch whose scores carry no signal): loss 0 and no gradient
    zero = np.zeros_like(adv)
    close(student.call("policy_loss", Jax(logp), Jax(old), Jax(zero), Jax(mask), eps), 0.0,
          "policy_loss with every advantage 0: the loss is 0", rtol=0.0, atol=1e-6,
          hint="use the advantages as given (they are whitened before the loss, not inside it)")
    # one response of one real token
    _, one = one_token_batch(rng)
    lp1, old1, adv1 = (np.where(one > 0, x[:1], 0.0).astype(np.float32) for x in (logp, old, adv))
    close(student.call("policy_loss", Jax(lp1), Jax(old1), Jax(adv1), Jax(one), eps),
          float(sq.policy_loss(lp1, old1, adv1, one, eps)), "policy_loss of one response of one real token",
          rtol=1e-4, atol=1e-5)


@register("test_seq_value_loss", task="value_loss", needs=("value_loss",), forbid=ALL, assignment=A, notebook=NB2)
def seq_value_loss(student, rng, ref):
    """Clipped value loss over real tokens on fresh values and returns (junk on padding)."""
    from rlhf_lab import sequences as sq

    _, mask, _ = fresh_responses(rng, 8)
    old_v = _garbage(rng, mask, rng.normal(size=mask.shape))
    values = _garbage(rng, mask, old_v + rng.normal(scale=0.4, size=mask.shape))
    returns = _garbage(rng, mask, rng.normal(size=mask.shape))
    clip = float(rng.uniform(0.1, 0.3))
    got = student.call("value_loss", Jax(values), Jax(old_v), Jax(returns), Jax(mask), clip)
    want = float(sq.value_loss(values, old_v, returns, mask, clip))

    def wrong():
        vc = old_v + np.clip(values - old_v, -clip, clip)
        worst = np.maximum((values - returns) ** 2, (vc - returns) ** 2)
        return {
            "the value loss is taken on padding: average over real tokens only": 0.5 * float(np.mean(worst)),
            "the value loss is taken on padding (zeros counted in the mean)": 0.5 * float(np.mean(worst * mask)),
            "the value clip is missing: use max((v - R)^2, (v_clip - R)^2)": 0.5 * _mmean((values - returns) ** 2, mask),
            "min instead of max: the clipped value loss keeps the LARGER of the two errors":
                0.5 * _mmean(np.minimum((values - returns) ** 2, (vc - returns) ** 2), mask),
            "the factor 0.5 is missing": _mmean(worst, mask),
        }

    diagnose(got, want, wrong, "value_loss")
    close(got, want, f"value_loss (value clip {clip:.3f})", rtol=1e-4, atol=1e-5)
    close(student.call("value_loss", f64(values), f64(old_v), f64(returns), f64(mask), clip), want,
          "value_loss on NumPy float64 inputs", rtol=1e-4, atol=1e-5)
    _, one = one_token_batch(rng)
    args1 = [_garbage(rng, one, np.full((1, T), x[0, 0], np.float32)) for x in (values, old_v, returns)]
    close(student.call("value_loss", *(Jax(a) for a in args1), Jax(one), clip),
          float(sq.value_loss(*args1, one, clip)), "value_loss of one response of one real token (junk on padding)",
          rtol=1e-4, atol=1e-5)


# ------------------------------------------------------------------------------------------------
# 03: the loop's pieces with the library, estimators, over-optimisation, contrasts


def _params(seed, hidden=8):
    """A random policy network of the default language, as a dict of NumPy arrays."""
    import jax
    from rlhf_lab import sequences as sq

    lang = sq.DEFAULT_LANGUAGE
    p = sq.init_policy(jax.random.key(seed), lang.n_features, lang.n_actions, hidden=hidden)
    return {k: np.asarray(v) * 3.0 for k, v in p.items()}  # larger weights: a policy far from uniform


@register("test_seq_batch_rewards", task="batch_rewards", needs=("batch_rewards",), forbid=(),
          assignment=A, notebook=NB3)
def seq_batch_rewards(student, rng, ref):
    """Per-token rewards of a fresh batch from two fresh networks: KL against the reference, EOS kept."""
    from rlhf_lab import sequences as sq

    lang = sq.DEFAULT_LANGUAGE
    tokens, mask, lengths = fresh_responses(rng, 8)
    prompts = rng.integers(0, lang.n_prompts, size=8).astype(np.int32)
    policy, reference = _params(int(rng.integers(0, 2**31 - 1))), _params(int(rng.integers(0, 2**31 - 1)))
    score = rng.normal(size=8).astype(np.float32)
    beta = float(rng.uniform(0.05, 0.5))
    got = student.call("batch_rewards", policy, reference, Jax(prompts), Jax(tokens), Jax(score), beta)
    feats = sq.context_features(lang, prompts, tokens)
    m = sq.response_mask(tokens, EOS, PAD)
    logp = np.asarray(sq.token_logp(policy, feats, tokens) * m)
    ref_logp = np.asarray(sq.token_logp(reference, feats, tokens) * m)
    want = np.asarray(sq.per_token_rewards(logp, ref_logp, score, mask, beta))
    eos_masked = ((tokens != EOS) & (tokens != PAD)).astype(np.float32)
    diagnose(got, want, lambda: {
        "KL measured against the old policy (the policy's own log-probs): the penalty must compare the "
        "sampling policy with the frozen REFERENCE network": np.asarray(sq.per_token_rewards(logp, logp, score, mask, beta)),
        "EOS itself is masked (tokens != eos): EOS is a real token, only PAD is padding":
            np.asarray(sq.per_token_rewards(logp * eos_masked, ref_logp * eos_masked, score, eos_masked, beta)),
        **_reward_mistakes(logp, ref_logp, score, mask, lengths, beta),
    }, "batch_rewards")
    close(got, want, "batch_rewards on a fresh batch", rtol=1e-4, atol=1e-5)
    # a generator that keeps sampling after EOS: the tokens after the first EOS are not PAD
    junk = junk_after_eos(rng, tokens, mask)
    got = student.call("batch_rewards", policy, reference, Jax(prompts), Jax(junk), Jax(score), beta)
    feats_j = sq.context_features(lang, prompts, junk)
    logp_j = np.asarray(sq.token_logp(policy, feats_j, junk)) * mask
    ref_j = np.asarray(sq.token_logp(reference, feats_j, junk)) * mask
    want_j = np.asarray(sq.per_token_rewards(logp_j, ref_j, score, mask, beta))
    not_pad = (junk != PAD).astype(np.float32)
    diagnose(got, want_j, lambda: {
        "the mask counts the tokens after the first EOS (tokens != PAD): build it with "
        "response_mask(tokens, EOS, PAD), which ends each response at its first EOS":
            np.asarray(sq.per_token_rewards(np.asarray(sq.token_logp(policy, feats_j, junk)) * not_pad,
                                            np.asarray(sq.token_logp(reference, feats_j, junk)) * not_pad,
                                            score, not_pad, beta)),
    }, "batch_rewards")
    close(got, want_j, "batch_rewards on a batch with content tokens and EOS after each response's first EOS",
          rtol=1e-4, atol=1e-5, hint="a response ends at its first EOS: use response_mask(tokens, EOS, PAD)")


#: The trusted reference for ppo_epochs (and the classic mistake, for the message).
def _epochs(params, prompts, tokens, old_logp, advantages, epsilon, lr, epochs, recompute=False, mask=None):
    import jax
    from rlhf_lab import sequences as sq

    lang = sq.DEFAULT_LANGUAGE
    mask = sq.response_mask(tokens, EOS, PAD) if mask is None else mask
    feats = sq.context_features(lang, prompts, tokens)
    params = {k: jax.numpy.asarray(v) for k, v in params.items()}
    for _ in range(epochs):
        old = sq.token_logp(params, feats, tokens) * mask if recompute else old_logp

        def loss(p, old=old):
            return sq.policy_loss(sq.token_logp(p, feats, tokens), old, advantages, mask, epsilon)

        g = jax.grad(loss)(params)
        params = {k: params[k] - lr * g[k] for k in params}
    return {k: np.asarray(v) for k, v in params.items()}


@register("test_seq_ppo_epochs", task="ppo_epochs", needs=("ppo_epochs",), forbid=(), assignment=A,
          notebook=NB3)
def seq_ppo_epochs(student, rng, ref):
    """Several epochs on one fresh batch: old log-probs frozen at collection, the ratio moves off 1."""
    from rlhf_lab import sequences as sq

    lang = sq.DEFAULT_LANGUAGE
    tokens, mask, _ = fresh_responses(rng, 8)
    prompts = rng.integers(0, lang.n_prompts, size=8).astype(np.int32)
    params = _params(int(rng.integers(0, 2**31 - 1)))
    feats = sq.context_features(lang, prompts, tokens)
    old = np.asarray(sq.token_logp(params, feats, tokens) * sq.response_mask(tokens, EOS, PAD))
    adv = np.where(mask > 0, rng.normal(size=mask.shape), 0.0).astype(np.float32)
    eps, lr, epochs = float(rng.uniform(0.1, 0.25)), float(rng.uniform(0.5, 1.0)), 4
    got = student.call("ppo_epochs", params, Jax(prompts), Jax(tokens), Jax(old), Jax(adv), eps, lr, epochs)
    check(isinstance(got, dict) and sorted(got) == sorted(params),
          f"ppo_epochs must return the parameter dict with keys {sorted(params)}")
    want = _epochs(params, prompts, tokens, old, adv, eps, lr, epochs)
    wrong = _epochs(params, prompts, tokens, old, adv, eps, lr, epochs, recompute=True)
    one = _epochs(params, prompts, tokens, old, adv, eps, lr, 1)
    for k in sorted(params):
        diagnose(got[k], want[k], lambda k=k: {
            "old log-probs recomputed during the epochs: the ratio is then 1 at every step and clipping "
            "never acts; use the old_logp frozen when the batch was collected": wrong[k],
            "only one gradient step: run `epochs` passes over the batch": one[k],
            "no update: the parameters came back unchanged": params[k],
        }, "ppo_epochs")
        close(got[k], want[k], f"parameter {k!r} after {epochs} epochs", rtol=1e-3, atol=1e-4)
    # three responses followed by non-PAD tokens after their first EOS, two epochs
    junk = junk_after_eos(rng, tokens[:3], mask[:3])
    old_j = np.asarray(sq.token_logp(params, sq.context_features(lang, prompts[:3], junk), junk)) * mask[:3]
    got = student.call("ppo_epochs", params, Jax(prompts[:3]), Jax(junk), Jax(old_j), Jax(adv[:3]), eps, lr, 2)
    check(isinstance(got, dict) and sorted(got) == sorted(params),
          f"ppo_epochs must return the parameter dict with keys {sorted(params)}")
    want = _epochs(params, prompts[:3], junk, old_j, adv[:3], eps, lr, 2)
    for k in sorted(params):
        diagnose(got[k], want[k], lambda k=k: {
            "the mask counts the tokens after the first EOS (tokens != PAD): a response ends at its first "
            "EOS; build the mask with response_mask(tokens, EOS, PAD)":
                _epochs(params, prompts[:3], junk, old_j, adv[:3], eps, lr, 2,
                        mask=(junk != PAD).astype(np.float32))[k],
        }, "ppo_epochs")
        close(got[k], want[k], f"parameter {k!r} after 2 epochs on responses with tokens after their EOS",
              rtol=1e-3, atol=1e-4, hint="a response ends at its first EOS: use response_mask(tokens, EOS, PAD)")
    # every advantage 0: nothing to learn, the parameters come back unchanged
    got = student.call("ppo_epochs", params, Jax(prompts), Jax(tokens), Jax(old), Jax(np.zeros_like(adv)), eps, lr, 2)
    check(isinstance(got, dict) and sorted(got) == sorted(params),
          f"ppo_epochs must return the parameter dict with keys {sorted(params)}")
    for k in sorted(params):
        close(got[k], params[k], f"parameter {k!r} after 2 epochs with every advantage 0 (must be unchanged)",
              rtol=1e-5, atol=1e-6, hint="use the advantages as given (no normalisation inside the epochs)")


@register("test_seq_kl_estimators", task="kl_estimators", needs=("kl_estimators",),
          forbid=("k1", "k2", "k3", "expected_estimates"), assignment=A, notebook=NB3)
def seq_kl_estimators(student, rng, ref):
    """k1, k2, k3 on fresh log-probs; their exact expectations under pi (E k1 = E k3 = KL) on a fresh token."""
    import jax
    from rlhf_lab import sequences as sq

    logp = -rng.uniform(0.05, 3.0, size=10).astype(np.float32)
    ref_logp = (logp + rng.normal(scale=0.8, size=10)).astype(np.float32)
    got = student.call("kl_estimators", Jax(logp), Jax(ref_logp))
    for name, fn in (("k1", sq.k1), ("k2", sq.k2), ("k3", sq.k3)):
        want = np.asarray(fn(logp, ref_logp))
        r = ref_logp.astype(np.float64) - logp
        diagnose(field(got, name, "kl_estimators"), want, lambda: {
            "k1 has the wrong sign: k1 = log pi - log pi_ref": r,
            "k3 uses the ratio the wrong way round: with r = log pi_ref - log pi, k3 = (e^r - 1) - r": np.expm1(-r) + r,
            "k2 is half the SQUARED log-ratio": 0.5 * np.abs(r),
            "k2 is missing its factor 1/2": r**2,
        }, f"kl_estimators[{name!r}]")
        close(field(got, name, "kl_estimators"), want, f"{name} on fresh log-probs", rtol=1e-4, atol=1e-5)
    # exact expectations over one next-token distribution, weighted by pi
    logits = rng.normal(size=6).astype(np.float32)
    ref6 = np.asarray(jax.nn.log_softmax(logits + rng.normal(scale=0.7, size=6)))
    lp6 = np.asarray(jax.nn.log_softmax(logits))
    parts = student.call("kl_estimators", Jax(lp6), Jax(ref6))
    p = np.exp(lp6.astype(np.float64))
    exp = sq.expected_estimates(logits, ref6)
    for name in ("k1", "k3"):
        close(float(np.sum(p * np.asarray(field(parts, name, "kl_estimators"), np.float64))), exp["kl"],
              f"E_pi[{name}] over all 6 actions (must equal the exact KL(pi || pi_ref))", rtol=1e-4, atol=1e-5)
    # identical log-probs: every estimator is 0; far from the reference; [B, T] arrays
    same = student.call("kl_estimators", Jax(logp), Jax(logp))
    for name in ("k1", "k2", "k3"):
        close(field(same, name, "kl_estimators"), np.zeros_like(logp), f"{name} when pi = pi_ref (must be 0)",
              rtol=0.0, atol=1e-6)
    grid = (-rng.uniform(0.05, 3.0, size=(3, 4))).astype(np.float32)
    far = (grid + rng.choice([-1.0, 1.0], size=grid.shape) * rng.uniform(3.0, 6.0, size=grid.shape)).astype(np.float32)
    got = student.call("kl_estimators", Jax(grid), Jax(far))
    for name, fn in (("k1", sq.k1), ("k2", sq.k2), ("k3", sq.k3)):
        close(field(got, name, "kl_estimators"), np.asarray(fn(f64(grid), f64(far)), np.float64),
              f"{name} on a [3, 4] array far from the reference (|log-ratio| 3 to 6 nats)",
              rtol=1e-4, atol=1e-5, hint="elementwise: the result has the shape of logp")


@register("test_seq_overopt_fit", task="fit_overoptimisation", needs=("fit_overoptimisation",), forbid=(),
          assignment=A, notebook=NB3)
def seq_overopt_fit(student, rng, ref):
    """Least-squares fit of gold gain = alpha d - b d^2 with d = sqrt(KL), on fresh noisy curves."""
    n = int(rng.integers(6, 12))
    kl = np.sort(rng.uniform(0.01, 9.0, size=n))
    d = np.sqrt(kl)
    alpha, b = float(rng.uniform(0.5, 2.0)), float(rng.uniform(0.1, 0.6))
    gain = alpha * d - b * d**2 + rng.normal(scale=0.05, size=n)
    got = student.call("fit_overoptimisation", kl, gain)
    design = np.stack([d, -d**2], axis=1)
    want = np.linalg.lstsq(design, gain, rcond=None)[0]
    diagnose(got, want, lambda: {
        "fitted against KL, not d = sqrt(KL): the curve is gain = alpha d - b d^2 in d = sqrt(KL)":
            np.linalg.lstsq(np.stack([kl, -kl**2], axis=1), gain, rcond=None)[0],
        "b has the wrong sign: return (alpha, b) for gain = alpha d - b d^2":
            want * np.array([1.0, -1.0]),
        "an intercept was fitted (np.polyfit(d, gain, 2) fits c + alpha d - b d^2): the model has no "
        "intercept, the gain is 0 at the reference":
            np.linalg.lstsq(np.stack([d, -d**2, np.ones_like(d)], axis=1), gain, rcond=None)[0][:2],
    }, "fit_overoptimisation", atol=1e-4)
    close(got, want, "(alpha, b) of the least-squares fit", rtol=1e-3, atol=1e-4,
          hint="least squares without an intercept: the gain is 0 at the reference (d = 0)")
    # three exact points of the curve, one at the reference (KL 0): the fit recovers (alpha, b) exactly
    kl2 = np.array([0.0, float(rng.uniform(1.0, 4.0)), float(rng.uniform(5.0, 9.0))])
    exact = alpha * np.sqrt(kl2) - b * kl2
    close(student.call("fit_overoptimisation", kl2, exact), np.array([alpha, b]),
          "(alpha, b) fitted to three exact points of a curve, one at the reference (KL 0)", rtol=1e-4, atol=1e-5)


def group_advantages64(scores) -> np.ndarray:
    """GRPO advantages of :func:`rlhf_lab.sequences.group_advantages` computed in float64.

    The same rule (a group whose population std is at most ``CONSTANT_GROUP_RTOL`` of its largest
    ``|score|`` is constant and gets exactly 0), evaluated in float64 so that the expected values do
    not carry the float32 rounding of the mean that a student's answer may round differently.
    """
    from rlhf_lab.sequences.contrasts import CONSTANT_GROUP_RTOL

    s = np.asarray(scores, np.float64)
    mu = s.mean(axis=1, keepdims=True)
    sd = s.std(axis=1, keepdims=True)
    constant = sd <= CONSTANT_GROUP_RTOL * np.abs(s).max(axis=1, keepdims=True)
    return np.where(constant, 0.0, (s - mu) / (sd + 1e-6))


@register("test_seq_group_advantages", task="group_advantages", needs=("group_advantages",), forbid=ALL,
          assignment=A, notebook=NB3)
def seq_group_advantages(student, rng, ref):
    """GRPO advantages on fresh groups; row 0 has equal scores and must get exactly 0.

    The equal scores of row 0 are a power of two (+-1/4 ... +-4): K copies of it sum exactly in any
    order and precision and their mean is exact however it is divided, so every correct answer,
    the literal formula in float32 as well as one with the constant-group rule, gives exactly 0
    there. (For a general float32 value the mean of K copies is often one ulp off, which the
    literal formula divides by ``0 + 1e-6``.)
    """
    g, k = int(rng.integers(3, 6)), int(rng.integers(4, 9))
    scores = rng.normal(scale=2.0, size=(g, k)).astype(np.float32)
    scores[0] = float(rng.choice([-1.0, 1.0])) * 2.0 ** int(rng.integers(-2, 3))
    got = student.call("group_advantages", Jax(scores))
    want = group_advantages64(scores)
    check(bool(np.all(want[0] == 0.0)), "grader self-check (a constant group)")
    wide = scores.astype(np.float64)
    diagnose(got, want, lambda: {
        "normalised over the whole batch: GRPO normalises within each group (one prompt per row)":
            (wide - wide.mean()) / (wide.std() + 1e-6),
        "only the group mean was removed: divide by the group's std (+ 1e-6)":
            wide - wide.mean(axis=1, keepdims=True),
    }, "group_advantages", atol=1e-4)
    got_rows = to_float(got, "group advantages")
    check(got_rows.shape == want.shape, f"group_advantages must return one advantage per score, shape "
                                        f"{want.shape}, got shape {got_rows.shape}")
    # a correct answer gives exactly 0 here in any precision; compared with 0, not with a rounded reference
    close(got_rows[0], want[0], f"row 0 (all {k} scores equal {float(scores[0, 0]):g}): every advantage must "
          "be 0", rtol=0.0, atol=1e-6,
          hint="a group whose scores are all equal has std 0 and every score equals the mean: "
               "(s - mean) / (std + 1e-6) is 0 there (keep the + 1e-6, 0 / 0 is NaN)")
    close(got_rows[1:], want[1:], "group advantages of the other rows", rtol=1e-3, atol=1e-4)
    # near-constant groups (population std exactly 1% of the level: real signal, 100x above the
    # constant-group rule), groups of one response, one group
    level = float(rng.uniform(1.0, 4.0)) * float(rng.choice([-1.0, 1.0]))
    z = rng.normal(size=(2, k))
    z = (z - z.mean(axis=1, keepdims=True)) / z.std(axis=1, keepdims=True)
    near = (level + abs(level) * 1e-2 * z).astype(np.float32)
    got = student.call("group_advantages", Jax(near))
    want = group_advantages64(near)
    near64 = near.astype(np.float64)
    diagnose(got, want, lambda: {
        "the 1e-6 went under the square root: A = (s - mean) / (std + 1e-6), the std of the group itself":
            (near64 - near64.mean(axis=1, keepdims=True)) / np.sqrt(near64.var(axis=1, keepdims=True) + 1e-6),
    }, "group_advantages", atol=1e-4)
    close(got, want, "group advantages of two near-constant groups (scores differ by about 1%: the advantages "
          "are still about +-1)", rtol=1e-3, atol=1e-4, hint="(s - mean) / (std + 1e-6) with the population std")
    close(student.call("group_advantages", Jax(scores[:, :1])), np.zeros((g, 1)),
          "group advantages of groups of one response each (each is its own mean: 0)", rtol=0.0, atol=1e-6)
    close(student.call("group_advantages", Jax(scores[1:2])), group_advantages64(scores[1:2]),
          "group advantages of one group (shape [1, K])", rtol=1e-3, atol=1e-4)


def rloo_advantages64(rewards) -> np.ndarray:
    """RLOO advantages ``r_ij - (sum_k r_ik - r_ij) / (K - 1)`` in float64."""
    r = np.asarray(rewards, np.float64)
    return r - (r.sum(axis=1, keepdims=True) - r) / (r.shape[1] - 1)


@register("test_seq_rloo_advantages", task="rloo_advantages", needs=("rloo_advantages",), forbid=ALL,
          assignment=A, notebook=NB3)
def seq_rloo_advantages(student, rng, ref):
    """RLOO advantages on fresh groups: each reward minus the mean of the other rewards of its row.

    Row 0 holds equal rewards (a power of two, so every order of summation is exact) and must get
    0; then groups of two (each advantage is the difference of the pair), one group as NumPy float64
    and groups whose rewards share a large common offset (the baseline must remove it).
    """
    g, k = int(rng.integers(3, 6)), int(rng.integers(3, 9))
    rewards = rng.normal(scale=2.0, size=(g, k)).astype(np.float32)
    rewards[0] = float(rng.choice([-1.0, 1.0])) * 2.0 ** int(rng.integers(-2, 3))
    got = student.call("rloo_advantages", Jax(rewards))
    want = rloo_advantages64(rewards)
    wide = rewards.astype(np.float64)
    centred = wide - wide.mean(axis=1, keepdims=True)
    diagnose(got, want, lambda: {
        "the baseline includes the response itself (r - mean of the whole group): leave it out, "
        "r_ij - (sum of the row - r_ij) / (K - 1), which is K / (K - 1) times r - mean":
            centred,
        "the sum of the other rewards was divided by K: there are K - 1 other responses":
            wide - (wide.sum(axis=1, keepdims=True) - wide) / k,
        "the advantages were divided by the group's std (GRPO): RLOO only subtracts the leave-one-out mean":
            group_advantages64(rewards),
        "the baseline is the mean of the whole batch: each row is one prompt's group":
            wide - (wide.sum() - wide) / (wide.size - 1),
        "the sign is reversed: the advantage is the reward minus the baseline": -want,
    }, "rloo_advantages", atol=1e-4)
    got_rows = to_float(got, "rloo advantages")
    check(got_rows.shape == want.shape, f"rloo_advantages must return one advantage per reward, shape "
                                        f"{want.shape}, got shape {got_rows.shape}")
    close(got_rows[0], want[0], f"row 0 (all {k} rewards equal {float(rewards[0, 0]):g}): every advantage must be 0",
          rtol=0.0, atol=1e-6)
    close(got_rows[1:], want[1:], "rloo advantages of the other rows", rtol=1e-4, atol=1e-5,
          hint="A_ij = r_ij - (sum_k r_ik - r_ij) / (K - 1), row by row")
    pairs = rng.normal(size=(3, 2)).astype(np.float32)
    close(student.call("rloo_advantages", Jax(pairs)), rloo_advantages64(pairs),
          "rloo advantages of groups of two (each response's baseline is the other one)", rtol=1e-4, atol=1e-5)
    close(student.call("rloo_advantages", f64(rewards[1:2])), rloo_advantages64(rewards[1:2]),
          "rloo advantages of one group given as NumPy float64", rtol=1e-4, atol=1e-5)
    offset = (float(rng.uniform(5.0, 20.0)) * float(rng.choice([-1.0, 1.0])) + rewards[1:]).astype(np.float32)
    close(student.call("rloo_advantages", Jax(offset)), rloo_advantages64(offset),
          "rloo advantages of rewards shifted by a common constant (the same advantages as without it)",
          rtol=1e-3, atol=1e-4)


def _length_inputs(rng, n_prompts: int | None = None):
    """``(score [P, R], length [R], ref_logp [P, R])`` float32: lengths 0 ... 6 with every value varied."""
    p = int(rng.integers(2, 5)) if n_prompts is None else n_prompts
    r = int(rng.integers(7, 13))
    length = rng.integers(0, T + 1, size=r).astype(np.float32)
    length[:2] = 0.0, float(T)  # never constant
    score = (rng.normal(size=(p, r)) + float(rng.uniform(-1.0, 1.0)) * length).astype(np.float32)
    logits = rng.normal(scale=1.5, size=(p, r))
    ref_logp = (logits - np.log(np.exp(logits).sum(axis=1, keepdims=True))).astype(np.float32)
    return score, length, ref_logp


def _length_wrong(score, length, ref_logp, weights="ref", centre="prompt", pooled=True, subtract_mean=True):
    """The length-normalised score computed the way a classic mistake computes it (float64)."""
    s = np.asarray(score, np.float64)
    lengths = np.broadcast_to(np.asarray(length, np.float64), s.shape)
    lp = np.asarray(ref_logp, np.float64)
    w = {"ref": np.exp(lp), "uniform": np.full(s.shape, 1.0 / s.shape[1]), "logp": lp}[weights]
    if centre == "prompt":
        ms = np.sum(w * s, axis=1, keepdims=True) / np.sum(w, axis=1, keepdims=True)
        ml = np.sum(w * lengths, axis=1, keepdims=True) / np.sum(w, axis=1, keepdims=True)
    else:
        ms = np.sum(w * s) / np.sum(w)
        ml = np.sum(w * lengths) / np.sum(w)
    num = w * (s - ms) * (lengths - ml)
    den = w * (lengths - ml) ** 2
    c = (np.sum(num, axis=1, keepdims=True) / np.sum(den, axis=1, keepdims=True) if not pooled
         else np.sum(num) / np.sum(den))
    return s - c * (lengths - ml) if subtract_mean else s - c * lengths


@register("test_seq_length_normalised_score", task="length_normalised_score", needs=("length_normalised_score",),
          forbid=ALL, assignment=A, notebook=NB3)
def seq_length_normalised_score(student, rng, ref):
    """The score with its reference length slope removed, on fresh tables; then one prompt, NumPy
    float64 inputs, and a score exactly linear in length.

    A length that never varies is not among the inputs: its denominator is 0 only in exact
    arithmetic (float32 weights sum to 1 within rounding, so ``L - E_ref[L]`` is rounding noise and a
    correct answer's slope depends on how it rounds); the statement promises lengths that vary.
    """
    from rlhf_lab.sequences import length_bias as lb

    score, length, ref_logp = _length_inputs(rng)
    got = student.call("length_normalised_score", Jax(score), Jax(length), Jax(ref_logp))
    want = lb.length_normalised_score(score, length, ref_logp)
    diagnose(got, want, lambda: {
        "the slope weighs every response equally: weight each by its reference probability exp(ref_logp)":
            _length_wrong(score, length, ref_logp, weights="uniform"),
        "the log-probabilities were used as weights: the weights are exp(ref_logp)":
            _length_wrong(score, length, ref_logp, weights="logp"),
        "one slope per prompt: the statement asks one slope for the task (pooled over prompts, a reward "
        "model has one length weight)":
            _length_wrong(score, length, ref_logp, pooled=False),
        "the score and the length were centred on means over all prompts: centre each prompt on its own "
        "reference means E_ref[s | p] and E_ref[L | p]":
            _length_wrong(score, length, ref_logp, centre="all"),
        "c * L was subtracted: subtract c * (L - E_ref[L | p]), which keeps each prompt's mean score":
            _length_wrong(score, length, ref_logp, subtract_mean=False),
        "the score was divided by the length: the normalised score subtracts the part the length explains":
            score.astype(np.float64) / np.maximum(length.astype(np.float64), 1.0),
    }, "length_normalised_score", atol=1e-4)
    out = to_float(got, "the length-normalised score")
    check(out.shape == want.shape, f"length_normalised_score must return one score per response, shape "
                                   f"{want.shape}, got shape {out.shape}")
    close(out, want, "the length-normalised score", rtol=1e-4, atol=1e-4,
          hint="c = sum_p sum_r pi_ref (s - E_ref[s|p]) (L - E_ref[L|p]) / sum_p sum_r pi_ref (L - E_ref[L|p])^2, "
               "then s - c (L - E_ref[L|p])")
    one = _length_inputs(rng, n_prompts=1)
    close(student.call("length_normalised_score", *(Jax(x) for x in one)), lb.length_normalised_score(*one),
          "the length-normalised score of one prompt", rtol=1e-4, atol=1e-4)
    s2, l2, r2 = _length_inputs(rng)
    close(student.call("length_normalised_score", f64(s2), f64(l2), f64(r2)), lb.length_normalised_score(s2, l2, r2),
          "the length-normalised score of NumPy float64 inputs", rtol=1e-4, atol=1e-4)
    level = rng.normal(size=(score.shape[0], 1))
    linear = (level + float(rng.uniform(0.5, 2.0)) * length[None, :]).astype(np.float32)
    close(student.call("length_normalised_score", Jax(linear), Jax(length), Jax(ref_logp)),
          lb.length_normalised_score(linear, length, ref_logp),
          "a score that is exactly a + c * length in every prompt (each prompt's score becomes its reference mean)",
          rtol=1e-4, atol=1e-4)


@register("test_seq_dpo_loss", task="dpo_loss", needs=("dpo_loss",), forbid=ALL, assignment=A, notebook=NB3)
def seq_dpo_loss(student, rng, ref):
    """DPO loss on fresh sequence log-probs: value and gradient w.r.t. the chosen log-probs."""
    import jax
    from rlhf_lab import sequences as sq

    n = int(rng.integers(5, 10))
    args = [(-rng.uniform(1.0, 8.0, size=n)).astype(np.float32) for _ in range(4)]
    beta = float(rng.uniform(0.05, 0.5))
    got = student.call("dpo_loss", *(Jax(a) for a in args), beta)
    want = float(sq.dpo_loss(*args, beta))
    c, r, rc, rr = (a.astype(np.float64) for a in args)
    diagnose(got, want, lambda: {
        "the reference log-probs enter with the wrong sign: margin = (log pi_c - log pi_ref_c) - (log pi_r - log pi_ref_r)":
            float(np.mean(np.logaddexp(0.0, -beta * ((c + rc) - (r + rr))))),
        "beta is missing from the margin": float(np.mean(np.logaddexp(0.0, -((c - rc) - (r - rr))))),
        "the margin has the wrong sign": float(np.mean(np.logaddexp(0.0, beta * ((c - rc) - (r - rr))))),
    }, "dpo_loss")
    close(got, want, "dpo_loss on fresh pairs", rtol=1e-4, atol=1e-5)
    # one pair at margin 0 (log 2), and a pair so badly ranked that -log(sigmoid) overflows in float32
    tie = [a[:1] for a in args]
    tie[1], tie[3] = tie[0] + 0.5, tie[2] + 0.5
    close(student.call("dpo_loss", *(Jax(a) for a in tie), beta), float(np.log(2.0)),
          "dpo_loss of one pair whose margin is 0 (log 2)", rtol=1e-5, atol=1e-6)
    bad = [a[:2].copy() for a in args]
    bad[0][0] = bad[2][0] + bad[1][0] - bad[3][0] - 120.0 / beta  # beta * margin = -120
    close(student.call("dpo_loss", *(Jax(a) for a in bad), beta), float(sq.dpo_loss(*bad, beta)),
          "dpo_loss with one pair at beta * margin = -120", rtol=1e-4, atol=1e-4,
          hint="softplus(-beta * margin) stays finite where -log(sigmoid(beta * margin)) overflows")
    close(student.grad("dpo_loss", 0, *(Jax(a) for a in args), beta),
          np.asarray(jax.grad(sq.dpo_loss)(*args, beta)), "gradient w.r.t. logp_chosen", rtol=1e-4, atol=1e-6)
