"""Supervised fine-tuning: demonstrations from a hidden Markov chain, the reference fitted by
maximum likelihood (masked token log-likelihood), then frozen for the rest of the course.

The hidden chain (per prompt ``p``) draws the first token from ``softmax(start_logits[p])`` and
each next token from ``softmax(trans_logits[p, previous token])`` over the content tokens and EOS;
a response stops at EOS or after ``max_len`` tokens (truncated).
"""
from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax

from .. import checks
from .language import Language, check_language, context_features, masked_nll, response_mask
from .policy import init_policy, policy_logp


class MarkovChain(NamedTuple):
    """The hidden demonstrator: ``start_logits [P, n_actions]``, ``trans_logits [P, n_tokens, n_actions]``."""

    start_logits: np.ndarray
    trans_logits: np.ndarray


def random_chain(lang: Language, seed: int, eos_logit: float = 0.0) -> MarkovChain:
    """A fresh demonstrator: Gaussian logits (std 1.2), EOS shifted by ``eos_logit`` (none at the start)."""
    lang = check_language(lang)
    seed = checks.positive_int("seed", seed, minimum=0)
    eos_logit = checks.finite_scalar("eos_logit", eos_logit)
    rng = np.random.default_rng([seed, 202])
    start = rng.normal(0.0, 1.2, (lang.n_prompts, lang.n_actions))
    trans = rng.normal(0.0, 1.2, (lang.n_prompts, lang.n_tokens, lang.n_actions))
    start[:, lang.eos] = -3.0  # an empty response is possible but rare
    trans[:, :, lang.eos] += eos_logit
    return MarkovChain(start.astype(np.float32), trans.astype(np.float32))


def _softmax(x):
    z = np.exp(x - x.max(axis=-1, keepdims=True))
    return z / z.sum(axis=-1, keepdims=True)


def sample_demonstrations(chain: MarkovChain, lang: Language, n: int, seed: int):
    """Draw ``n`` demonstrations (prompts cycle ``0, 1, ..., P-1, 0, ...``).

    Returns:
      ``(prompts [n], tokens [n, max_len], mask [n, max_len])``; tokens are PAD after the end.
    """
    lang = check_language(lang)
    n = checks.positive_int("n", n)
    seed = checks.positive_int("seed", seed, minimum=0)
    rng = np.random.default_rng([seed, 303])
    prompts = np.arange(n) % lang.n_prompts
    tokens = np.full((n, lang.max_len), lang.pad, np.int32)
    done = np.zeros(n, bool)
    prev = None
    start_p = _softmax(np.asarray(chain.start_logits, np.float64))
    trans_p = _softmax(np.asarray(chain.trans_logits, np.float64))
    for t in range(lang.max_len):
        probs = start_p[prompts] if t == 0 else trans_p[prompts, np.minimum(prev, lang.n_tokens - 1)]
        u = rng.random(n)[:, None]
        tok = (u > np.cumsum(probs, axis=1)).sum(axis=1).clip(0, lang.n_actions - 1)
        tokens[~done, t] = tok[~done]
        done = done | (tok == lang.eos)
        prev = tok
    mask = np.asarray(response_mask(tokens, lang.eos, lang.pad))
    return prompts.astype(np.int32), tokens, mask


def chain_response_logp(chain: MarkovChain, lang: Language, tokens, prompts) -> np.ndarray:
    """Exact ``log P_chain(y | p)`` of PAD-padded responses (NumPy), shape ``[B]``."""
    tokens = np.asarray(tokens)
    prompts = np.asarray(prompts)
    mask = np.asarray(response_mask(tokens, lang.eos, lang.pad))
    start = np.log(_softmax(np.asarray(chain.start_logits, np.float64)))
    trans = np.log(_softmax(np.asarray(chain.trans_logits, np.float64)))
    out = np.zeros(tokens.shape[0])
    for t in range(tokens.shape[1]):
        real = mask[:, t] > 0
        tok = np.clip(tokens[:, t], 0, lang.n_actions - 1)
        if t == 0:
            lp = start[prompts, tok]
        else:
            lp = trans[prompts, np.clip(tokens[:, t - 1], 0, lang.n_tokens - 1), tok]
        out += np.where(real, lp, 0.0)
    return out


