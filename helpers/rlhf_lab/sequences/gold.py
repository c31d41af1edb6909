"""The hidden gold reward: four readable terms, per prompt.

For a response ``y`` to prompt ``p`` with ``c`` copies of the prompt's target token, ``n_bad``
occurrences of the prompt's forbidden bigram, ``L`` content tokens (EOS not counted) and
``e = 1`` if it ended with EOS::

    gold(p, y) =  target_weight * (c - c**2 / (2 * target_peak))       target: diminishing returns,
                                                                        best at c = target_peak,
                                                                        penalised when repeated more
                - bigram_penalty * n_bad                                forbidden bigram (x_p, y_p)
                - length_weight * |L - preferred_length_p|              preferred length
                - eos_penalty * (1 - e)                                 missing EOS (truncated)

With ``target_peak = 2``: ``c = 0, 1, 2, 3, 4, 5, 6`` score ``0, .75, 1, .75, 0, -1.25, -3`` (times
``target_weight``). The proxy reward model (:mod:`.preferences`) sees token counts, length and EOS
but not order and not curvature: it cannot see the bigram, nor that a third copy of the target hurts.
Which of these matters is a question for :func:`gold_terms`: under the exact optimum ``pi*_beta`` of
the default task the bigram term improves monotonically as beta falls (it is about 0 once the
responses fill up with the target, which never takes part in the bigram); the gold reward's fall
past its peak comes from the target term (copies beyond ``target_peak``) and the length term, and the
largest part of its rise up to the peak from the missing-EOS term.
"""
from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from .. import checks
from .language import Language, check_language, prefix_tree


class GoldReward(NamedTuple):
    """Parameters of the hidden gold reward (``[P]`` arrays are per prompt)."""

    target: np.ndarray  # [P] int: the target token of each prompt
    bigram_first: np.ndarray  # [P] int: forbidden bigram (first, second) of each prompt
    bigram_second: np.ndarray  # [P] int
    preferred_length: np.ndarray  # [P] float: preferred number of content tokens
    target_weight: float = 1.0
    target_peak: float = 2.0
    bigram_penalty: float = 1.0
    length_weight: float = 0.3
    eos_penalty: float = 1.0


def make_gold(lang: Language, target, bigram_first, bigram_second, preferred_length, target_weight=1.0,
              target_peak=2.0, bigram_penalty=1.0, length_weight=0.3, eos_penalty=1.0) -> GoldReward:
    """Validated :class:`GoldReward` (token ids in ``[0, n_tokens)``, weights >= 0, peak > 0)."""
    lang = check_language(lang)
    arrays = {}
    for name, val in (("target", target), ("bigram_first", bigram_first), ("bigram_second", bigram_second)):
        arr = np.asarray(val)
        if arr.shape != (lang.n_prompts,) or not np.issubdtype(arr.dtype, np.integer):
            raise ValueError(f"{name} must be {lang.n_prompts} integer token ids (one per prompt), got {val!r}")
        if arr.min() < 0 or arr.max() >= lang.n_tokens:
            raise ValueError(f"{name} must hold content-token ids in [0, {lang.n_tokens - 1}], got {arr}")
        arrays[name] = arr.astype(np.int32)
    pl = checks.finite_vector("preferred_length", preferred_length, size=lang.n_prompts)
    if pl.min() < 0 or pl.max() > lang.max_len:
        raise ValueError(f"preferred_length must lie in [0, {lang.max_len}], got {pl}")
    weights = {}
    for name, val in (("target_weight", target_weight), ("bigram_penalty", bigram_penalty),
                      ("length_weight", length_weight), ("eos_penalty", eos_penalty)):
        w = checks.finite_scalar(name, val)
        if w < 0:
            raise ValueError(f"{name} must be >= 0, got {w}")
        weights[name] = w
    peak = checks.finite_scalar("target_peak", target_peak)
    if peak <= 0:
        raise ValueError(f"target_peak must be > 0, got {peak}")
    return GoldReward(preferred_length=pl.astype(np.float32), target_peak=peak, **arrays, **weights)


