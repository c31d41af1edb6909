"""Preference data and the deliberately limited proxy reward model.

1. Pairs of responses are drawn independently from the reference policy (exactly, from the
   enumerated response distribution of the prompt).
2. Each pair is labelled by a Bradley-Terry draw on the hidden gold reward:
   ``P(a preferred to b) = sigmoid((gold(a) - gold(b)) / temperature)``.
3. A linear proxy is fitted to the labels by minimising :func:`preference_loss`. Its features are
   per-prompt token counts, the length and has-EOS, nothing else: it cannot see token order (the
   forbidden bigram) and it is linear in the counts and the length (it cannot see that too many
   copies of the target hurt, nor that the gold reward has a preferred length). Optimising it hard
   therefore eventually lowers the gold reward; on the default task that fall comes from the
   target and length terms, while the bigram term keeps improving (see :func:`.gold.gold_terms`).
4. The proxy is shifted and scaled to mean 0 and standard deviation 1 under the reference
   (prompts uniform), exactly, by enumeration.
"""
from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax

from .. import checks
from .gold import response_stats
from .language import Language, check_language, prefix_tree


def preference_loss(chosen_score: jax.Array, rejected_score: jax.Array) -> jax.Array:
    """Bradley-Terry negative log-likelihood of pairwise preferences.

    ``L = mean_i -log sigmoid(r(chosen_i) - r(rejected_i)) = mean_i softplus(-(r_c - r_r))``

    Args:
      chosen_score, rejected_score: ``[n]`` scores of the preferred and the dispreferred response
        of each pair under the reward model being fitted (a zero margin costs ``log 2``).

    Returns:
      Scalar loss. Mistake it avoids: ``sigmoid`` then ``log`` (underflows for large margins).
    """
    return jnp.mean(jax.nn.softplus(-(chosen_score - rejected_score)))


def proxy_features(lang: Language, prompts, counts, length, has_eos) -> jax.Array:
    """What the proxy sees: ``[one_hot(prompt) ⊗ counts | length | has_eos]``, ``[B, P*n_tokens + 2]``."""
    prompts = jnp.asarray(prompts)
    per_prompt = jax.nn.one_hot(prompts, lang.n_prompts)[:, :, None] * jnp.asarray(counts)[:, None, :]
    return jnp.concatenate([
        per_prompt.reshape(prompts.shape[0], -1),
        jnp.asarray(length, jnp.float32)[:, None],
        jnp.asarray(has_eos, jnp.float32)[:, None],
    ], axis=1)


def n_proxy_features(lang: Language) -> int:
    """Width of :func:`proxy_features`."""
    return lang.n_prompts * lang.n_tokens + 2


class ProxyReward(NamedTuple):
    """A frozen linear proxy ``r(y) = phi(y) . weights + bias`` (already normalised)."""

    weights: jax.Array  # [P * n_tokens + 2]
    bias: jax.Array  # []
    raw_weights: jax.Array  # the fitted weights before normalisation
    loss_history: jax.Array  # [steps] preference loss during the fit
    accuracy: float  # fraction of training pairs ranked like their label


def proxy_reward(proxy: ProxyReward, lang: Language, prompts, tokens, mask) -> jax.Array:
    """Proxy score of padded responses, ``[B]`` (reward model frozen)."""
    counts, length, has_eos = response_stats(jnp.asarray(tokens), jnp.asarray(mask), lang.n_tokens, lang.eos)
    return proxy_features(lang, prompts, counts, length, has_eos) @ proxy.weights + proxy.bias


@functools.lru_cache(maxsize=8)
def table_features(lang: Language) -> np.ndarray:
    """Proxy features of every enumerated response of every prompt, ``[P, R, n_proxy_features]`` (NumPy)."""
    tree = prefix_tree(lang)
    P, V = lang.n_prompts, lang.n_tokens
    R = tree.counts.shape[0]
    out = np.zeros((P, R, n_proxy_features(lang)), np.float32)
    for p in range(P):
        out[p, :, p * V:(p + 1) * V] = tree.counts
    out[:, :, -2] = tree.length
    out[:, :, -1] = tree.has_eos
    out.flags.writeable = False
    return out


class Pairs(NamedTuple):
    """Preference pairs: indices into the enumerated responses of each pair's prompt."""

    prompts: np.ndarray  # [n]
    chosen: np.ndarray  # [n] response index of the preferred response
    rejected: np.ndarray  # [n] response index of the other one
    gold_chosen: np.ndarray  # [n]
    gold_rejected: np.ndarray  # [n]


