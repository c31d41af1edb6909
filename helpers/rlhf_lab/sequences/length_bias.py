"""A reward model that pays for length, and the same reward model with its length slope removed.

Reward models trained on human preferences often learn that longer answers win; a policy trained
against them then writes longer answers whether or not they are better. On the tiny language this
is exact: the proxy is linear in token counts, length and EOS (:mod:`.preferences`), so

* :func:`with_length_bonus` adds ``bonus * length`` to the proxy (``length`` = content tokens,
  0 ... ``max_len``): a length-biased reward model, the same for every prompt;
* :func:`length_slope` measures how much a score pays per token under the reference, the pooled
  within-prompt least-squares slope of the score on length;
* :func:`length_normalised_score` removes that part, ``s - c (L - E_ref[L | p])``, so that under the
  reference the score no longer correlates with length (the length control of length-controlled
  win rates);
* :func:`with_length_control` is the task whose reward model has that slope removed, which every
  trainer of the library can use (the slope is a change of the proxy's length weight).

Every function keeps the gold reward as it is: it is the measure of what the bias costs.
"""
from __future__ import annotations

import dataclasses

import jax.numpy as jnp
import numpy as np

from .. import checks
from .language import prefix_tree
from .task import Task, TaskArrays


def _check_task(task) -> Task:
    if not isinstance(task, Task):
        raise ValueError(f"task must be a rlhf_lab.sequences.Task (see make_task), got {type(task).__name__}")
    return task


def response_lengths(task: Task) -> np.ndarray:
    """Content tokens of every enumerated response, ``[R]`` float32 (EOS not counted; 0 ... ``max_len``)."""
    return np.asarray(prefix_tree(_check_task(task).lang).length, np.float32)


def length_slope(score, length, ref_logp) -> float:
    """Pooled within-prompt slope of ``score`` on ``length`` under the reference.

    ``c = sum_p sum_r pi_ref(r|p) (s_pr - m_p)(L_r - l_p) / sum_p sum_r pi_ref(r|p) (L_r - l_p)^2``
    with ``m_p = E_ref[s | p]`` and ``l_p = E_ref[L | p]``: one least-squares slope for the whole task
    (a reward model has one length weight), each prompt centred on its own means, every response
    weighted by its reference probability. 0 when the length never varies (denominator 0).

    Args:
      score: ``[P, R]`` score of every response of every prompt; length: ``[R]`` (or ``[P, R]``);
      ref_logp: ``[P, R]`` reference sequence log-probs (each row sums to 1 in probability).

    Returns:
      The slope, a float (reward units per content token), computed in float64.
    """
    s, lengths, probs = _weighted_inputs(score, length, ref_logp)
    ds = s - np.sum(probs * s, axis=1, keepdims=True)
    dl = lengths - np.sum(probs * lengths, axis=1, keepdims=True)
    den = float(np.sum(probs * dl * dl))
    return 0.0 if den <= 1e-12 * max(float(np.sum(probs * lengths * lengths)), 1.0) else float(np.sum(probs * ds * dl) / den)


def length_normalised_score(score, length, ref_logp) -> np.ndarray:
    """The score with the part its length explains under the reference removed, ``[P, R]`` float64.

    ``s'_pr = s_pr - c (L_r - E_ref[L | p])`` with ``c`` = :func:`length_slope`. Under the reference
    ``s'`` has the same mean as ``s`` in every prompt and no (pooled) covariance with length; a
    response is paid for what it has beyond its length.
    """
    s, lengths, probs = _weighted_inputs(score, length, ref_logp)
    c = length_slope(score, length, ref_logp)
    return s - c * (lengths - np.sum(probs * lengths, axis=1, keepdims=True))


def _weighted_inputs(score, length, ref_logp):
    s = np.asarray(score, np.float64)
    logp = np.asarray(ref_logp, np.float64)
    if s.ndim != 2 or logp.shape != s.shape:
        raise ValueError(f"score and ref_logp must both be [P, R], got shapes {s.shape} and {logp.shape}")
    lengths = np.broadcast_to(np.asarray(length, np.float64), s.shape) if np.ndim(length) in (1, 2) else None
    if lengths is None or np.shape(length)[-1] != s.shape[1]:
        raise ValueError(f"length must be [R] or [P, R] with R = {s.shape[1]}, got shape {np.shape(length)}")
    if not (np.all(np.isfinite(s)) and np.all(np.isfinite(lengths)) and np.all(logp < np.inf)):
        raise ValueError("score, length and ref_logp must be finite (ref_logp may be -inf for probability 0)")
    probs = np.exp(logp - np.max(logp, axis=1, keepdims=True))
    probs /= probs.sum(axis=1, keepdims=True)
    return s, lengths, probs


def _with_length_weight(task: Task, delta: float) -> Task:
    """``task`` with ``delta`` added to the proxy's length weight (proxy and score tables follow)."""
    a = task.arrays
    extra = np.float32(delta) * response_lengths(task)[None, :]
    weights = np.asarray(a.proxy_weights, np.float32).copy()
    weights[-2] += np.float32(delta)  # the length feature (see preferences.proxy_features)
    arrays: TaskArrays = a._replace(proxy_weights=jnp.asarray(weights), proxy=jnp.asarray(a.proxy) + extra,
                                    score=jnp.asarray(a.score) + extra)
    return dataclasses.replace(task, arrays=arrays)


def with_length_bonus(task: Task, bonus: float) -> Task:
    """The task with a length-biased reward model: ``proxy'(y) = proxy(y) + bonus * length(y)``.

    ``bonus`` (reward units per content token, >= 0) is added to the proxy's length weight, so the
    proxy table, the training score and every sampled score pay for length; gold, reference, pairs
    and language are unchanged.
    """
    task = _check_task(task)
    bonus = checks.finite_scalar("bonus", bonus)
    if bonus < 0:
        raise ValueError(f"bonus (reward per content token) must be >= 0, got {bonus}")
    return _with_length_weight(task, bonus)


def with_length_control(task: Task) -> Task:
    """The task whose reward model has its reference length slope removed (:func:`length_normalised_score`).

    The proxy's length weight falls by ``c`` = :func:`length_slope` of the training score; the
    per-prompt constants ``c E_ref[L | p]`` are left out (they change no policy's ranking and no
    advantage). The training score of the result is :func:`length_normalised_score` of ``task``'s
    up to those constants.
    """
    task = _check_task(task)
    a = task.arrays
    c = length_slope(a.score, response_lengths(task), a.ref_resp_logp)
    return _with_length_weight(task, -c)


def length_summary(task: Task, resp_logp) -> dict:
    """Exact mean content length, gold, proxy and KL of a policy given by its sequence log-probs ``[P, R]``."""
    task = _check_task(task)
    a = task.arrays
    logp = np.asarray(resp_logp, np.float64)
    probs = np.exp(logp)
    ref = np.asarray(a.ref_resp_logp, np.float64)
    kl = np.sum(probs * np.where(probs > 0, logp - ref, 0.0), axis=1)
    return {"length": float(np.mean(probs @ response_lengths(task).astype(np.float64))),
            "gold": float(np.mean(np.sum(probs * np.asarray(a.gold, np.float64), axis=1))),
            "proxy": float(np.mean(np.sum(probs * np.asarray(a.proxy, np.float64), axis=1))),
            "kl": float(np.mean(kl))}
