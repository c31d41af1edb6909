"""Trusted procedures several checks of ``a2_ppo_rlhf`` share: fresh batches, one rollout, a whole run.

Each procedure is built from the reference implementations ``ref`` (``ref.ppo_loss``,
``ref.exact_advantages``, ...) and can reproduce the classic mistakes students make, so a check can
say *which* mistake an answer's outputs match.
"""
from __future__ import annotations

import functools

import numpy as np

from .core import Jax, Key, check, close, matches

#: The classic mistakes of one rollout update, by name, with the message a student sees.
UPDATE_MISTAKES = {
    "recompute_old": "ratios are always 1: old log probs recomputed after every inner step "
                     "(compute old_logp once per rollout, before the inner loop)",
    "kl_to_old": "KL measured against the old policy, not the reference: pass the fixed ref_logp to the loss",
    "no_baseline": "advantages have no baseline: subtract the old policy's exact expected reward sum_a pi_old(a) r(a)",
    "batch_mean_baseline": "the baseline is the batch mean of the rewards: use the old policy's EXACT expected "
                           "reward sum_a pi_old(a) r(a)",
    "recompute_advantages": "advantages recomputed after every inner step: freeze them when the batch is collected",
    "sample_reference": "actions were sampled from the reference policy: sample the batch from the CURRENT policy",
    "one_step": "only one inner step was taken: reuse the batch for `epochs` inner steps",
}

#: Library functions the rollout and loop tasks must not delegate to.
LOOP_FORBID = ("exact_advantages", "train", "train_core", "make_train", "_rollout_update", "seed_style_train",
               "run_lesson", "sweep_grid", "sweep_seeds")


def fresh_batch(rng, ratio_low: float = 0.4, ratio_high: float = 1.8) -> tuple:
    """Fresh ``(logits [3], old_logp [24], actions [24], advantages [24], ref_logp [3])`` with chosen ratios.

    ``old_logp = log pi(actions) - log(ratios)`` with ratios uniform in ``[ratio_low, ratio_high]``, so
    the check decides which ratios are clipped. Fixed shapes, fresh values (a new shape would make
    JAX compile every primitive again).
    """
    import jax

    n, batch = 3, 24
    logits = rng.normal(size=n).astype(np.float32)
    ref_logp = np.asarray(jax.nn.log_softmax(rng.normal(size=n).astype(np.float32)))
    actions = rng.integers(0, n, size=batch)
    ratios = rng.uniform(ratio_low, ratio_high, size=batch)
    old_logp = np.asarray(jax.nn.log_softmax(logits)[actions] - np.log(ratios).astype(np.float32))
    advantages = rng.normal(size=batch).astype(np.float32)
    return logits, old_logp, actions, advantages, ref_logp


def as_jax(args: tuple) -> tuple:
    """Hand every array of ``args`` to the student as a JAX array (numbers stay numbers)."""
    return tuple(Jax(a) if isinstance(a, np.ndarray) else a for a in args)


@functools.lru_cache(maxsize=16)
def loss_grad(loss):
    """``jax.jit(jax.grad(loss))``, built once per loss function (the reference's ``ppo_loss``).

    Every rollout update the grader computes differentiates the same reference loss on arrays of the
    same shapes: one compiled gradient serves them all, where ``jax.grad`` alone would trace the
    loss again at every step of every check.
    """
    import jax

    return jax.jit(jax.grad(loss))


