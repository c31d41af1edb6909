"""The lesson's experiment end to end, plus the seed-style Python loop used as a benchmark baseline."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from .ppo import categorical_kl, exact_advantages, expected_reward, optimal_logp, ppo_loss, regularised_objective
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
    """The compiled trainer's algorithm as a plain Python loop, one jitted gradient step per inner update.

    The benchmark's baseline for :func:`rlhf_lab.trainer.train` and a cross-check of it: the same
    rollouts (one fresh subkey per rollout, behaviour log-probabilities and exact-baseline advantages
    frozen per batch, ``epochs`` gradient steps against the fixed reference), driven from Python.
    Returns ``{"reward": [T], "kl": [T], "final_logits": [n]}`` (exact values after each rollout).
    """
    rewards = lesson_rewards() if rewards is None else jnp.asarray(rewards, jnp.float32)
    logits = jnp.asarray(config.init_logits, jnp.float32)
    ref_logp = jax.nn.log_softmax(logits)
    grad_step = _seed_step()
    key = jax.random.key(config.seed)
    history = {"reward": [], "kl": []}
    for _ in range(config.iterations):
        key, draw = jax.random.split(key)
        logits = _python_rollout(logits, draw, rewards, ref_logp, config, grad_step)
        logp = jax.nn.log_softmax(logits)
        history["reward"].append(float(expected_reward(logp, rewards)))
        history["kl"].append(float(categorical_kl(logp, ref_logp)))
    return {**history, "final_logits": logits}


def _python_rollout(logits, draw, rewards, ref_logp, config: PPOConfig, grad_step):
    """One batch: sample from the current policy, freeze what the batch needs, take ``epochs`` steps."""
    behaviour_logp = jax.nn.log_softmax(logits)
    actions = jax.random.categorical(draw, behaviour_logp, shape=(config.batch_size,))
    old_logp = behaviour_logp[actions]
    advantages = exact_advantages(actions, rewards, behaviour_logp)
    for _ in range(config.epochs):
        _, grad = grad_step(logits, old_logp, actions, advantages, ref_logp, config.beta, config.epsilon)
        logits = logits - config.learning_rate * grad
    return logits


_STEP = None


def _seed_step():
    global _STEP
    if _STEP is None:
        _STEP = jax.jit(jax.value_and_grad(ppo_loss))
    return _STEP
