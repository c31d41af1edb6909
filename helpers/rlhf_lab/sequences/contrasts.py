"""Contrasts on the same task and the same exact evaluator: GRPO, RLOO, DPO, best-of-n, exact-gradient ascent.

* **GRPO** (Shao et al. 2024): ``group_size`` responses per prompt, advantages normalised within
  each group by the POPULATION std (divide by the group size; TRL's ``GRPOTrainer`` uses torch's
  Bessel-corrected std, divide by ``group_size - 1``), no critic, the same clipped policy loss, and
  ``beta * k3`` in the LOSS (so its KL gradient is the one of ``KL(pi_ref || pi)``, see
  :mod:`.estimators`). The loss is a TOKEN mean over all real tokens of a minibatch (as DAPO), not
  a mean over each response's tokens and then over responses (DeepSeekMath's GRPO). Because every
  group's advantages get std 1 whatever the spread of its scores, the KL term weighs less and less
  against the score as the policy concentrates: on the default task the 200-iteration run ends at a
  KL of about 13 nats, beyond the 10.2 of ``pi*_0.05``, with a regret about 25 times PPO's.
* **RLOO** (Ahmadian et al. 2024, as TRL's ``RLOOTrainer``): the same groups, batch, epochs and
  clipped loss as GRPO, no critic, but each response's baseline is the MEAN OF THE OTHER responses
  of its group (``A_ij = r_ij - mean_{k != j} r_ik``, no division by a std) and the KL penalty is in
  the REWARD, per sequence: ``r = s - beta * sum_t (old_logp - ref_logp)`` (the sampled sequence
  KL, k1 summed over the response), so it follows the gradient of ``E[s] - beta KL(pi || pi_ref)``,
  the objective that defines ``pi*_beta``.
* **DPO** (Rafailov et al. 2023) on the very preference pairs the proxy was fitted to.
* **Best-of-n**: exact distribution of "draw n responses from the reference, keep the one with the
  highest score", its exact KL, beside the analytic ``log n - (n-1)/n``.
* **Exact-gradient ascent**: Adam on the exact objective ``E_pi[s] - beta KL(pi || pi_ref)``
  computed by enumeration: no sampling noise, the oracle PPO is trying to be.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax

from .. import checks
from ..trainer import MAX_SEED, TRACE_COUNTS
from . import _validate as v
from . import exact
from .estimators import k3
from .language import Language, context_features, masked_mean
from .policy import policy_logp, token_logp
from .ppo import _check_task, exact_metrics, response_score, rollout_arrays, sample_responses
from .task import Task, TaskArrays

# ------------------------------------------------------------------------------------------
# Best-of-n
# ------------------------------------------------------------------------------------------


def best_of_n_logp(ref_resp_logp, score, n: int) -> np.ndarray:
    """Exact log-distribution of best-of-n sampling from the reference, per prompt.

    Sort responses by score. For a group ``g`` of responses with equal score, ``F_g = P_ref(s <= s_g)``
    and ``F_g^- = P_ref(s < s_g)``; the group's best-of-n probability is ``F_g^n - (F_g^-)^n``,
    shared within the group in proportion to ``pi_ref`` (ties broken uniformly at random).

    Args:
      ref_resp_logp: ``[P, R]`` (or ``[R]``) reference log-probs; score: same shape; n: integer >= 1.

    Returns:
      NumPy float64 array of the same shape (``-inf`` where the probability is 0).
    """
    n = checks.positive_int("n", n)
    ref = np.asarray(ref_resp_logp, np.float64)
    s = np.asarray(score, np.float64)
    if ref.shape != s.shape:
        raise ValueError(f"mismatched shapes: ref_resp_logp{ref.shape}, score{s.shape}")
    if not np.all(np.isfinite(s)):
        raise ValueError("score contains non-finite values")
    single = ref.ndim == 1
    ref, s = np.atleast_2d(ref), np.atleast_2d(s)
    out = np.empty_like(ref)
    for p in range(ref.shape[0]):
        probs = np.exp(ref[p] - np.max(ref[p]))
        probs /= probs.sum()
        order = np.argsort(s[p], kind="stable")
        ss, pp = s[p][order], probs[order]
        starts = np.flatnonzero(np.r_[True, ss[1:] != ss[:-1]])
        group_mass = np.add.reduceat(pp, starts)
        upper = np.minimum(np.cumsum(group_mass), 1.0)
        lower = np.r_[0.0, upper[:-1]]
        bon_mass = upper**n - lower**n
        group_id = np.repeat(np.arange(starts.size), np.diff(np.r_[starts, ss.size]))
        share = np.where(group_mass[group_id] > 0, pp / np.where(group_mass[group_id] > 0, group_mass[group_id], 1.0), 0.0)
        q = np.empty_like(pp)
        q[order] = bon_mass[group_id] * share
        with np.errstate(divide="ignore"):
            out[p] = np.log(q)
    return out[0] if single else out


def best_of_n_kl_formula(n: int) -> float:
    """The analytic ``log n - (n-1)/n``: the KL of best-of-n when no response carries noticeable
    probability on its own (continuous limit); for a finite distribution the exact KL is at most this."""
    n = checks.positive_int("n", n)
    return float(np.log(n) - (n - 1) / n)


def best_of_n_summary(task: Task, n: int) -> dict:
    """Exact expected gold, proxy, score and KL of best-of-n (selecting on the training score), prompts averaged."""
    task = _check_task(task)
    a = task.arrays
    q = best_of_n_logp(a.ref_resp_logp, a.score, n)
    p = np.exp(q)
    ref = np.asarray(a.ref_resp_logp, np.float64)
    kl = np.sum(p * np.where(p > 0, q - ref, 0.0), axis=1)
    return {"n": n, "gold": float(np.mean(np.sum(p * np.asarray(a.gold), 1))),
            "proxy": float(np.mean(np.sum(p * np.asarray(a.proxy), 1))),
            "score": float(np.mean(np.sum(p * np.asarray(a.score), 1))),
            "kl": float(np.mean(kl)), "kl_formula": best_of_n_kl_formula(n)}


# ------------------------------------------------------------------------------------------
# GRPO
# ------------------------------------------------------------------------------------------


#: A group whose population std is at most this fraction of its largest ``|score|`` counts as constant.
CONSTANT_GROUP_RTOL = 1e-4


def group_advantages(scores: jax.Array, eps: float = 1e-6) -> jax.Array:
    """GRPO advantages: ``A_ij = (s_ij - mean_j s_ij) / (std_j s_ij + eps)`` within each group ``i``.

    ``std`` is the population std. A group counts as **constant**, and each of its responses gets
    advantage exactly 0, when ``std_j s_ij <= CONSTANT_GROUP_RTOL * max_j |s_ij|`` (``1e-4`` of the
    group's largest score in absolute value; an all-zero group is constant too). Without the rule a
    group of equal scores would get whatever the rounding of its mean leaves: in float32 the mean of
    K equal numbers is often one ulp off, and dividing that by ``0 + eps`` gives advantages of order
    0.1-0.5. The rounding cannot cross the rule: summing K equal float32 numbers and dividing by K
    moves the mean by at most about ``K * 2**-24`` of their size (``6e-5`` for K = 1,000, the
    deviations and their std are no larger), while scores that really differ, by more than ``1e-4``
    of their size, keep the formula.

    Args:
      scores: ``[n_groups, group_size]`` scores of the responses of one prompt per row (group sizes up
        to 1,000 for the guarantee above).

    Returns:
      ``[n_groups, group_size]``; exactly 0 on every row that counts as constant.
    """
    v.ndim("scores", scores, 2)
    if np.shape(scores)[-1] < 2:
        raise ValueError(f"scores must hold groups of at least 2 responses, got shape {np.shape(scores)}")
    mu = jnp.mean(scores, axis=-1, keepdims=True)
    sd = jnp.std(scores, axis=-1, keepdims=True)
    constant = sd <= CONSTANT_GROUP_RTOL * jnp.max(jnp.abs(scores), axis=-1, keepdims=True)
    return jnp.where(constant, 0.0, (scores - mu) / (sd + eps))


def rloo_advantages(rewards: jax.Array) -> jax.Array:
    """RLOO advantages: ``A_ij = r_ij - (sum_k r_ik - r_ij) / (K - 1)``, the leave-one-out baseline.

    Each response is compared with the mean of the OTHER ``K - 1`` responses of its group (one
    prompt per row), so the baseline never depends on the response it scores and the advantage is
    an unbiased REINFORCE weight. Algebraically ``A_ij = K / (K - 1) * (r_ij - mean_k r_ik)``: the
    group-mean-centred reward scaled up by ``K / (K - 1)``, never divided by a std. A group of equal
    rewards gets 0 (up to float rounding of its sum).

    Args:
      rewards: ``[n_groups, group_size]``, ``group_size >= 2`` (a group of one has no other response).

    Returns:
      ``[n_groups, group_size]``.
    """
    v.ndim("rewards", rewards, 2)
    k = np.shape(rewards)[-1]
    if k < 2:
        raise ValueError(f"rewards must hold groups of at least 2 responses, got shape {np.shape(rewards)}")
    return rewards - (jnp.sum(rewards, axis=-1, keepdims=True) - rewards) / (k - 1)


def _clipped_surrogate(logp, old_logp, advantages, epsilon):
    """``min(rho A, clip(rho, 1 - eps, 1 + eps) A)`` per token, ``rho = exp(logp - old_logp)``; ``[B, T]``."""
    ratio = jnp.exp(logp - jax.lax.stop_gradient(old_logp))
    adv = jax.lax.stop_gradient(advantages)[:, None]
    return jnp.minimum(ratio * adv, jnp.clip(ratio, 1.0 - epsilon, 1.0 + epsilon) * adv)


def rloo_loss(logp, old_logp, advantages, mask, epsilon) -> jax.Array:
    """RLOO per-token loss: ``-min(rho A, clip(rho) A)``, mean over real tokens (the KL is in ``A``).

    Args:
      logp: ``[B, T]`` current policy; old_logp: ``[B, T]`` behaviour policy (frozen); advantages:
      ``[B]`` leave-one-out advantages of the KL-penalised rewards (frozen); mask: ``[B, T]``;
      epsilon: clip range.
    """
    v.same_shape(("logp", "old_logp", "mask"), logp, old_logp, mask)
    v.same_shape(("advantages", "mask[:, 0]"), advantages, mask[:, 0])
    v.epsilon(epsilon)
    return masked_mean(-_clipped_surrogate(logp, old_logp, advantages, epsilon), mask)


def grpo_loss(logp, old_logp, ref_logp, advantages, mask, beta, epsilon) -> jax.Array:
    """GRPO per-token loss: ``-min(rho A, clip(rho) A) + beta * k3(logp, ref_logp)``, mean over real tokens.

    The mean is over every real token of the batch (a token mean, as DAPO), so long responses weigh
    more than short ones; DeepSeekMath's GRPO averages each response's tokens first.

    Args:
      logp: ``[B, T]`` current policy; old_logp: ``[B, T]`` behaviour policy (frozen);
      ref_logp: ``[B, T]`` frozen reference; advantages: ``[B]`` (one per response, broadcast over
      its tokens); mask: ``[B, T]``; beta: KL coefficient; epsilon: clip range.
    """
    v.same_shape(("logp", "old_logp", "ref_logp", "mask"), logp, old_logp, ref_logp, mask)
    v.same_shape(("advantages", "mask[:, 0]"), advantages, mask[:, 0])
    v.beta(beta)
    v.epsilon(epsilon)
    surrogate = _clipped_surrogate(logp, old_logp, advantages, epsilon)
    return masked_mean(-surrogate + beta * k3(logp, jax.lax.stop_gradient(ref_logp)), mask)


@dataclass(frozen=True)
class GRPOConfig:
    """GRPO (and RLOO) hyperparameters. Static: iterations, batch_size, group_size, epochs, minibatch_size, eval_every."""

    iterations: int = 200
    batch_size: int = 128
    group_size: int = 8
    epochs: int = 2
    minibatch_size: int = 32
    eval_every: int = 10
    beta: float = 0.05
    epsilon: float = 0.2
    learning_rate: float = 3e-3
    seed: int = 0

    def __post_init__(self):
        for name in ("iterations", "batch_size", "epochs", "minibatch_size", "eval_every"):
            object.__setattr__(self, name, checks.positive_int(name, getattr(self, name)))
        object.__setattr__(self, "group_size", checks.positive_int("group_size", self.group_size, minimum=2))
        if self.batch_size % self.group_size:
            raise ValueError(f"batch_size ({self.batch_size}) must be a multiple of group_size ({self.group_size})")
        if self.batch_size < self.minibatch_size:
            raise ValueError(f"batch_size ({self.batch_size}) is smaller than minibatch_size ({self.minibatch_size})")
        if self.batch_size % self.minibatch_size:
            raise ValueError(f"batch_size ({self.batch_size}) must be a multiple of minibatch_size ({self.minibatch_size})")
        if self.iterations % self.eval_every:
            raise ValueError(f"iterations ({self.iterations}) must be a multiple of eval_every ({self.eval_every})")
        object.__setattr__(self, "beta", checks.beta(self.beta))
        object.__setattr__(self, "epsilon", checks.epsilon(self.epsilon))
        object.__setattr__(self, "learning_rate", checks.learning_rate(self.learning_rate))
        seed = checks.positive_int("seed", self.seed, minimum=0)
        if seed > MAX_SEED:
            raise ValueError(f"seed must be an integer in [0, {MAX_SEED}], got {seed}")
        object.__setattr__(self, "seed", seed)

    @property
    def static(self) -> tuple:
        return (self.iterations, self.batch_size, self.group_size, self.epochs, self.minibatch_size, self.eval_every)


class CurveResult(NamedTuple):
    """Exact curves of a contrast run (index 0 = before training) and its final policy."""

    eval_step: jax.Array  # [E] iterations (GRPO) or optimiser steps (DPO, oracle)
    gold: jax.Array
    proxy: jax.Array
    exact_score: jax.Array
    kl: jax.Array
    objective: jax.Array  # E[s] - beta KL(pi || pi_ref) with the run's beta
    regret: jax.Array
    policy_params: dict


def _curve(evs, every, params) -> CurveResult:
    return CurveResult(jnp.arange(evs.shape[0]) * every, evs[:, 0], evs[:, 1], evs[:, 2], evs[:, 3], evs[:, 4],
                       evs[:, 5], params)


def _group_core(key, hp, arrays: TaskArrays, *, lang: Language, static: tuple, method: str) -> CurveResult:
    """One critic-free run: GRPO (``method="grpo"``) or RLOO (``"rloo"``); same sampling, epochs, minibatches."""
    TRACE_COUNTS[f"seq_{method}"] += 1
    full, arrays = arrays, rollout_arrays(arrays)  # keep the enumeration tables out of the loop
    iterations, batch_size, group_size, epochs, mb_size, eval_every = static
    n_mb = batch_size // mb_size
    opt = optax.adam(hp["learning_rate"], eps=1e-5)
    params = arrays.ref_params
    # group i holds prompt (i mod P); consecutive group_size responses share a prompt
    prompts = (jnp.arange(batch_size) // group_size % lang.n_prompts).astype(jnp.int32)

    def loss_fn(p, mb):
        tokens, mask, old_logp, ref_logp, adv, pr = mb
        logp = token_logp(p, context_features(lang, pr, tokens), tokens)
        if method == "rloo":
            return rloo_loss(logp, old_logp, adv, mask, hp["epsilon"])
        return grpo_loss(logp, old_logp, ref_logp, adv, mask, hp["beta"], hp["epsilon"])

    def iteration(carry, _):
        params, opt_state, key = carry
        key, ks, kp = jax.random.split(key, 3)
        tokens, mask = sample_responses(ks, params, lang, prompts)
        feats = context_features(lang, prompts, tokens)
        old_logp = token_logp(params, feats, tokens) * mask
        ref_logp = token_logp(arrays.ref_params, feats, tokens) * mask
        score = response_score(arrays, lang, prompts, tokens, mask)
        if method == "rloo":  # the sampled sequence KL (k1 summed over the response) in the reward
            reward = score - hp["beta"] * jnp.sum((old_logp - ref_logp) * mask, axis=1)
            adv = rloo_advantages(reward.reshape(-1, group_size)).reshape(-1)
        else:
            adv = group_advantages(score.reshape(-1, group_size)).reshape(-1)
        data = jax.lax.stop_gradient((tokens, mask, old_logp, ref_logp, adv, prompts))

        perms = jnp.argsort(jax.random.uniform(kp, (epochs, batch_size)), axis=1)

        def epoch(state, perm):
            perm = perm.reshape(n_mb, mb_size)

            def minibatch(state, idx):
                p, s = state
                g = jax.grad(loss_fn)(p, jax.tree_util.tree_map(lambda x: x[idx], data))
                upd, s = opt.update(g, s, p)
                return (optax.apply_updates(p, upd), s), None

            return jax.lax.scan(minibatch, state, perm)[0], None

        (params, opt_state), _ = jax.lax.scan(epoch, (params, opt_state), perms)
        return (params, opt_state, key), None

    def block(carry, _):
        carry, _ = jax.lax.scan(iteration, carry, None, length=eval_every)
        return carry, carry[0]

    carry, snaps = jax.lax.scan(block, (params, opt.init(params), key), None, length=iterations // eval_every)
    snaps = jax.tree_util.tree_map(lambda a, b: jnp.concatenate([a[None], b]), params, snaps)
    evs = jax.lax.map(lambda p: exact_metrics(p, full, lang, hp["beta"]), snaps)
    return _curve(evs, eval_every, carry[0])


@functools.lru_cache(maxsize=None)
def make_grpo(lang: Language, static: tuple, method: str = "grpo"):
    """Compiled ``run(key, hparams, arrays) -> CurveResult`` of GRPO or RLOO (cached per language, config, method)."""
    if method not in ("grpo", "rloo"):
        raise ValueError(f"method must be 'grpo' or 'rloo', got {method!r}")
    return jax.jit(functools.partial(_group_core, lang=lang, static=static, method=method))


def _train_group(task: Task, config: GRPOConfig, method: str) -> CurveResult:
    task = _check_task(task)
    if not isinstance(config, GRPOConfig):
        raise ValueError(f"config must be a GRPOConfig, got {type(config).__name__}")
    hp = {k: jnp.float32(getattr(config, k)) for k in ("beta", "epsilon", "learning_rate")}
    return make_grpo(task.lang, config.static, method)(jax.random.key(config.seed), hp, task.arrays)


def train_grpo(task: Task, config: GRPOConfig = GRPOConfig()) -> CurveResult:
    """One GRPO run on ``task`` (one compiled call), exact curves every ``eval_every`` iterations."""
    return _train_group(task, config, "grpo")


def train_rloo(task: Task, config: GRPOConfig = GRPOConfig()) -> CurveResult:
    """One RLOO run on ``task`` with GRPO's configuration (same groups, batch, epochs, learning rate, beta).

    The differences from :func:`train_grpo` are the two RLOO makes: the leave-one-out baseline
    without a std (:func:`rloo_advantages`) and ``beta`` times the sampled sequence KL in the reward
    instead of ``beta * k3`` in the loss. Exact curves every ``eval_every`` iterations.
    """
    return _train_group(task, config, "rloo")


# ------------------------------------------------------------------------------------------
# DPO and the exact-gradient oracle (full-batch Adam, exact curves)
# ------------------------------------------------------------------------------------------


def dpo_loss(logp_chosen, logp_rejected, ref_logp_chosen, ref_logp_rejected, beta) -> jax.Array:
    """DPO loss: ``mean -log sigmoid(beta [(log pi(y_c) - log pi_ref(y_c)) - (log pi(y_r) - log pi_ref(y_r))])``.

    All four arguments are ``[n]`` SEQUENCE log-probs (current policy for ``logp_*``, frozen
    reference for ``ref_logp_*``); computed with ``softplus`` so large margins cannot underflow.
    """
    v.same_shape(("logp_chosen", "logp_rejected", "ref_logp_chosen", "ref_logp_rejected"),
                 logp_chosen, logp_rejected, ref_logp_chosen, ref_logp_rejected)
    v.beta(beta)
    margin = (logp_chosen - ref_logp_chosen) - (logp_rejected - ref_logp_rejected)
    return jnp.mean(jax.nn.softplus(-beta * margin))


def _adam_curve(loss_fn, params, arrays, lang, beta, lr, steps, eval_every):
    opt = optax.adam(lr)

    def step(carry, _):
        p, s = carry
        g = jax.grad(loss_fn)(p)
        upd, s = opt.update(g, s, p)
        return (optax.apply_updates(p, upd), s), None

    def block(carry, _):
        carry, _ = jax.lax.scan(step, carry, None, length=eval_every)
        return carry, exact_metrics(carry[0], arrays, lang, beta)

    first = exact_metrics(params, arrays, lang, beta)
    carry, evs = jax.lax.scan(block, (params, opt.init(params)), None, length=steps // eval_every)
    return _curve(jnp.concatenate([first[None], evs]), eval_every, carry[0])


def _dpo_core(arrays: TaskArrays, prompts, chosen, rejected, beta, lr, *, lang, steps, eval_every):
    TRACE_COUNTS["seq_dpo"] += 1
    ref_c = arrays.ref_resp_logp[prompts, chosen]
    ref_r = arrays.ref_resp_logp[prompts, rejected]

    def loss_fn(p):
        resp = exact.response_logp(policy_logp(p, arrays.prefix_features), lang)
        return dpo_loss(resp[prompts, chosen], resp[prompts, rejected], ref_c, ref_r, beta)

    return _adam_curve(loss_fn, arrays.ref_params, arrays, lang, beta, lr, steps, eval_every)


@functools.lru_cache(maxsize=None)
def _make_dpo(lang, steps, eval_every):
    return jax.jit(functools.partial(_dpo_core, lang=lang, steps=steps, eval_every=eval_every))


def _check_steps(steps, eval_every):
    steps = checks.positive_int("steps", steps)
    eval_every = checks.positive_int("eval_every", eval_every)
    if steps % eval_every:
        raise ValueError(f"steps ({steps}) must be a multiple of eval_every ({eval_every})")
    return steps, eval_every


def train_dpo(task: Task, beta: float = 0.1, steps: int = 300, learning_rate: float = 3e-3,
              eval_every: int = 10) -> CurveResult:
    """DPO from the reference on ``task.pairs`` (full batch, Adam); ``objective``/``regret`` use the proxy score."""
    task = _check_task(task)
    beta = checks.beta(beta)
    lr = checks.learning_rate(learning_rate)
    steps, eval_every = _check_steps(steps, eval_every)
    pr = task.pairs
    return _make_dpo(task.lang, steps, eval_every)(task.arrays, jnp.asarray(pr.prompts), jnp.asarray(pr.chosen),
                                                   jnp.asarray(pr.rejected), jnp.float32(beta), jnp.float32(lr))


def _oracle_core(arrays: TaskArrays, beta, lr, *, lang, steps, eval_every):
    TRACE_COUNTS["seq_oracle"] += 1

    def loss_fn(p):
        node = policy_logp(p, arrays.prefix_features)
        resp = exact.response_logp(node, lang)
        obj = exact.expectation(resp, arrays.score) - beta * exact.sequence_kl(node, arrays.ref_node_logp, lang)
        return -jnp.mean(obj)

    return _adam_curve(loss_fn, arrays.ref_params, arrays, lang, beta, lr, steps, eval_every)


@functools.lru_cache(maxsize=None)
def _make_oracle(lang, steps, eval_every):
    return jax.jit(functools.partial(_oracle_core, lang=lang, steps=steps, eval_every=eval_every))


def exact_gradient_ascent(task: Task, beta: float = 0.05, steps: int = 400, learning_rate: float = 1e-2,
                          eval_every: int = 10) -> CurveResult:
    """Maximise the exact ``mean_p [E_pi[s] - beta KL(pi || pi_ref)]`` by Adam from the reference (no sampling)."""
    task = _check_task(task)
    beta = checks.beta(beta)
    lr = checks.learning_rate(learning_rate)
    steps, eval_every = _check_steps(steps, eval_every)
    return _make_oracle(task.lang, steps, eval_every)(task.arrays, jnp.float32(beta), jnp.float32(lr))
