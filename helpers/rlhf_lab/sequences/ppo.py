"""PPO on sequences, as in the RLHF anchors (Ziegler et al. 2019; Stiennon et al. 2020; Ouyang et al. 2022).

Four objects with four lifetimes; the argument names keep them apart:

* ``params`` / ``logp``   -- the **current** policy; changes on every optimiser step.
* ``old_logp``            -- per-token log-probs of the **behaviour** policy that sampled the batch,
                             computed ONCE right after sampling and frozen while the batch is reused
                             for ``epochs`` passes (recomputing them inside the epochs makes the
                             ratio 1 at every step and silently switches clipping off).
* ``ref_logp``            -- per-token log-probs of the frozen **reference** (SFT) policy; fixed for
                             the whole run. The KL penalty is measured against it, never against
                             the old policy.
* ``score``               -- the frozen **reward model**'s score of each whole response.

One iteration: sample ``batch_size`` responses (prompts cycle), compute ``old_logp``, ``ref_logp``
and the old values once, build per-token rewards (:func:`per_token_rewards`), GAE advantages
(:func:`gae`), whiten them over real tokens (:func:`whiten`), then ``epochs`` passes of shuffled
minibatches of the clipped policy loss plus the clipped value loss (Adam, one optimiser for the
two separate networks). The whole run is ONE compiled call (``lax.scan``); beta, epsilon, the
learning rate and lambda (and gamma, the value clip, the KL-controller target) are traced, so
changing them never recompiles; :func:`sweep` adds ``vmap`` over betas and seeds.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass, replace
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax

from .. import checks
from ..trainer import MAX_SEED, TRACE_COUNTS
from . import _validate as v
from . import exact
from .language import Language, context_features, masked_mean, response_mask, step_features
from .policy import init_value, policy_logits, token_logp, value
from .preferences import proxy_features
from .gold import response_stats
from .task import Task, TaskArrays

# ------------------------------------------------------------------------------------------
# Small pure functions (the pieces students re-implement)
# ------------------------------------------------------------------------------------------


def last_token(mask: jax.Array) -> jax.Array:
    """One-hot of the last real token of each response, ``[B, T]`` (the EOS, or the last token if truncated).

    Classic mistake it avoids: putting the score on the final column ``T - 1`` (a padding
    position for every response that ended early) or on the first padding position.
    """
    length = jnp.sum(mask, axis=-1).astype(jnp.int32)
    return jax.nn.one_hot(length - 1, mask.shape[-1], dtype=jnp.float32) * (length > 0)[..., None]


def per_token_rewards(logp: jax.Array, ref_logp: jax.Array, score: jax.Array, mask: jax.Array, beta) -> jax.Array:
    """KL-shaped per-token rewards: ``r_t = -beta (log pi(y_t) - log pi_ref(y_t)) m_t + s 1{t = last real token}``.

    Args:
      logp: ``[B, T]`` log-probs of the sampled tokens under the policy that SAMPLED them (the old
        policy, frozen for the batch).
      ref_logp: ``[B, T]`` log-probs of the same tokens under the frozen reference.
      score: ``[B]`` reward-model score of each whole response (missing-EOS penalty included).
      mask: ``[B, T]`` real-token mask (EOS included).
      beta: KL coefficient > 0.

    Returns:
      ``[B, T]`` rewards, 0 on padding. Summed over a response they give
      ``s - beta * (log pi(y) - log pi_ref(y))``, a one-sample (k1) estimate of the objective.
      Classic mistakes: ``+beta`` instead of ``-beta`` (rewards drifting away from the reference);
      ``ref_logp`` replaced by the old policy's log-probs (a penalty that is identically 0); the
      score on a padding position.
    """
    v.same_shape(("logp", "ref_logp", "mask"), logp, ref_logp, mask)
    v.ndim("logp", logp, 2)
    v.same_shape(("score", "mask[:, 0]"), score, mask[:, 0])
    v.beta(beta)
    return -beta * (logp - ref_logp) * mask + score[..., None] * last_token(mask)


def gae(rewards: jax.Array, values: jax.Array, mask: jax.Array, gamma, lam):
    """Generalised advantage estimation over the real tokens of each response.

    ``delta_t = r_t + gamma V_{t+1} m_{t+1} - V_t``,  ``A_t = delta_t + gamma lam m_{t+1} A_{t+1}``,
    with ``V`` and ``A`` zero after the last real token (the episode ends there: no bootstrap).
    ``returns = A + V`` is the value target. ``lam = 1, gamma = 1`` gives ``A_t = sum_{u>=t} r_u - V_t``;
    ``lam = 0`` gives the one-step TD error.

    Args:
      rewards, values, mask: ``[B, T]`` (values are the OLD values, frozen with the batch).
      gamma: discount in [0, 1]; lam: GAE lambda in [0, 1].

    Returns:
      ``(advantages [B, T], returns [B, T])``, both 0 on padding.
    """
    v.same_shape(("rewards", "values", "mask"), rewards, values, mask)
    v.ndim("rewards", rewards, 2)
    v.unit_interval("gamma", gamma, "discount")
    v.unit_interval("lam", lam, "GAE lambda")
    return _gae(rewards, values, mask, gamma, lam)


@jax.jit
def _gae(rewards, values, mask, gamma, lam):
    """:func:`gae` after validation, compiled once per shape (gamma and lam are traced, not constants)."""
    values = values * mask
    next_mask = jnp.concatenate([mask[:, 1:], jnp.zeros_like(mask[:, :1])], axis=1)
    next_values = jnp.concatenate([values[:, 1:], jnp.zeros_like(values[:, :1])], axis=1)
    deltas = (rewards + gamma * next_values * next_mask - values) * mask

    def back(carry, x):
        delta, nm, m = x
        adv = (delta + gamma * lam * nm * carry) * m
        return adv, adv

    _, adv = jax.lax.scan(back, jnp.zeros(rewards.shape[0], rewards.dtype),
                          (deltas.T, next_mask.T, mask.T), reverse=True)
    adv = adv.T
    return adv, (adv + values) * mask


def whiten(advantages: jax.Array, mask: jax.Array, eps: float = 1e-8) -> jax.Array:
    """Normalise advantages to mean 0, std 1 over the REAL tokens only; padding stays 0.

    ``mu = sum(A m) / sum(m)``, ``var = sum((A - mu)^2 m) / sum(m)``, ``A' = (A - mu) / sqrt(var + eps) * m``.
    Classic mistake: whitening over padding too (its zeros drag the mean and shrink the variance).
    """
    v.same_shape(("advantages", "mask"), advantages, mask)
    mu = masked_mean(advantages, mask)
    var = masked_mean((advantages - mu) ** 2, mask)
    return (advantages - mu) * jax.lax.rsqrt(var + eps) * mask


def policy_loss(logp: jax.Array, old_logp: jax.Array, advantages: jax.Array, mask: jax.Array, epsilon) -> jax.Array:
    """Clipped policy loss (to minimise), averaged over real tokens.

    ``L = -sum_t m_t min(rho_t A_t, clip(rho_t, 1-eps, 1+eps) A_t) / sum_t m_t``, ``rho_t = exp(logp_t - old_logp_t)``.

    Args:
      logp: ``[B, T]`` current policy; old_logp: ``[B, T]`` behaviour policy (frozen);
      advantages: ``[B, T]`` (frozen, whitened); mask: ``[B, T]``; epsilon: clip range in (0, 1).
    """
    v.same_shape(("logp", "old_logp", "advantages", "mask"), logp, old_logp, advantages, mask)
    v.epsilon(epsilon)
    ratio = jnp.exp(logp - jax.lax.stop_gradient(old_logp))
    adv = jax.lax.stop_gradient(advantages)
    surrogate = jnp.minimum(ratio * adv, jnp.clip(ratio, 1.0 - epsilon, 1.0 + epsilon) * adv)
    return -masked_mean(surrogate, mask)


def value_loss(values: jax.Array, old_values: jax.Array, returns: jax.Array, mask: jax.Array, value_clip) -> jax.Array:
    """Clipped value loss over real tokens (PPO2 / lm-human-preferences style).

    ``v_clip = old_v + clip(v - old_v, -c, c)``, ``L = 0.5 sum_t m_t max((v - R)^2, (v_clip - R)^2) / sum_t m_t``.
    Classic mistake: averaging over padding positions (fits the critic to zeros that are never used).
    """
    v.same_shape(("values", "old_values", "returns", "mask"), values, old_values, returns, mask)
    v.positive("value_clip", value_clip)
    old_values = jax.lax.stop_gradient(old_values)
    returns = jax.lax.stop_gradient(returns)
    v_clip = old_values + jnp.clip(values - old_values, -value_clip, value_clip)
    return 0.5 * masked_mean(jnp.maximum((values - returns) ** 2, (v_clip - returns) ** 2), mask)


def adaptive_kl_update(beta, kl, target, horizon, n_steps):
    """Ziegler et al. (2019) adaptive KL controller.

    ``e = clip(KL / KL_target - 1, -0.2, 0.2)``, ``beta <- beta (1 + e n_steps / horizon)``, where
    ``KL`` is the batch's mean sequence KL (sum of ``k1`` over tokens) and ``n_steps`` the batch size.
    """
    v.beta(beta)
    v.positive("target", target)
    v.positive("horizon", horizon)
    err = jnp.clip(kl / target - 1.0, -0.2, 0.2)
    return beta * (1.0 + err * n_steps / horizon)


# ------------------------------------------------------------------------------------------
# Sampling
# ------------------------------------------------------------------------------------------


def sample_responses(key, params: dict, lang: Language, prompts: jax.Array):
    """Sample one response per prompt from the policy ``params`` (autoregressive, ``max_len`` steps).

    Gumbel-max sampling: ``y_t = argmax_a (logits_t[a] + g_t[a])`` with all Gumbel noise ``g`` drawn
    up front in one call. After EOS every position is PAD.

    Returns:
      ``(tokens [B, T] int32, mask [B, T] float32)``.
    """
    b = prompts.shape[0]
    noise = jax.random.gumbel(key, (lang.max_len, b, lang.n_actions))

    def step(carry, x):
        prev, counts, done = carry
        t, g = x
        feats = step_features(lang, prompts, t, prev, counts)
        tok = jnp.argmax(policy_logits(params, feats) + g, axis=-1).astype(jnp.int32)
        tok = jnp.where(done, lang.pad, tok)
        counts = counts + jax.nn.one_hot(tok, lang.n_tokens)  # EOS/PAD add nothing
        done = done | (tok == lang.eos)
        return (jnp.minimum(tok, lang.n_tokens), counts, done), tok

    init = (jnp.full((b,), lang.n_tokens, jnp.int32), jnp.zeros((b, lang.n_tokens)), jnp.zeros((b,), bool))
    _, toks = jax.lax.scan(step, init, (jnp.arange(lang.max_len), noise))
    tokens = toks.T
    return tokens, response_mask(tokens, lang.eos, lang.pad)


def response_score(arrays: TaskArrays, lang: Language, prompts, tokens, mask) -> jax.Array:
    """Training score ``s(y) = proxy(y) - missing_eos_penalty * 1{no EOS}``, ``[B]`` (reward model frozen)."""
    counts, length, has_eos = response_stats(tokens, mask, lang.n_tokens, lang.eos)
    proxy = proxy_features(lang, prompts, counts, length, has_eos) @ arrays.proxy_weights + arrays.proxy_bias
    return proxy - arrays.missing_eos_penalty * (1.0 - has_eos)


# ------------------------------------------------------------------------------------------
# Configuration and results
# ------------------------------------------------------------------------------------------

STATIC_FIELDS = ("iterations", "batch_size", "epochs", "minibatch_size", "eval_every", "adaptive_kl")
TRACED_FIELDS = ("beta", "epsilon", "learning_rate", "lam", "gamma", "value_clip", "kl_target", "kl_horizon")


@dataclass(frozen=True)
class SeqPPOConfig:
    """Hyperparameters of one sequence-level PPO run (defaults: the course's configuration).

    Static (a new value compiles a new program): ``iterations``, ``batch_size``, ``epochs``,
    ``minibatch_size``, ``eval_every`` (exact evaluation every that many iterations) and
    ``adaptive_kl``. Traced: ``beta`` (initial beta when adaptive), ``epsilon``, ``learning_rate``,
    ``lam``, ``gamma``, ``value_clip``, ``kl_target``, ``kl_horizon``; and ``seed``.
    """

    iterations: int = 200
    batch_size: int = 128
    epochs: int = 2
    minibatch_size: int = 32
    eval_every: int = 10
    adaptive_kl: bool = False
    beta: float = 0.05
    epsilon: float = 0.2
    learning_rate: float = 3e-3
    lam: float = 0.95
    gamma: float = 1.0
    value_clip: float = 0.2
    kl_target: float = 3.0
    kl_horizon: float = 10000.0
    seed: int = 0

    def __post_init__(self):
        for name in ("iterations", "batch_size", "epochs", "minibatch_size", "eval_every"):
            object.__setattr__(self, name, checks.positive_int(name, getattr(self, name)))
        if self.batch_size < self.minibatch_size:
            raise ValueError(f"batch_size ({self.batch_size}) is smaller than minibatch_size ({self.minibatch_size}); "
                             "a batch must hold at least one minibatch")
        if self.batch_size % self.minibatch_size:
            raise ValueError(f"batch_size ({self.batch_size}) must be a multiple of minibatch_size ({self.minibatch_size})")
        if self.iterations % self.eval_every:
            raise ValueError(f"iterations ({self.iterations}) must be a multiple of eval_every ({self.eval_every})")
        if not isinstance(self.adaptive_kl, (bool, np.bool_)):
            raise ValueError(f"adaptive_kl must be True or False, got {self.adaptive_kl!r}")
        object.__setattr__(self, "beta", checks.beta(self.beta))
        object.__setattr__(self, "epsilon", checks.epsilon(self.epsilon))
        object.__setattr__(self, "learning_rate", checks.learning_rate(self.learning_rate))
        for name in ("lam", "gamma"):
            v = checks.finite_scalar(name, getattr(self, name))
            if not 0.0 <= v <= 1.0:
                raise ValueError(f"{name} must lie in [0, 1], got {v}")
            object.__setattr__(self, name, v)
        for name in ("value_clip", "kl_target", "kl_horizon"):
            v = checks.finite_scalar(name, getattr(self, name))
            if v <= 0:
                raise ValueError(f"{name} must be > 0, got {v}")
            object.__setattr__(self, name, v)
        seed = checks.positive_int("seed", self.seed, minimum=0)
        if seed > MAX_SEED:
            raise ValueError(f"seed must be an integer in [0, {MAX_SEED}], got {seed}")
        object.__setattr__(self, "seed", seed)

    @property
    def static(self) -> tuple:
        """The part of the configuration that fixes the compiled program."""
        return tuple(getattr(self, f) for f in STATIC_FIELDS)

    def hparams(self) -> dict:
        """The traced hyperparameters as float32 scalars (a pytree)."""
        return {f: jnp.asarray(np.float32(getattr(self, f))) for f in TRACED_FIELDS}


class Batch(NamedTuple):
    """One rollout batch, everything frozen when it was collected (``[B, T]`` unless stated)."""

    prompts: jax.Array  # [B]
    tokens: jax.Array
    mask: jax.Array
    old_logp: jax.Array  # behaviour policy, computed once after sampling
    ref_logp: jax.Array  # frozen reference
    old_values: jax.Array
    score: jax.Array  # [B]
    rewards: jax.Array
    advantages: jax.Array  # whitened over real tokens
    returns: jax.Array


class SeqTrainResult(NamedTuple):
    """What one run records (a sweep adds leading ``[n_beta, n_seed]`` axes).

    Per iteration ``[iterations]``: sampled means. Per evaluation ``[iterations // eval_every + 1]``
    (index 0 = before training): exact numbers by enumeration.
    """

    score: jax.Array  # [I] mean training score of the batch (sampled)
    sampled_kl: jax.Array  # [I] mean over the batch of sum_t (old_logp - ref_logp) (k1)
    beta: jax.Array  # [I] beta used for that batch (changes only with adaptive_kl)
    clip_frac: jax.Array  # [I] fraction of real tokens whose ratio left [1-eps, 1+eps]
    policy_loss: jax.Array  # [I]
    value_loss: jax.Array  # [I]
    eval_iteration: jax.Array  # [E] iteration count of each exact evaluation
    gold: jax.Array  # [E] exact E_pi[gold], prompts averaged
    proxy: jax.Array  # [E] exact E_pi[proxy]
    exact_score: jax.Array  # [E] exact E_pi[s]
    kl: jax.Array  # [E] exact sequence KL(pi || pi_ref), nats
    objective: jax.Array  # [E] exact E_pi[s] - beta KL with the configured beta
    regret: jax.Array  # [E] J(pi*_beta) - J(pi)
    policy_params: dict  # final policy
    value_params: dict  # final critic
    last_batch: Batch  # the last rollout batch


# ------------------------------------------------------------------------------------------
# The compiled run
# ------------------------------------------------------------------------------------------


def collect(key, policy_params, value_params, arrays: TaskArrays, lang: Language, batch_size: int, beta, gamma, lam) -> Batch:
    """Sample a batch and freeze everything the epochs reuse (old log-probs, values, advantages)."""
    prompts = jnp.arange(batch_size, dtype=jnp.int32) % lang.n_prompts
    tokens, mask = sample_responses(key, policy_params, lang, prompts)
    feats = context_features(lang, prompts, tokens)
    old_logp = token_logp(policy_params, feats, tokens) * mask
    ref_logp = token_logp(arrays.ref_params, feats, tokens) * mask
    old_values = value(value_params, feats) * mask
    score = response_score(arrays, lang, prompts, tokens, mask)
    rewards = per_token_rewards(old_logp, ref_logp, score, mask, beta)
    adv, returns = gae(rewards, old_values, mask, gamma, lam)
    batch = Batch(prompts, tokens, mask, old_logp, ref_logp, old_values, score, rewards, whiten(adv, mask), returns)
    return jax.tree_util.tree_map(jax.lax.stop_gradient, batch)


def ppo_minibatch_loss(params: dict, mb: Batch, lang: Language, epsilon, value_clip):
    """Total loss of one minibatch: :func:`policy_loss` + :func:`value_loss` (separate networks)."""
    feats = context_features(lang, mb.prompts, mb.tokens)
    logp = token_logp(params["policy"], feats, mb.tokens)
    values = value(params["value"], feats)
    pl = policy_loss(logp, mb.old_logp, mb.advantages, mb.mask, epsilon)
    vl = value_loss(values, mb.old_values, mb.returns, mb.mask, value_clip)
    ratio = jnp.exp(logp - mb.old_logp)
    clipped = masked_mean((jnp.abs(ratio - 1.0) > epsilon).astype(jnp.float32), mb.mask)
    return pl + vl, (pl, vl, clipped)


def exact_metrics(policy_params, arrays: TaskArrays, lang: Language, beta) -> jax.Array:
    """``[gold, proxy, score, kl, objective, regret]`` of a policy, exact, prompts averaged."""
    node = exact.prefix_logp(policy_params, arrays.prefix_features)
    resp = exact.response_logp(node, lang)
    kl = exact.sequence_kl(node, arrays.ref_node_logp, lang)
    score = exact.expectation(resp, arrays.score)
    obj = score - beta * kl
    opt = exact.optimal_objective(arrays.ref_resp_logp, arrays.score, beta)
    return jnp.stack([jnp.mean(exact.expectation(resp, arrays.gold)), jnp.mean(exact.expectation(resp, arrays.proxy)),
                      jnp.mean(score), jnp.mean(kl), jnp.mean(obj), jnp.mean(opt - obj)])


def make_iteration(lang: Language, static: tuple):
    """The un-jitted body of one PPO iteration: ``(carry, hp, arrays) -> (carry, metrics)``.

    ``carry = (params {"policy", "value"}, opt_state, key, beta)``.
    """
    _, batch_size, epochs, minibatch_size, _, adaptive = static
    n_mb = batch_size // minibatch_size
    grad_fn = jax.value_and_grad(ppo_minibatch_loss, has_aux=True)

    def iteration(carry, hp, arrays: TaskArrays):
        params, opt_state, key, beta = carry
        opt = optax.adam(hp["learning_rate"], eps=1e-5)
        key, k_sample, k_perm = jax.random.split(key, 3)
        batch = collect(k_sample, params["policy"], params["value"], arrays, lang, batch_size, beta, hp["gamma"], hp["lam"])

        perms = jnp.argsort(jax.random.uniform(k_perm, (epochs, batch_size)), axis=1)

        def epoch(state, perm):
            perm = perm.reshape(n_mb, minibatch_size)

            def minibatch(state, idx):
                params, opt_state = state
                mb = jax.tree_util.tree_map(lambda x: x[idx], batch)
                (_, aux), g = grad_fn(params, mb, lang, hp["epsilon"], hp["value_clip"])
                upd, opt_state = opt.update(g, opt_state, params)
                return (optax.apply_updates(params, upd), opt_state), jnp.stack(aux)

            return jax.lax.scan(minibatch, state, perm)

        (params, opt_state), aux = jax.lax.scan(epoch, (params, opt_state), perms)
        aux = aux.reshape(-1, 3).mean(axis=0)
        seq_kl = jnp.mean(jnp.sum(batch.old_logp - batch.ref_logp, axis=1))
        new_beta = adaptive_kl_update(beta, seq_kl, hp["kl_target"], hp["kl_horizon"], batch_size) if adaptive else beta
        metrics = dict(score=jnp.mean(batch.score), sampled_kl=seq_kl, beta=beta, clip_frac=aux[2],
                       policy_loss=aux[0], value_loss=aux[1])
        return (params, opt_state, key, new_beta), (metrics, batch)

    return iteration


def init_carry(key, arrays: TaskArrays, hp: dict, hidden: int, lang: Language):
    """Initial ``(params, opt_state, key, beta)``: policy = reference copy, critic random, Adam zeroed."""
    key, k_value = jax.random.split(key)
    params = {"policy": arrays.ref_params, "value": init_value(k_value, lang.n_features, hidden)}
    opt_state = optax.adam(hp["learning_rate"], eps=1e-5).init(params)
    return params, opt_state, key, hp["beta"]


def rollout_arrays(arrays: TaskArrays) -> TaskArrays:
    """The task arrays a PPO iteration needs (reference and reward model), without the enumeration tables.

    Loops carry every array they use from one iteration to the next; keeping the tables (several
    MB) out of the training loop keeps each iteration cheap. Exact evaluation happens outside it.
    """
    return arrays._replace(prefix_features=None, gold=None, proxy=None, score=None, ref_node_logp=None,
                           ref_resp_logp=None)


def train_core(key, hp: dict, arrays: TaskArrays, *, lang: Language, static: tuple, hidden: int) -> SeqTrainResult:
    """One whole run as a pure function (un-jitted; see :func:`make_train`).

    The training loop is ``lax.scan`` over blocks of ``eval_every`` iterations; each block emits a
    snapshot of the policy parameters, and all snapshots (plus the initial policy) are evaluated
    exactly afterwards in one batched pass.
    """
    TRACE_COUNTS["seq_train"] += 1
    iterations, _, _, _, eval_every, _ = static
    iteration = make_iteration(lang, static)
    small = rollout_arrays(arrays)
    carry = init_carry(key, arrays, hp, hidden, lang)
    policy0 = carry[0]["policy"]

    def block(carry, _):
        carry, (metrics, batches) = jax.lax.scan(lambda c, _: iteration(c, hp, small), carry, None, length=eval_every)
        last = jax.tree_util.tree_map(lambda x: x[-1], batches)
        return carry, (metrics, carry[0]["policy"], last)

    carry, (metrics, snapshots, lasts) = jax.lax.scan(block, carry, None, length=iterations // eval_every)
    metrics = jax.tree_util.tree_map(lambda x: x.reshape(-1), metrics)
    snapshots = jax.tree_util.tree_map(lambda a, b: jnp.concatenate([a[None], b]), policy0, snapshots)
    evs = jax.lax.map(lambda p: exact_metrics(p, arrays, lang, hp["beta"]), snapshots)  # one at a time: cheaper than vmap
    n_eval = iterations // eval_every
    return SeqTrainResult(
        eval_iteration=jnp.arange(n_eval + 1) * eval_every,
        gold=evs[:, 0], proxy=evs[:, 1], exact_score=evs[:, 2], kl=evs[:, 3], objective=evs[:, 4], regret=evs[:, 5],
        policy_params=carry[0]["policy"], value_params=carry[0]["value"],
        last_batch=jax.tree_util.tree_map(lambda x: x[-1], lasts), **metrics,
    )


@functools.lru_cache(maxsize=None)
def make_train(lang: Language, static: tuple, hidden: int):
    """Compiled ``train(key, hparams, arrays) -> SeqTrainResult`` (cached per language, static config and width)."""
    return jax.jit(functools.partial(train_core, lang=lang, static=static, hidden=hidden))


def _check_task(task) -> Task:
    if not isinstance(task, Task):
        raise ValueError(f"task must be a rlhf_lab.sequences.Task (see make_task), got {type(task).__name__}")
    return task


def _check_config(config) -> SeqPPOConfig:
    if not isinstance(config, SeqPPOConfig):
        raise ValueError(f"config must be a SeqPPOConfig, got {type(config).__name__}")
    return config


def train(task: Task, config: SeqPPOConfig = SeqPPOConfig()) -> SeqTrainResult:
    """Validate, then run one compiled PPO run of ``config`` on ``task``."""
    task, config = _check_task(task), _check_config(config)
    fn = make_train(task.lang, config.static, task.hidden)
    return fn(jax.random.key(config.seed), config.hparams(), task.arrays)


def _sweep_core(keys, betas, hp, arrays, *, lang, static, hidden):
    TRACE_COUNTS["seq_sweep"] += 1
    run = functools.partial(train_core, lang=lang, static=static, hidden=hidden)

    def one(k, b):
        return run(k, {**hp, "beta": b}, arrays)

    return jax.vmap(lambda b: jax.vmap(lambda k: one(k, b))(keys))(betas)


@functools.lru_cache(maxsize=None)
def make_sweep(lang: Language, static: tuple, hidden: int):
    """Compiled ``sweep(keys[S], betas[B], hparams, arrays)`` (``vmap`` over betas, then seeds)."""
    return jax.jit(functools.partial(_sweep_core, lang=lang, static=static, hidden=hidden))


def sweep(task: Task, config: SeqPPOConfig, betas, seeds) -> SeqTrainResult:
    """Train one run per (beta, seed) in ONE compiled call; every field gains leading ``[n_beta, n_seed]`` axes.

    ``config`` supplies everything but beta and the seed.
    """
    task, config = _check_task(task), _check_config(config)
    betas = checks.finite_vector("betas", betas)
    for b in betas:
        checks.beta(b, "betas")
    seeds = np.asarray(seeds)
    if (seeds.ndim != 1 or seeds.size == 0 or not np.issubdtype(seeds.dtype, np.integer)
            or seeds.min() < 0 or seeds.max() > MAX_SEED):
        raise ValueError(f"seeds must be a non-empty 1-D array of integers in [0, {MAX_SEED}], got {seeds!r}")
    keys = jax.vmap(jax.random.key)(jnp.asarray(seeds, jnp.uint32))
    fn = make_sweep(task.lang, config.static, task.hidden)
    return fn(keys, jnp.asarray(betas, jnp.float32), config.hparams(), task.arrays)


# ------------------------------------------------------------------------------------------
# The same algorithm as a Python loop of jitted steps (the benchmark's baseline)
# ------------------------------------------------------------------------------------------


@functools.lru_cache(maxsize=None)
def make_step(lang: Language, static: tuple, hidden: int):
    """Jitted ``(init(key, hp, arrays), step(carry, hp, arrays), evaluate(policy_params, arrays, beta))``."""
    iteration = make_iteration(lang, static)
    init = jax.jit(functools.partial(init_carry, hidden=hidden, lang=lang))
    step = jax.jit(iteration)
    evaluate = jax.jit(functools.partial(exact_metrics, lang=lang))
    return init, step, evaluate


def train_python_loop(task: Task, config: SeqPPOConfig = SeqPPOConfig()) -> dict:
    """The same run driven from Python: one jitted call per iteration, exact evaluation every ``eval_every``.

    Returns a dict with ``gold``, ``proxy``, ``kl`` (per evaluation, NumPy) and the final ``policy_params``.
    """
    task, config = _check_task(task), _check_config(config)
    init, step, evaluate = make_step(task.lang, config.static, task.hidden)
    hp = config.hparams()
    carry = init(jax.random.key(config.seed), task.arrays, hp)
    evs = [evaluate(carry[0]["policy"], task.arrays, beta=hp["beta"])]
    small = rollout_arrays(task.arrays)
    for i in range(config.iterations):
        carry, _ = step(carry, hp, small)
        if (i + 1) % config.eval_every == 0:
            evs.append(evaluate(carry[0]["policy"], task.arrays, beta=hp["beta"]))
    evs = np.asarray(jnp.stack(evs))
    return dict(gold=evs[:, 0], proxy=evs[:, 1], exact_score=evs[:, 2], kl=evs[:, 3], objective=evs[:, 4],
                regret=evs[:, 5], policy_params=carry[0]["policy"])


def with_config(config: SeqPPOConfig, **changes) -> SeqPPOConfig:
    """A validated copy of ``config`` with some fields changed."""
    return replace(_check_config(config), **changes)
