"""The lesson's PPO loop compiled as one call (purejaxrl-style ``make_train(shape) -> train``).

One *rollout* samples ``batch_size`` actions from the current policy, freezes their behaviour
log-probabilities (``old_logp``) and exact-baseline advantages, then takes ``epochs`` gradient
steps on that same batch. The reference policy and the reward model never change. The whole run
is ``lax.scan`` (rollouts) of ``lax.scan`` (inner epochs), so it compiles once per *shape*
(iterations, batch size, epochs, number of actions); ``beta``, ``epsilon`` and the learning rate
are traced arguments, so moving them never recompiles.
"""
from __future__ import annotations

import collections
import functools
from dataclasses import dataclass, field
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from . import checks
from .ppo import categorical_kl, clip_fraction, exact_advantages, expected_reward, ppo_loss

#: How many times each compiled entry point has been *traced* (a trace precedes every compile).
#: Tests and the widget explorer read it to prove that moving a slider does not recompile.
TRACE_COUNTS: collections.Counter = collections.Counter()

LESSON_INIT_LOGITS = (0.2, 0.0, -0.2)
#: Largest PRNG seed (JAX seeds are 32-bit).
MAX_SEED = 2**32 - 1


@dataclass(frozen=True)
class PPOConfig:
    """Hyperparameters of one run. Defaults are the lesson's recorded configuration.

    Static (a new value compiles a new program): ``iterations``, ``batch_size``, ``epochs`` and
    the number of actions. Traced (free to change): ``beta``, ``epsilon``, ``learning_rate``,
    ``seed`` and the values of ``init_logits``.
    """

    iterations: int = 40
    batch_size: int = 128
    epochs: int = 3
    beta: float = 0.2
    epsilon: float = 0.2
    learning_rate: float = 0.15
    seed: int = 11
    init_logits: tuple = field(default=LESSON_INIT_LOGITS)

    def __post_init__(self):
        object.__setattr__(self, "iterations", checks.positive_int("iterations", self.iterations))
        object.__setattr__(self, "batch_size", checks.positive_int("batch_size", self.batch_size))
        object.__setattr__(self, "epochs", checks.positive_int("epochs", self.epochs))
        object.__setattr__(self, "beta", checks.beta(self.beta))
        object.__setattr__(self, "epsilon", checks.epsilon(self.epsilon))
        object.__setattr__(self, "learning_rate", checks.learning_rate(self.learning_rate))
        seed = checks.positive_int("seed", self.seed, minimum=0)
        if seed > MAX_SEED:  # JAX keeps only 32 bits: larger seeds would silently alias smaller ones
            raise ValueError(f"seed must be an integer in [0, {MAX_SEED}], got {seed}")
        object.__setattr__(self, "seed", seed)
        logits = checks.finite_vector("init_logits", self.init_logits)
        if logits.shape[0] < 2:
            raise ValueError(f"init_logits must have at least 2 actions, got {logits.shape[0]}")
        object.__setattr__(self, "init_logits", tuple(float(x) for x in logits))

    @property
    def shape(self) -> tuple[int, int, int]:
        """The static part of the configuration: ``(iterations, batch_size, epochs)``."""
        return (self.iterations, self.batch_size, self.epochs)


class TrainResult(NamedTuple):
    """Everything one run records. Shapes for one run (a sweep adds leading grid axes).

    ``reward``/``kl``/``objective`` are *exact* (summed over actions) and measured after each
    rollout's inner updates, so index ``k`` describes the policy after ``k + 1`` rollouts.
    """

    reward: jax.Array  # [iterations] E_pi[r] after each rollout
    kl: jax.Array  # [iterations] KL(pi || pi_ref) in nats after each rollout
    probs: jax.Array  # [iterations, n_actions] action probabilities after each rollout
    clip_frac: jax.Array  # [iterations] mean fraction of clipped samples over the inner epochs
    final_logits: jax.Array  # [n_actions] current policy parameters at the end
    ref_logp: jax.Array  # [n_actions] the fixed reference (identical before and after)
    initial_reward: jax.Array  # [] E_{pi_ref}[r]
    last_actions: jax.Array  # [batch] actions of the last rollout batch
    last_old_logp: jax.Array  # [batch] their frozen behaviour log-probabilities
    last_advantages: jax.Array  # [batch] their frozen advantages
    last_ratio: jax.Array  # [batch] pi/pi_old on the last batch after its final inner step