class SFTResult(NamedTuple):
    """The fitted (then frozen) reference policy and the loss curve of the fit."""

    params: dict  # reference policy parameters (see rlhf_lab.sequences.policy)
    loss_history: jax.Array  # [steps] masked NLL (nats per real token) before each step


@functools.lru_cache(maxsize=None)
def _make_fit(steps: int):
    def fit(params, features, counts, lr):
        opt = optax.adam(lr)
        total = jnp.sum(counts)

        def loss_fn(p):
            return -jnp.sum(counts * policy_logp(p, features)) / total

        def step(carry, _):
            p, s = carry
            loss, g = jax.value_and_grad(loss_fn)(p)
            upd, s = opt.update(g, s, p)
            return (optax.apply_updates(p, upd), s), loss

        (params, _), losses = jax.lax.scan(step, (params, opt.init(params)), None, length=steps)
        return params, losses

    return jax.jit(fit)


_features_jit = jax.jit(context_features, static_argnums=0)


def demonstration_counts(lang: Language, prompts, tokens, mask):
    """Sufficient statistics of the demonstrations: distinct contexts and action counts.

    The policy sees a prefix only through its features, so
    ``masked_nll = -sum_{c, a} n[c, a] log pi(a | c) / sum n`` where ``c`` runs over the distinct
    feature rows of the real tokens and ``n[c, a]`` counts how often action ``a`` followed ``c``.

    Returns:
      ``(features [K, n_features], counts [K, n_actions])`` as NumPy arrays.
    """
    feats = np.asarray(_features_jit(lang, jnp.asarray(prompts), jnp.asarray(tokens)))
    real = np.asarray(mask) > 0
    rows = feats[real]
    acts = np.asarray(tokens)[real]
    uniq, inverse = np.unique(rows, axis=0, return_inverse=True)
    counts = np.zeros((uniq.shape[0], lang.n_actions), np.float32)
    np.add.at(counts, (inverse.reshape(-1), acts), 1.0)
    return uniq.astype(np.float32), counts


def fit_reference(lang: Language, prompts, tokens, mask, hidden: int = 32, steps: int = 300,
                  learning_rate: float = 0.02, seed: int = 0) -> SFTResult:
    """Maximum likelihood: minimise :func:`~rlhf_lab.sequences.language.masked_nll` with full-batch Adam.

    The loss is evaluated through :func:`demonstration_counts` (the same number, fewer rows).

    Args:
      prompts: ``[N]`` ids; tokens, mask: ``[N, max_len]`` demonstrations (PAD-padded, EOS real).
      hidden: network width; steps: Adam steps; learning_rate: Adam step size; seed: initialisation.

    Returns:
      :class:`SFTResult`; its ``params`` are the reference policy, frozen from here on.
    """
    lang = check_language(lang)
    tokens = np.asarray(tokens)
    mask = checks.finite_vector("mask", mask, ndim=2)
    checks.same_shape(("tokens", "mask"), tokens, mask)
    if tokens.shape[1] != lang.max_len:
        raise ValueError(f"tokens must have max_len={lang.max_len} columns, got shape {tokens.shape}")
    prompts = np.asarray(prompts)
    if prompts.shape != (tokens.shape[0],):
        raise ValueError(f"mismatched shapes: prompts{prompts.shape}, tokens{tokens.shape}")
    if np.any(tokens[mask > 0] >= lang.n_actions) or np.any(tokens < 0):
        raise ValueError(f"tokens must be content ids or EOS ({lang.eos}) on real positions, PAD ({lang.pad}) after")
    steps = checks.positive_int("steps", steps)
    lr = checks.learning_rate(learning_rate)
    seed = checks.positive_int("seed", seed, minimum=0)
    feats, counts = demonstration_counts(lang, prompts, tokens, mask)
    params0 = init_policy(jax.random.key(seed), lang.n_features, lang.n_actions, hidden)
    params, losses = _make_fit(steps)(params0, jnp.asarray(feats), jnp.asarray(counts), jnp.float32(lr))
    return SFTResult(jax.lax.stop_gradient(params), losses)
