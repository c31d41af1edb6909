"""Reward model: a linear scorer fitted to pairwise preferences, then frozen.

The reward model's lifetime is the whole policy-optimisation run: it is fitted once, before any
policy update, and its per-action scores are treated as constants afterwards.
"""
from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from . import checks

#: Features of the three terminal actions of the lesson's bandit (one row per action).
LESSON_FEATURES = np.array([[1.0, 0.0], [0.0, 1.0], [-1.0, -1.0]], dtype=np.float32)
#: Preference pairs of the lesson: (chosen action, rejected action).
LESSON_CHOSEN = np.array([0, 0, 1])
LESSON_REJECTED = np.array([1, 2, 2])


def preference_loss(w: jax.Array, chosen: jax.Array, rejected: jax.Array) -> jax.Array:
    """Bradley-Terry negative log-likelihood of the preferences.

    ``L(w) = mean_i softplus(-(chosen_i - rejected_i) . w) = -mean_i log sigmoid(margin_i)``

    Args:
      w: reward weights, shape ``[d]`` (the only argument that is trained).
      chosen: features of the preferred responses, shape ``[n, d]``.
      rejected: features of the dispreferred responses, shape ``[n, d]``.

    Returns:
      Scalar mean loss (float32). Zero margin gives ``log 2`` per pair.
    """
    margin = (chosen - rejected) @ w
    return jnp.mean(jax.nn.softplus(-margin))


class FittedReward(NamedTuple):
    """A frozen reward model: weights, per-action rewards and the loss curve of the fit."""

    weights: jax.Array  # [d]
    rewards: jax.Array  # [n_actions], frozen (stop_gradient applied)
    loss_history: jax.Array  # [steps]


def fit_reward(
    features=LESSON_FEATURES,
    chosen_idx=LESSON_CHOSEN,
    rejected_idx=LESSON_REJECTED,
    steps: int = 100,
    learning_rate: float = 0.1,
) -> FittedReward:
    """Fit ``w`` by plain gradient descent on :func:`preference_loss`, then freeze the rewards.

    ``w_{k+1} = w_k - lr * grad L(w_k)``, starting from ``w_0 = 0``; ``rewards = features @ w``.

    Args:
      features: ``[n_actions, d]`` action features.
      chosen_idx, rejected_idx: ``[n_pairs]`` integer action indices of each preference pair.
      steps: number of gradient steps (lesson: 100).
      learning_rate: step size (lesson: 0.1).

    Returns:
      :class:`FittedReward` whose ``rewards`` are held fixed for the rest of the run.
    """
    feats = checks.finite_vector("features", features, ndim=2)
    steps = checks.positive_int("steps", steps)
    lr = checks.learning_rate(learning_rate)
    chosen_idx = np.asarray(chosen_idx)
    rejected_idx = np.asarray(rejected_idx)
    checks.same_shape(("chosen_idx", "rejected_idx"), chosen_idx, rejected_idx)
    n = feats.shape[0]
    for name, idx in (("chosen_idx", chosen_idx), ("rejected_idx", rejected_idx)):
        if idx.ndim != 1 or idx.size == 0 or not np.issubdtype(idx.dtype, np.integer) or idx.min() < 0 or idx.max() >= n:
            raise ValueError(f"{name} must be a non-empty 1-D array of action indices in [0, {n - 1}], got {idx}")
    feats = jnp.asarray(feats, jnp.float32)
    w, losses = _fit(feats, jnp.asarray(chosen_idx), jnp.asarray(rejected_idx), steps, jnp.float32(lr))
    return FittedReward(w, jax.lax.stop_gradient(feats @ w), losses)


@jax.jit
def _loss_and_grad(w, chosen, rejected):
    """``(preference_loss(w), d preference_loss / dw)`` for [pairs, d] ``chosen``/``rejected`` features (compiled once per shape)."""
    return jax.value_and_grad(preference_loss)(w, chosen, rejected)


def _fit(features, chosen_idx, rejected_idx, steps, lr):
    chosen = features[chosen_idx]
    rejected = features[rejected_idx]
    w = jnp.zeros(features.shape[1], jnp.float32)
    losses = []
    for _ in range(steps):
        loss, g = _loss_and_grad(w, chosen, rejected)
        losses.append(loss)
        w = w - lr * g
    return w, jnp.stack(losses)