def _rollout_update(rewards, ref_logp, beta, epsilon, learning_rate, epochs, batch_size):
    """Build the scan body for one rollout: sample, freeze, ``epochs`` inner steps, measure."""
    grad_fn = jax.value_and_grad(ppo_loss)

    def body(carry, _):
        logits, key = carry
        old_logp_all = jax.nn.log_softmax(logits)  # behaviour policy snapshot for this batch
        key, draw = jax.random.split(key)
        actions = jax.random.categorical(draw, old_logp_all, shape=(batch_size,))
        old_logp = jax.lax.stop_gradient(old_logp_all[actions])
        advantages = jax.lax.stop_gradient(exact_advantages(actions, rewards, old_logp_all))

        def inner(theta, _):
            ratio = jnp.exp(jax.nn.log_softmax(theta)[actions] - old_logp)
            _, g = grad_fn(theta, old_logp, actions, advantages, ref_logp, beta, epsilon)
            return theta - learning_rate * g, clip_fraction(ratio, epsilon)

        logits, clip_fracs = jax.lax.scan(inner, logits, None, length=epochs)
        logp = jax.nn.log_softmax(logits)
        out = dict(
            reward=expected_reward(logp, rewards),
            kl=categorical_kl(logp, ref_logp),
            probs=jnp.exp(logp),
            clip_frac=jnp.mean(clip_fracs),
            actions=actions,
            old_logp=old_logp,
            advantages=advantages,
            ratio=jnp.exp(logp[actions] - old_logp),
        )
        return (logits, key), out

    return body


def train_core(key, init_logits, rewards, beta, epsilon, learning_rate, *, iterations, batch_size, epochs):
    """One whole PPO run as a pure function (un-jitted; see :func:`make_train`).

    Args:
      key: a typed PRNG key (``jax.random.key(seed)``).
      init_logits: ``[n]`` initial policy logits; the reference is ``log_softmax(init_logits)``.
      rewards: ``[n]`` frozen per-action rewards.
      beta, epsilon, learning_rate: scalar hyperparameters (traced).
      iterations, batch_size, epochs: static loop sizes.

    Returns:
      :class:`TrainResult`.
    """
    TRACE_COUNTS["train"] += 1
    ref_logp = jax.lax.stop_gradient(jax.nn.log_softmax(init_logits))
    body = _rollout_update(rewards, ref_logp, beta, epsilon, learning_rate, epochs, batch_size)
    (logits, _), out = jax.lax.scan(body, (init_logits, key), None, length=iterations)
    return TrainResult(
        reward=out["reward"],
        kl=out["kl"],
        probs=out["probs"],
        clip_frac=out["clip_frac"],
        final_logits=logits,
        ref_logp=ref_logp,
        initial_reward=expected_reward(ref_logp, rewards),
        last_actions=out["actions"][-1],
        last_old_logp=out["old_logp"][-1],
        last_advantages=out["advantages"][-1],
        last_ratio=out["ratio"][-1],
    )


@functools.lru_cache(maxsize=None)
def make_train(iterations: int, batch_size: int, epochs: int):
    """Return the compiled ``train(key, init_logits, rewards, beta, epsilon, learning_rate)``.

    Cached per shape, so every caller with the same loop sizes shares one compiled program.
    """
    return jax.jit(
        functools.partial(train_core, iterations=iterations, batch_size=batch_size, epochs=epochs)
    )


def _f32(x) -> jax.Array:
    # Always the same dtype and weak-type, so a Python float and a NumPy float share a cache entry.
    return jnp.asarray(np.float32(x))


def train(config: PPOConfig = PPOConfig(), rewards=None) -> TrainResult:
    """Validate ``config`` and run the compiled trainer once.

    Args:
      config: :class:`PPOConfig` (validated on construction).
      rewards: ``[n_actions]`` frozen rewards; defaults to the lesson's fitted reward model.

    Returns:
      :class:`TrainResult` for that run.
    """
    if not isinstance(config, PPOConfig):
        raise ValueError(f"config must be a PPOConfig, got {type(config).__name__}")
    rewards = _rewards_for(config, rewards)
    fn = make_train(*config.shape)
    return fn(
        jax.random.key(config.seed),
        jnp.asarray(config.init_logits, jnp.float32),
        rewards,
        _f32(config.beta),
        _f32(config.epsilon),
        _f32(config.learning_rate),
    )


def _rewards_for(config: PPOConfig, rewards) -> jax.Array:
    if rewards is None:
        rewards = lesson_rewards()
    arr = checks.finite_vector("rewards", rewards, size=len(config.init_logits))
    return jnp.asarray(arr, jnp.float32)


@functools.lru_cache(maxsize=1)
def _lesson_rewards_np() -> np.ndarray:
    from .reward import fit_reward

    return np.asarray(fit_reward().rewards)


def lesson_rewards() -> jax.Array:
    """The lesson's frozen rewards (reward model fitted with 100 steps at lr 0.1), shape ``[3]``."""
    return jnp.asarray(_lesson_rewards_np())