def trusted_update(ref, logits, draw_key, rewards, ref_logp, *, batch_size, epochs, beta, epsilon,
                   learning_rate, mistake: str | None = None):
    """One rollout of the lesson's PPO, or the same with one classic ``mistake`` (:data:`UPDATE_MISTAKES`).

    Samples ``batch_size`` actions from the current policy with ``draw_key`` (a JAX key), freezes
    ``old_logp`` and the exact-baseline advantages, then takes ``epochs`` steps of
    ``logits - learning_rate * grad(ref.ppo_loss)`` against the fixed ``ref_logp``. Returns [n] logits.
    """
    import jax
    import jax.numpy as jnp

    logits = jnp.asarray(logits, jnp.float32)
    rewards = jnp.asarray(rewards, jnp.float32)
    ref_logp = jnp.asarray(ref_logp, jnp.float32)
    old_all = jax.nn.log_softmax(logits)
    sampler = ref_logp if mistake == "sample_reference" else old_all
    actions = jax.random.categorical(draw_key, sampler, shape=(batch_size,))
    old_logp = old_all[actions]
    advantages = ref.exact_advantages(actions, rewards, old_all)
    if mistake == "no_baseline":
        advantages = rewards[actions]
    if mistake == "batch_mean_baseline":
        advantages = rewards[actions] - jnp.mean(rewards[actions])
    anchor = old_all if mistake == "kl_to_old" else ref_logp
    grad = loss_grad(ref.ppo_loss)
    for _ in range(1 if mistake == "one_step" else epochs):
        if mistake == "recompute_old":
            old_logp = jax.nn.log_softmax(logits)[actions]
        if mistake == "recompute_advantages":
            advantages = ref.exact_advantages(actions, rewards, jax.nn.log_softmax(logits))
        logits = logits - learning_rate * grad(logits, old_logp, actions, advantages, anchor, beta, epsilon)
    return logits


def check_update(ref, got, inputs: tuple, hyper: dict, mistakes) -> None:
    """The student's new logits against :func:`trusted_update`; name the listed mistake they match, if any."""
    import jax

    logits, key, rewards, ref_logp = inputs
    key = jax.random.key(key.seed)
    want = trusted_update(ref, logits, key, rewards, ref_logp, **hyper)
    if not matches(got, want, rtol=1e-4, atol=1e-5):
        for mistake in mistakes:
            wrong = trusted_update(ref, logits, key, rewards, ref_logp, **hyper, mistake=mistake)
            check(not matches(got, wrong, rtol=1e-4, atol=1e-5), "rollout_update: " + UPDATE_MISTAKES[mistake])
    close(got, want, "logits after one rollout update", rtol=1e-4, atol=1e-5,
          hint="sample from the current policy with draw_key, freeze old_logp and exact-baseline "
               "advantages, then take `epochs` steps of learning_rate * grad(ppo_loss) against ref_logp")


def fresh_update_inputs(rng, *, epochs: int, start_at_reference: bool = False,
                        beta_range: tuple = (0.1, 0.4)) -> tuple[tuple, dict]:
    """Fresh ``(logits, Key, rewards, ref_logp)`` and hyperparameters for one rollout update (3 actions)."""
    import jax

    n = 3
    logits = rng.normal(size=n).astype(np.float32)
    rewards = rng.normal(scale=1.5, size=n).astype(np.float32)
    ref_source = logits if start_at_reference else logits + rng.normal(scale=1.5, size=n).astype(np.float32)
    ref_logp = np.asarray(jax.nn.log_softmax(ref_source))
    key = Key(int(rng.integers(0, 2**31 - 1)))
    hyper = dict(batch_size=32, epochs=epochs, beta=float(rng.uniform(*beta_range)),
                 epsilon=float(rng.uniform(0.1, 0.25)), learning_rate=float(rng.uniform(0.5, 1.0)))
    return (logits, key, rewards, ref_logp), hyper


def trusted_run(ref, rewards, init_logits, *, iterations: int, seed: int, **hyper):
    """The whole loop with :func:`trusted_update`: (exact reward per rollout, exact KL per rollout, final logits)."""
    import jax
    import jax.numpy as jnp

    logits = jnp.asarray(init_logits, jnp.float32)
    ref_logp = jax.nn.log_softmax(logits)
    key = jax.random.key(seed)
    reward_hist, kl_hist = [], []
    for _ in range(iterations):
        key, draw = jax.random.split(key)
        logits = trusted_update(ref, logits, draw, rewards, ref_logp, **hyper)
        logp = jax.nn.log_softmax(logits)
        reward_hist.append(ref.expected_reward(logp, jnp.asarray(rewards, jnp.float32)))
        kl_hist.append(ref.categorical_kl(logp, ref_logp))
    return np.asarray(reward_hist), np.asarray(kl_hist), np.asarray(logits)