def random_gold(lang: Language, seed: int) -> GoldReward:
    """A fresh gold reward: random target token, forbidden bigram and preferred length per prompt.

    The bigram never involves the prompt's target (so its two lessons stay separate) and the
    preferred length is drawn from ``[2, max_len - 2]`` (clipped into ``[1, max_len - 1]``).
    """
    lang = check_language(lang)
    seed = checks.positive_int("seed", seed, minimum=0)
    rng = np.random.default_rng([seed, 101])
    P, V = lang.n_prompts, lang.n_tokens
    target = rng.integers(0, V, size=P)
    first, second = np.zeros(P, np.int64), np.zeros(P, np.int64)
    for p in range(P):
        others = [v for v in range(V) if v != target[p]]
        pair = rng.choice(others, size=2, replace=len(others) < 2)
        first[p], second[p] = pair
    lo, hi = min(2, lang.max_len - 1), max(min(2, lang.max_len - 1), lang.max_len - 2)
    lengths = rng.integers(lo, hi + 1, size=P).astype(np.float64)
    lengths = np.clip(lengths, min(1, lang.max_len - 1), max(lang.max_len - 1, 1))
    return make_gold(lang, target, first, second, lengths)


def bigram_counts(tokens: jax.Array, mask: jax.Array, first: jax.Array, second: jax.Array) -> jax.Array:
    """Number of positions ``t`` with ``y_t = first`` and ``y_{t+1} = second``, both real tokens.

    Args:
      tokens: ``[B, T]``; mask: ``[B, T]``; first, second: ``[B]`` token ids. Returns ``[B]`` float.
    """
    hit = (tokens[:, :-1] == first[:, None]) & (tokens[:, 1:] == second[:, None])
    both = (mask[:, :-1] > 0) & (mask[:, 1:] > 0)
    return jnp.sum(hit & both, axis=1).astype(jnp.float32)


def response_stats(tokens: jax.Array, mask: jax.Array, n_tokens: int, eos: int):
    """``(counts [B, n_tokens], length [B], has_eos [B])`` of padded responses (real tokens only)."""
    real = mask > 0
    counts = jnp.sum(jax.nn.one_hot(jnp.where(real, tokens, n_tokens), n_tokens), axis=1)
    length = jnp.sum(counts, axis=1)
    has_eos = jnp.any(real & (tokens == eos), axis=1).astype(jnp.float32)
    return counts, length, has_eos


def gold_terms(gold: GoldReward, lang: Language, prompts, tokens, mask) -> dict:
    """The four gold terms of each response (see the module docstring), each ``[B]`` float32.

    Args:
      prompts: ``[B]`` prompt ids; tokens: ``[B, T]`` PAD-padded responses; mask: ``[B, T]``.

    Returns:
      ``{"target", "bigram", "length", "missing_eos"}``; :func:`gold_reward` is their sum.
    """
    prompts = jnp.asarray(prompts)
    tokens = jnp.asarray(tokens)
    mask = jnp.asarray(mask)
    counts, length, has_eos = response_stats(tokens, mask, lang.n_tokens, lang.eos)
    target = jnp.asarray(gold.target)[prompts]
    c = jnp.take_along_axis(counts, target[:, None], axis=1)[:, 0]
    n_bad = bigram_counts(tokens, mask, jnp.asarray(gold.bigram_first)[prompts], jnp.asarray(gold.bigram_second)[prompts])
    pref = jnp.asarray(gold.preferred_length)[prompts]
    return {
        "target": gold.target_weight * (c - c**2 / (2.0 * gold.target_peak)),
        "bigram": -gold.bigram_penalty * n_bad,
        "length": -gold.length_weight * jnp.abs(length - pref),
        "missing_eos": -gold.eos_penalty * (1.0 - has_eos),
    }


def gold_reward(gold: GoldReward, lang: Language, prompts, tokens, mask) -> jax.Array:
    """Gold reward of each response, ``[B]`` float32 (sum of :func:`gold_terms`)."""
    terms = gold_terms(gold, lang, prompts, tokens, mask)
    return terms["target"] + terms["bigram"] + terms["length"] + terms["missing_eos"]


def gold_table(gold: GoldReward, lang: Language) -> np.ndarray:
    """Gold reward of every enumerated response of every prompt, ``[n_prompts, n_responses]``.

    NumPy over the cached tree statistics (a second implementation of :func:`gold_reward`).
    """
    lang = check_language(lang)
    tree = prefix_tree(lang)
    toks, mask = tree.response_tokens, tree.response_mask > 0
    rows = []
    for p in range(lang.n_prompts):
        c = tree.counts[:, gold.target[p]].astype(np.float64)
        hit = (toks[:, :-1] == gold.bigram_first[p]) & (toks[:, 1:] == gold.bigram_second[p]) & mask[:, :-1] & mask[:, 1:]
        rows.append(gold.target_weight * (c - c**2 / (2.0 * gold.target_peak))
                    - gold.bigram_penalty * hit.sum(axis=1)
                    - gold.length_weight * np.abs(tree.length - gold.preferred_length[p])
                    - gold.eos_penalty * (1.0 - tree.has_eos))
    return np.stack(rows).astype(np.float32)
