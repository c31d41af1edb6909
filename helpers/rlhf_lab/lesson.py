"""The lesson's experiment end to end, plus the seed-style Python loop used as a benchmark baseline."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from .ppo import optimal_logp, ppo_loss, regularised_objective
from .trainer import PPOConfig, TrainResult, lesson_rewards, train

#: The numbers of the lesson's recorded reference execution (JAX 0.9.2, CPU, float32).
RECORDED = {
    "initial_reward": 0.28191882371902466,
    "final_reward": 1.9185447692871094,
    "final_kl": 0.7824773192405701,
    "objective_reference": 0.28191882371902466,
    "objective_trained": 1.7620493173599243,
    "objective_optimum": 1.7987911701202393,
    "clip_terms": (2.4, -1.6),
}


def summarise(result: TrainResult, rewards, beta: float) -> dict:
    """The headline numbers of one run as plain floats (what the lesson prints)."""
    ref_logp = result.ref_logp
    final_logp = jax.nn.log_softmax(result.final_logits)
    opt_logp = optimal_logp(ref_logp, rewards, beta)
    return {
        "initial_reward": float(result.initial_reward),
        "final_reward": float(result.reward[-1]),
        "final_kl": float(result.kl[-1]),
        "objective_reference": float(regularised_objective(ref_logp, rewards, ref_logp, beta)),
        "objective_trained": float(regularised_objective(final_logp, rewards, ref_logp, beta)),
        "objective_optimum": float(regularised_objective(opt_logp, rewards, ref_logp, beta)),
        "final_probs": [float(p) for p in np.asarray(result.probs[-1])],
        "optimum_probs": [float(p) for p in np.exp(np.asarray(opt_logp))],
        "reference_probs": [float(p) for p in np.exp(np.asarray(ref_logp))],
    }


def run_lesson(config: PPOConfig = PPOConfig()) -> tuple[TrainResult, dict]:
    """Fit the reward, train with the compiled trainer and summarise (lesson defaults reproduce the record)."""
    rewards = lesson_rewards()
    result = train(config, rewards)
    return result, summarise(result, rewards, config.beta)


def seed_style_train(config: PPOConfig = PPOConfig(), rewards=None) -> dict:
    """The lesson's original Python-level loop: one jitted ``value_and_grad`` call per inner step.

    Kept only as a correctness cross-check and as the benchmark baseline for the compiled trainer.
    Returns per-rollout exact reward and KL lists and the final logits.
    """
    rewards = lesson_rewards() if rewards is None else jnp.asarray(rewards, jnp.float32)
    theta = jnp.asarray(config.init_logits, jnp.float32)
    ref_logp = jax.nn.log_softmax(theta)
    step = _seed_step()
    key = jax.random.key(config.seed)
    reward_hist, kl_hist = [], []
    for _ in range(config.iterations):
        old_logp_all = jax.nn.log_softmax(theta)
        key, draw = jax.random.split(key)
        actions = jax.random.categorical(draw, old_logp_all, shape=(config.batch_size,))
        old_logp = old_logp_all[actions]
        advantages = rewards[actions] - jnp.sum(jnp.exp(old_logp_all) * rewards)
        for _ in range(config.epochs):
            _, g = step(theta, old_logp, actions, advantages, ref_logp, config.beta, config.epsilon)
            theta = theta - config.learning_rate * g
        logp = jax.nn.log_softmax(theta)
        reward_hist.append(float(jnp.sum(jnp.exp(logp) * rewards)))
        kl_hist.append(float(jnp.sum(jnp.exp(logp) * (logp - ref_logp))))
    return {"reward": reward_hist, "kl": kl_hist, "final_logits": theta}


_STEP = None


def _seed_step():
    global _STEP
    if _STEP is None:
        _STEP = jax.jit(jax.value_and_grad(ppo_loss))
    return _STEP
