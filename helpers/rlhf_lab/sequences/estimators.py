"""KL estimators k1, k2, k3, the exact per-token KL, and where each one may be placed.

For a token ``a`` sampled from the current policy ``pi`` and the log-ratio
``log r = log pi_ref(a) - log pi(a)``::

    k1 = -log r = log pi(a) - log pi_ref(a)        unbiased for KL(pi || pi_ref), can be negative
    k2 = (log r)^2 / 2                              biased, >= 0, low variance
    k3 = (r - 1) - log r                            unbiased, >= 0, low variance NEAR pi_ref (Schulman 2020)

k3's low variance holds only while ``r`` stays near 1. Far from the reference a sampled token with
``pi_ref(a) >> pi(a)`` makes ``k3 ~ r`` explode while ``k1 = -log r`` grows like a logarithm: for the
policy trained by the default ``SeqPPOConfig()`` run (sequence KL about 10 nats) the exact standard
deviation, over responses, of k3 summed over a response's tokens is about 26 times that of k1
(prompts pooled; by enumeration), while for a policy a tenth of the way there (KL 0.14 nats) it is
about a quarter of k1's. Monte Carlo samples of a few thousand responses underestimate the far
value, because the tail is rare.

Their VALUES estimate the KL; their GRADIENTS depend on where they are placed:

* ``k1`` in the REWARD (a constant reward, differentiated through the score function,
  ``E[k1 * grad log pi]``) gives exactly ``grad KL(pi || pi_ref)`` (PPO's placement);
* ``k1`` in the LOSS (``grad k1 = grad log pi``) has expectation 0: no KL gradient at all;
* ``k2`` in the loss gives ``E[(log pi - log pi_ref) grad log pi] = grad KL(pi || pi_ref)`` per token;
* ``k3`` in the loss gives ``E[(1 - pi_ref/pi) grad log pi] = grad KL(pi_ref || pi)``: the gradient
  of the REVERSE KL (GRPO's placement), not of the KL whose value it estimates.

"In the loss" means: the sampled tokens (and so the sampling distribution) are held fixed and the
estimator's value is differentiated. :func:`placement_gradients` computes each placement's exact
expected gradient by summing over all actions; :func:`sequence_placement_gradients` does the same
for whole responses by enumeration, where per-token k2 in the loss also misses the effect of a
token on the KL of the tokens after it.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from .. import checks
from . import _validate as v
from . import exact
from .language import Language, prefix_tree
from .policy import policy_logp


def k1(logp: jax.Array, ref_logp: jax.Array) -> jax.Array:
    """``k1 = log pi(a) - log pi_ref(a)`` for sampled tokens (current policy, frozen reference)."""
    v.same_shape(("logp", "ref_logp"), logp, ref_logp)
    return logp - ref_logp


def k2(logp: jax.Array, ref_logp: jax.Array) -> jax.Array:
    """``k2 = (log pi(a) - log pi_ref(a))^2 / 2``."""
    v.same_shape(("logp", "ref_logp"), logp, ref_logp)
    return 0.5 * (logp - ref_logp) ** 2


def k3(logp: jax.Array, ref_logp: jax.Array) -> jax.Array:
    """``k3 = exp(log pi_ref(a) - log pi(a)) - 1 - (log pi_ref(a) - log pi(a))`` (``expm1`` for accuracy).

    Unbiased for ``KL(pi || pi_ref)`` and never negative; its variance is small only near the
    reference (see the module docstring: far from it, it is many times k1's).
    """
    v.same_shape(("logp", "ref_logp"), logp, ref_logp)
    log_r = ref_logp - logp
    return jnp.expm1(log_r) - log_r


def exact_token_kl(logp_all: jax.Array, ref_logp_all: jax.Array) -> jax.Array:
    """Exact per-token ``KL(pi(.|x) || pi_ref(.|x)) = sum_a pi(a|x) (log pi(a|x) - log pi_ref(a|x))``.

    Args:
      logp_all, ref_logp_all: ``[..., n_actions]`` full next-token log-probabilities.

    Returns:
      ``[...]`` in nats (0 exactly when the two agree).
    """
    v.same_shape(("logp_all", "ref_logp_all"), logp_all, ref_logp_all)
    return jnp.sum(jnp.exp(logp_all) * (logp_all - ref_logp_all), axis=-1)


ESTIMATORS = {"k1": k1, "k2": k2, "k3": k3}


def _check_logits(logits, ref_logp):
    la = checks.finite_vector("logits", logits)
    ra = checks.finite_vector("ref_logp", ref_logp, size=la.shape[-1])
    if la.shape[0] < 2:
        raise ValueError(f"logits must have at least 2 actions, got {la.shape[0]}")
    return jnp.asarray(la, jnp.float32), jax.nn.log_softmax(jnp.asarray(ra, jnp.float32))


def expected_estimates(logits, ref_logp) -> dict:
    """Exact expectations ``E_{a ~ pi}[k(a)]`` of k1, k2, k3 and the exact KL, one distribution.

    Args:
      logits: ``[n]`` current policy logits; ref_logp: ``[n]`` reference log-probs (renormalised).

    Returns:
      ``{"k1", "k2", "k3", "kl", "reverse_kl"}`` floats (``E[k1] = E[k3] = kl``; ``E[k2] ~ kl`` only near ``pi_ref``).
    """
    logits, ref = _check_logits(logits, ref_logp)
    logp = jax.nn.log_softmax(logits)
    p = jnp.exp(logp)
    out = {name: float(jnp.sum(p * fn(logp, ref))) for name, fn in ESTIMATORS.items()}
    out["kl"] = float(exact_token_kl(logp, ref))
    out["reverse_kl"] = float(exact_token_kl(ref, logp))
    return out


def _placements(logits, ref):
    def weights(z):
        return jax.lax.stop_gradient(jnp.exp(jax.nn.log_softmax(z)))

    def k1_reward(z):  # score function with the KL as a detached reward
        logp = jax.nn.log_softmax(z)
        return jnp.sum(weights(z) * jax.lax.stop_gradient(k1(logp, ref)) * logp)

    def in_loss(fn):
        return lambda z: jnp.sum(weights(z) * fn(jax.nn.log_softmax(z), ref))

    return {
        "k1_in_reward": k1_reward,
        "k1_in_loss": in_loss(k1),
        "k2_in_loss": in_loss(k2),
        "k3_in_loss": in_loss(k3),
        "kl": lambda z: exact_token_kl(jax.nn.log_softmax(z), ref),
        "reverse_kl": lambda z: exact_token_kl(ref, jax.nn.log_softmax(z)),
    }


def placement_gradients(logits, ref_logp) -> dict:
    """Exact expected gradient (w.r.t. the logits) of each placement, summed over all actions.

    Keys: ``k1_in_reward``, ``k1_in_loss``, ``k2_in_loss``, ``k3_in_loss`` and the autodiff
    gradients ``kl`` (of ``KL(pi || pi_ref)``) and ``reverse_kl`` (of ``KL(pi_ref || pi)``), each ``[n]``.
    Expected: ``k1_in_reward = k2_in_loss = kl``, ``k3_in_loss = reverse_kl``, ``k1_in_loss = 0``.
    """
    logits, ref = _check_logits(logits, ref_logp)
    return {name: jax.grad(fn)(logits) for name, fn in _placements(logits, ref).items()}


def sampled_placement_gradients(key, logits, ref_logp, n_samples: int) -> dict:
    """Monte Carlo version of :func:`placement_gradients` from ``n_samples`` sampled actions.

    Each estimate averages the per-sample gradient (sampled tokens fixed); it converges to the
    exact expectation as ``n_samples`` grows.
    """
    logits, ref = _check_logits(logits, ref_logp)
    n_samples = checks.positive_int("n_samples", n_samples)
    actions = jax.random.categorical(key, logits, shape=(n_samples,))

    def sampled(fn_of_logp, reward=False):
        def f(z):
            logp = jax.nn.log_softmax(z)[actions]
            if reward:
                return jnp.mean(jax.lax.stop_gradient(k1(logp, ref[actions])) * logp)
            return jnp.mean(fn_of_logp(logp, ref[actions]))
        return jax.grad(f)(logits)

    return {"k1_in_reward": sampled(None, reward=True), "k1_in_loss": sampled(k1),
            "k2_in_loss": sampled(k2), "k3_in_loss": sampled(k3)}


def response_token_logp(node_logp: jax.Array, lang: Language) -> jax.Array:
    """Per-token log-probs of every enumerated response, ``[P, R, T]`` (0 on padding)."""
    tree = prefix_tree(lang)
    pre = jnp.asarray(tree.response_prefix)
    act = jnp.asarray(tree.response_action)
    real = pre >= 0
    vals = node_logp[:, jnp.maximum(pre, 0), jnp.minimum(act, lang.n_actions - 1)]
    return jnp.where(real[None], vals, 0.0)


def sequence_placement_gradients(policy_params: dict, ref_params: dict, prefix_features, lang: Language) -> dict:
    """Exact expected gradients of each placement for whole responses (see :func:`_sequence_placements`)."""
    if not isinstance(lang, Language):
        raise ValueError(f"lang must be a rlhf_lab.sequences.Language, got {type(lang).__name__}")
    if np.shape(prefix_features) != (lang.n_prompts, lang.n_prefixes, lang.n_features):
        raise ValueError(f"prefix_features must have shape {(lang.n_prompts, lang.n_prefixes, lang.n_features)}, "
                         f"got {np.shape(prefix_features)}")
    return _sequence_placements_jit(policy_params, ref_params, prefix_features, lang)


def _sequence_placements(policy_params: dict, ref_params: dict, prefix_features, lang: Language) -> dict:
    """Exact expected gradients (w.r.t. the policy parameters) of each placement for whole responses.

    Prompts are averaged. With ``pi(y)`` held fixed as weights ("in the loss") or used through the
    score function ("in the reward"):

    * ``k1_in_reward``: ``sum_y pi(y) [sum_t k1_t] grad log pi(y)`` = ``grad KL_seq(pi || pi_ref)``;
    * ``k2_in_loss`` / ``k3_in_loss``: ``sum_y pi(y) sum_t grad k_t`` (per-token estimator in the loss);
    * ``kl``: autodiff of :func:`rlhf_lab.sequences.exact.sequence_kl`.

    Returns:
      dict of parameter pytrees (same structure as ``policy_params``).
    """
    ref_node = jax.lax.stop_gradient(policy_logp(ref_params, prefix_features))
    ref_tok = response_token_logp(ref_node, lang)

    def parts(params):
        node = policy_logp(params, prefix_features)
        tok = response_token_logp(node, lang)
        seq = jnp.sum(tok, axis=-1)
        w = jax.lax.stop_gradient(jnp.exp(seq))
        return node, tok, seq, w

    def k1_reward(params):
        _, tok, seq, w = parts(params)
        kl_y = jax.lax.stop_gradient(jnp.sum(tok - ref_tok, axis=-1))
        return jnp.mean(jnp.sum(w * kl_y * seq, axis=-1))

    def in_loss(fn):
        def f(params):
            tree = prefix_tree(lang)
            real = jnp.asarray(tree.response_prefix >= 0)[None]
            _, tok, _, w = parts(params)
            per = jnp.sum(jnp.where(real, fn(tok, ref_tok), 0.0), axis=-1)
            return jnp.mean(jnp.sum(w * per, axis=-1))
        return f

    def kl(params):
        node = policy_logp(params, prefix_features)
        return jnp.mean(exact.sequence_kl(node, ref_node, lang))

    fns = {"k1_in_reward": k1_reward, "k2_in_loss": in_loss(k2), "k3_in_loss": in_loss(k3), "kl": kl}
    return {name: jax.grad(fn)(policy_params) for name, fn in fns.items()}


_sequence_placements_jit = jax.jit(_sequence_placements, static_argnums=3)
