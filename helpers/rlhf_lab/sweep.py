"""Many runs in one compiled call: ``vmap`` over a beta x epsilon grid, or over seeds."""
from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from . import checks
from .ppo import categorical_kl, expected_reward, optimal_logp, regularised_objective
from .trainer import MAX_SEED, TRACE_COUNTS, PPOConfig, TrainResult, _f32, _rewards_for, train_core


class GridResult(NamedTuple):
    """Final-state summaries of a beta x epsilon sweep; every field is ``[n_beta, n_epsilon]``."""

    betas: np.ndarray  # [n_beta]
    epsilons: np.ndarray  # [n_epsilon]
    final_reward: jax.Array
    final_kl: jax.Array
    objective: jax.Array  # E[r] - beta KL of the trained policy
    optimum: jax.Array  # objective of the analytic optimum for that beta (same for every epsilon)
    clip_frac: jax.Array  # clip fraction of the last rollout


def _grid_core(key, init_logits, rewards, betas, epsilons, learning_rate, *, iterations, batch_size, epochs):
    TRACE_COUNTS["sweep"] += 1
    run = functools.partial(
        train_core, iterations=iterations, batch_size=batch_size, epochs=epochs
    )
    one = lambda b, e: run(key, init_logits, rewards, b, e, learning_rate)  # noqa: E731
    res: TrainResult = jax.vmap(jax.vmap(one, in_axes=(None, 0)), in_axes=(0, None))(betas, epsilons)
    # from the logits, not log(probs): an underflowed probability would give 0 * -inf = NaN in the KL
    final_logp = jax.nn.log_softmax(res.final_logits)
    ref_logp = jax.nn.log_softmax(init_logits)
    opt = jax.vmap(lambda b: regularised_objective(optimal_logp(ref_logp, rewards, b), rewards, ref_logp, b))(betas)
    return dict(
        final_reward=res.reward[..., -1],
        final_kl=res.kl[..., -1],
        objective=expected_reward(final_logp, rewards) - betas[:, None] * categorical_kl(final_logp, ref_logp),
        optimum=jnp.broadcast_to(opt[:, None], (betas.shape[0], epsilons.shape[0])),
        clip_frac=res.clip_frac[..., -1],
    )


@functools.lru_cache(maxsize=None)
def make_grid(iterations: int, batch_size: int, epochs: int):
    """Compiled ``grid(key, init_logits, rewards, betas[B], epsilons[E], lr)`` (cached per shape)."""
    return jax.jit(functools.partial(_grid_core, iterations=iterations, batch_size=batch_size, epochs=epochs))


def sweep_grid(config: PPOConfig, betas, epsilons, rewards=None) -> GridResult:
    """Train one policy per (beta, epsilon) pair, all with ``config``'s seed, in one compiled call.

    Args:
      config: supplies the loop sizes, seed, learning rate and initial logits (its beta/epsilon are ignored).
      betas: ``[B]`` KL coefficients, each > 0. epsilons: ``[E]`` clip ranges, each in (0, 1).

    Returns:
      :class:`GridResult` with ``[B, E]`` fields.
    """
    betas = checks.finite_vector("betas", betas)
    epsilons = checks.finite_vector("epsilons", epsilons)
    for b in betas:
        checks.beta(b, "betas")
    for e in epsilons:
        checks.epsilon(e, "epsilons")
    rewards = _rewards_for(config, rewards)
    out = make_grid(*config.shape)(
        jax.random.key(config.seed),
        jnp.asarray(config.init_logits, jnp.float32),
        rewards,
        jnp.asarray(betas, jnp.float32),
        jnp.asarray(epsilons, jnp.float32),
        _f32(config.learning_rate),
    )
    return GridResult(betas=betas.astype(np.float32), epsilons=epsilons.astype(np.float32), **out)


def _seeds_core(keys, init_logits, rewards, beta, epsilon, learning_rate, *, iterations, batch_size, epochs):
    TRACE_COUNTS["seeds"] += 1
    run = functools.partial(train_core, iterations=iterations, batch_size=batch_size, epochs=epochs)
    return jax.vmap(lambda k: run(k, init_logits, rewards, beta, epsilon, learning_rate))(keys)


@functools.lru_cache(maxsize=None)
def make_seeds(iterations: int, batch_size: int, epochs: int):
    """Compiled ``seeds(keys[S], init_logits, rewards, beta, epsilon, lr)`` (cached per shape)."""
    return jax.jit(functools.partial(_seeds_core, iterations=iterations, batch_size=batch_size, epochs=epochs))


def sweep_seeds(config: PPOConfig, seeds, rewards=None) -> TrainResult:
    """Run ``config`` once per seed in one compiled call; every field gains a leading ``[S]`` axis."""
    seeds = np.asarray(seeds)
    if (seeds.ndim != 1 or seeds.size == 0 or not np.issubdtype(seeds.dtype, np.integer)
            or seeds.min() < 0 or seeds.max() > MAX_SEED):
        raise ValueError(f"seeds must be a non-empty 1-D array of integers in [0, {MAX_SEED}], got {seeds!r}")
    rewards = _rewards_for(config, rewards)
    keys = jax.vmap(jax.random.key)(jnp.asarray(seeds, jnp.uint32))
    return make_seeds(*config.shape)(
        keys,
        jnp.asarray(config.init_logits, jnp.float32),
        rewards,
        _f32(config.beta),
        _f32(config.epsilon),
        _f32(config.learning_rate),
    )
