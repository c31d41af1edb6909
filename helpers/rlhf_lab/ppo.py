"""The PPO pieces as small pure functions (JAX, float32).

Four objects with four lifetimes appear below; the argument names keep them apart:

* ``logits`` -- the **current** policy's parameters; changes on every optimiser step.
* ``old_logp`` -- log-probabilities of the sampled actions under the **old (behaviour)** policy
  that collected the batch; fixed while that batch is reused, refreshed at the next rollout.
* ``ref_logp`` -- the **reference** policy's full log-probability vector; fixed for the whole run.
* ``rewards`` -- the **frozen reward model's** per-action scores; fixed for the whole run.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp


def clipped_surrogate(ratio: jax.Array, advantage: jax.Array, epsilon: float | jax.Array) -> jax.Array:
    """Per-sample signed clipped surrogate.

    ``term = min(rho * A, clip(rho, 1 - eps, 1 + eps) * A)``

    The minimum is taken *after* multiplying by the advantage, so the sign of ``A`` decides which
    bound can bind: for ``A > 0`` only ``1 + eps`` caps the gain, for ``A < 0`` only ``1 - eps``
    does (and a ratio moving the wrong way is never softened).

    Args:
      ratio: probability ratios ``pi(a) / pi_old(a)``, any shape.
      advantage: advantages, broadcastable to ``ratio``.
      epsilon: clip range, ``0 < eps < 1``.

    Returns:
      Array of surrogate terms with the broadcast shape (to be *maximised*).
    """
    clipped = jnp.clip(ratio, 1.0 - epsilon, 1.0 + epsilon)
    return jnp.minimum(ratio * advantage, clipped * advantage)


def categorical_kl(logp: jax.Array, ref_logp: jax.Array) -> jax.Array:
    """Exact forward KL between two categorical distributions given as log-probabilities.

    ``KL(pi || pi_ref) = sum_a pi(a) * (log pi(a) - log pi_ref(a))``, in nats, summed over the last
    axis. It is >= 0 and exactly 0 when ``logp == ref_logp``.

    Args:
      logp: ``[..., n_actions]`` log-probabilities of the distribution being measured (current policy).
      ref_logp: ``[..., n_actions]`` log-probabilities of the fixed reference.

    Returns:
      ``[...]`` KL in nats.
    """
    return jnp.sum(jnp.exp(logp) * (logp - ref_logp), axis=-1)


def expected_reward(logp: jax.Array, rewards: jax.Array) -> jax.Array:
    """Exact expected reward ``E_pi[r] = sum_a pi(a) r(a)`` over the last axis (no sampling error)."""
    return jnp.sum(jnp.exp(logp) * rewards, axis=-1)


def regularised_objective(logp: jax.Array, rewards: jax.Array, ref_logp: jax.Array, beta) -> jax.Array:
    """KL-regularised objective ``J(pi) = E_pi[r] - beta * KL(pi || pi_ref)``.

    Args:
      logp: ``[..., n]`` policy log-probabilities; rewards: ``[n]`` frozen rewards;
      ref_logp: ``[n]`` reference log-probabilities; beta: KL coefficient > 0.

    Returns:
      ``[...]`` objective values.
    """
    return expected_reward(logp, rewards) - beta * categorical_kl(logp, ref_logp)


def optimal_logp(ref_logp: jax.Array, rewards: jax.Array, beta) -> jax.Array:
    """Analytic maximiser of :func:`regularised_objective` over all categorical policies.

    ``pi*(a) = pi_ref(a) exp(r(a)/beta) / sum_b pi_ref(b) exp(r(b)/beta)``, computed in log space as
    ``log_softmax(ref_logp + r / beta)`` so that a small ``beta`` cannot overflow ``exp``. Its
    objective value equals ``beta * logsumexp(ref_logp + r / beta)``.

    Returns:
      ``[n]`` log-probabilities of the optimum.
    """
    return jax.nn.log_softmax(ref_logp + rewards / beta)


def reward_kl_frontier(ref_logp: jax.Array, rewards: jax.Array, betas) -> tuple[jax.Array, jax.Array]:
    """The exact reward-KL frontier traced by the analytic optimum as ``beta`` varies.

    For each ``beta`` the optimum ``pi*_beta = softmax(ref_logp + r / beta)`` (:func:`optimal_logp`)
    gives one point ``(KL(pi*_beta || pi_ref), E_{pi*_beta}[r])``. By the Lagrangian of
    ``max E_pi[r] subject to KL(pi || pi_ref) <= k``, each point is the largest expected reward any
    policy reaches at that KL: no policy lies above the curve. As ``beta`` falls, both coordinates
    grow (towards the best action's reward and ``-log pi_ref(best)``); as ``beta`` grows they fall
    to ``(0, E_ref[r])``. The reference and the rewards are held fixed.

    Args:
      ref_logp: ``[n]`` reference log-probabilities; rewards: ``[n]`` frozen rewards;
      betas: ``[B]`` KL coefficients, each > 0.

    Returns:
      ``(kls, expected_rewards)``, each ``[B]``: KL in nats and expected reward in reward units.
    """
    betas = jnp.asarray(betas, jnp.float32)
    opt = jax.vmap(lambda b: optimal_logp(ref_logp, rewards, b))(betas)  # [B, n]
    return categorical_kl(opt, ref_logp), expected_reward(opt, rewards)


def ppo_loss(
    logits: jax.Array,
    old_logp: jax.Array,
    actions: jax.Array,
    advantages: jax.Array,
    ref_logp: jax.Array,
    beta=0.1,
    epsilon=0.2,
) -> jax.Array:
    """Loss minimised by one PPO inner step: negative clipped surrogate plus exact KL penalty.

    ``L(theta) = -mean_i min(rho_i A_i, clip(rho_i, 1-eps, 1+eps) A_i) + beta * KL(pi_theta || pi_ref)``
    with ``rho_i = exp(log pi_theta(a_i) - old_logp_i)``.

    ``old_logp`` and ``advantages`` were computed when the batch was collected; they are wrapped in
    ``stop_gradient`` so the gradient with respect to them is exactly zero and they cannot become
    optimisation targets. ``ref_logp`` is likewise a constant.

    Args:
      logits: ``[n_actions]`` current policy logits (the only trained argument).
      old_logp: ``[batch]`` behaviour-policy log-probabilities of the sampled actions (frozen).
      actions: ``[batch]`` int sampled actions.
      advantages: ``[batch]`` advantages (frozen).
      ref_logp: ``[n_actions]`` reference log-probabilities (frozen for the run).
      beta: KL coefficient. epsilon: clip range.

    Returns:
      Scalar loss.
    """
    logp = jax.nn.log_softmax(logits)
    ratio = jnp.exp(logp[actions] - jax.lax.stop_gradient(old_logp))
    surrogate = jnp.mean(clipped_surrogate(ratio, jax.lax.stop_gradient(advantages), epsilon))
    return -surrogate + beta * categorical_kl(logp, jax.lax.stop_gradient(ref_logp))


def exact_advantages(actions: jax.Array, rewards: jax.Array, old_logp_all: jax.Array) -> jax.Array:
    """Advantages with the exact baseline: ``A_i = r(a_i) - sum_a pi_old(a) r(a)``.

    Args:
      actions: ``[batch]`` sampled actions; rewards: ``[n]`` frozen rewards;
      old_logp_all: ``[n]`` behaviour policy log-probabilities (all actions).

    Returns:
      ``[batch]`` advantages (treat as constants during the inner updates).
    """
    return rewards[actions] - expected_reward(old_logp_all, rewards)


def enumerated_baseline_gradient(logits: jax.Array, rewards: jax.Array, baseline) -> jax.Array:
    """Score-function gradient with a constant baseline, summed exactly over all actions.

    ``g = sum_a pi(a) * grad_theta log pi(a) * (r(a) - c)``. Because ``sum_a pi(a) grad log pi(a) = 0``
    this equals ``grad_theta E_pi[r]`` for *any* constant ``c``.

    Returns:
      ``[n]`` gradient with respect to ``logits``.
    """
    probs = jax.nn.softmax(logits)
    score = jax.jacrev(jax.nn.log_softmax)(logits)  # [n_actions, n_params]
    return jnp.sum(probs[:, None] * (rewards - baseline)[:, None] * score, axis=0)


def exact_reward_gradient(logits: jax.Array, rewards: jax.Array) -> jax.Array:
    """``grad_theta sum_a softmax(theta)_a r(a)`` by automatic differentiation, shape ``[n]``."""
    return jax.grad(lambda z: expected_reward(jax.nn.log_softmax(z), rewards))(logits)


def clip_fraction(ratio: jax.Array, epsilon) -> jax.Array:
    """Fraction of samples whose ratio lies outside ``[1-eps, 1+eps]`` (CleanRL's ``clipfrac``)."""
    return jnp.mean((jnp.abs(ratio - 1.0) > epsilon).astype(jnp.float32))