def sample_pairs(lang: Language, ref_resp_logp, gold_table, n_pairs: int, seed: int,
                 temperature: float = 1.0) -> Pairs:
    """Draw ``n_pairs`` pairs from the reference and label them with Bradley-Terry on the gold reward.

    Args:
      ref_resp_logp: ``[P, R]`` exact reference log-probs of every response.
      gold_table: ``[P, R]`` gold reward of every response.
      n_pairs: number of pairs (prompts cycle); seed: for the draws; temperature: BT temperature > 0.
    """
    lang = check_language(lang)
    n_pairs = checks.positive_int("n_pairs", n_pairs)
    seed = checks.positive_int("seed", seed, minimum=0)
    temperature = checks.finite_scalar("temperature", temperature)
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    rng = np.random.default_rng([seed, 404])
    probs = np.exp(np.asarray(ref_resp_logp, np.float64))
    probs /= probs.sum(axis=1, keepdims=True)
    gold = np.asarray(gold_table)
    prompts = (np.arange(n_pairs) % lang.n_prompts).astype(np.int32)
    a = np.zeros(n_pairs, np.int64)
    b = np.zeros(n_pairs, np.int64)
    for p in range(lang.n_prompts):
        sel = prompts == p
        a[sel] = rng.choice(probs.shape[1], size=sel.sum(), p=probs[p])
        b[sel] = rng.choice(probs.shape[1], size=sel.sum(), p=probs[p])
    ga, gb = gold[prompts, a], gold[prompts, b]
    p_a = 1.0 / (1.0 + np.exp(-(ga - gb) / temperature))
    a_wins = rng.random(n_pairs) < p_a
    chosen = np.where(a_wins, a, b)
    rejected = np.where(a_wins, b, a)
    return Pairs(prompts, chosen.astype(np.int32), rejected.astype(np.int32),
                 gold[prompts, chosen].astype(np.float32), gold[prompts, rejected].astype(np.float32))


@functools.lru_cache(maxsize=None)
def _make_fit(steps: int):
    def fit(fc, fr, lr, l2):
        opt = optax.adam(lr)
        w0 = jnp.zeros(fc.shape[1], jnp.float32)

        def loss_fn(w):
            return preference_loss(fc @ w, fr @ w) + l2 * jnp.sum(w**2)

        def step(carry, _):
            w, s = carry
            loss, g = jax.value_and_grad(loss_fn)(w)
            upd, s = opt.update(g, s, w)
            return (optax.apply_updates(w, upd), s), loss

        (w, _), losses = jax.lax.scan(step, (w0, opt.init(w0)), None, length=steps)
        return w, losses

    return jax.jit(fit)


def fit_proxy(lang: Language, pairs: Pairs, ref_resp_logp, steps: int = 400, learning_rate: float = 0.05,
              l2: float = 1e-3) -> ProxyReward:
    """Fit the linear proxy to ``pairs`` (Adam on :func:`preference_loss` + ``l2 |w|^2``), then normalise.

    Normalisation: with ``raw(y) = phi(y) . w``, ``mu = mean_p E_ref[raw]`` and
    ``sigma^2 = mean_p E_ref[(raw - mu)^2]`` (exact sums), the frozen proxy is ``(raw - mu) / sigma``.
    """
    lang = check_language(lang)
    steps = checks.positive_int("steps", steps)
    lr = checks.learning_rate(learning_rate)
    l2 = checks.finite_scalar("l2", l2)
    if l2 < 0:
        raise ValueError(f"l2 must be >= 0, got {l2}")
    feats = table_features(lang)
    fc = feats[pairs.prompts, pairs.chosen]
    fr = feats[pairs.prompts, pairs.rejected]
    w, losses = _make_fit(steps)(jnp.asarray(fc), jnp.asarray(fr), jnp.float32(lr), jnp.float32(l2))
    w = np.asarray(w, np.float64)
    raw = feats.astype(np.float64) @ w  # [P, R]
    probs = np.exp(np.asarray(ref_resp_logp, np.float64))
    probs /= probs.sum(axis=1, keepdims=True)
    mu = float(np.mean(np.sum(probs * raw, axis=1)))
    var = float(np.mean(np.sum(probs * (raw - mu) ** 2, axis=1)))
    if not var > 1e-12:
        raise ValueError("the fitted proxy is constant under the reference (no usable preference signal)")
    sigma = np.sqrt(var)
    accuracy = float(np.mean((fc @ w) > (fr @ w)))
    return ProxyReward(jnp.asarray(w / sigma, jnp.float32), jnp.float32(-mu / sigma), jnp.asarray(w, jnp.float32),
                       losses, accuracy)
