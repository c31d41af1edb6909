"""Exact evaluators by enumeration of the prefix tree (no sampling anywhere).

A policy is turned into tables with ONE batched forward pass over every distinct prefix
(:func:`prefix_logp`, ``[P, n_prefixes, n_actions]``); everything else is sums over the tree:

* :func:`reach_logp` -- ``log pi(prefix)``, level by level: a child's value is its parent's plus
  the log-prob of the token that extends it.
* :func:`response_logp` -- ``log pi(y | p)`` of all ``n_responses`` responses (they sum to 1).
* :func:`sequence_kl` -- ``KL(pi || pi_ref) = sum_y pi(y) log(pi(y) / pi_ref(y))``, computed as
  ``sum_prefix pi(prefix) KL(pi(.|prefix) || pi_ref(.|prefix))`` (chain rule; identical value).
* :func:`prefix_values` -- the exact ``V^pi`` of every prefix under the PPO per-token rewards.
* :func:`optimal_logp` / :func:`optimal_objective` -- ``pi*_beta(y) ∝ pi_ref(y) exp(s(y)/beta)`` and
  its objective ``beta log E_ref[exp(s/beta)]``; :func:`objective` and :func:`regret` for any policy.

All per-prompt results have a leading ``[P]`` axis; course-level numbers average over prompts
(prompts are drawn uniformly).
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from .. import checks
from .language import Language, prefix_tree
from .policy import policy_logp


def prefix_logp(params: dict, prefix_features: jax.Array) -> jax.Array:
    """``log pi(. | p, prefix)`` for every prompt and prefix: ``[P, n_prefixes, n_actions]`` (one pass)."""
    return policy_logp(params, prefix_features)


def _check_nodes(name, node_logp, lang):
    if not isinstance(lang, Language):
        raise ValueError(f"lang must be a rlhf_lab.sequences.Language, got {type(lang).__name__}")
    if np.shape(node_logp)[-2:] != (lang.n_prefixes, lang.n_actions):
        raise ValueError(f"{name} must end in shape (n_prefixes={lang.n_prefixes}, n_actions={lang.n_actions}), "
                         f"got {np.shape(node_logp)}")


def _beta(beta):
    if not isinstance(beta, jax.core.Tracer):
        checks.beta(beta)


def reach_logp(node_logp: jax.Array, lang: Language) -> jax.Array:
    """``log pi(prefix | p)`` of every prefix, ``[P, n_prefixes]`` (0 at the empty prefix)."""
    _check_nodes("node_logp", node_logp, lang)
    tree = prefix_tree(lang)
    V = lang.n_tokens
    levels = [jnp.zeros(node_logp.shape[:-2] + (1,), node_logp.dtype)]
    for k in range(lang.max_len - 1):
        off, size = tree.level_offsets[k], tree.level_sizes[k]
        step = levels[-1][..., :, None] + node_logp[..., off:off + size, :V]
        levels.append(step.reshape(step.shape[:-2] + (size * V,)))
    return jnp.concatenate(levels, axis=-1)


def response_logp(node_logp: jax.Array, lang: Language) -> jax.Array:
    """``log pi(y | p)`` of every enumerated response, ``[P, n_responses]`` (order of :class:`~.language.Tree`)."""
    tree = prefix_tree(lang)
    V = lang.n_tokens
    reach = reach_logp(node_logp, lang)
    ended = reach + node_logp[..., lang.eos]
    off, size = tree.level_offsets[-1], tree.level_sizes[-1]
    trunc = reach[..., off:off + size, None] + node_logp[..., off:off + size, :V]
    return jnp.concatenate([ended, trunc.reshape(trunc.shape[:-2] + (size * V,))], axis=-1)


def expectation(resp_logp: jax.Array, table: jax.Array) -> jax.Array:
    """``E_pi[f] = sum_y pi(y) f(y)`` per prompt: ``[P, R] x [P, R] -> [P]``."""
    return jnp.sum(jnp.exp(resp_logp) * table, axis=-1)


def token_kl(node_logp: jax.Array, ref_node_logp: jax.Array) -> jax.Array:
    """Exact per-prefix KL ``sum_a pi(a|.) (log pi(a|.) - log pi_ref(a|.))``, shape ``node_logp.shape[:-1]``."""
    return jnp.sum(jnp.exp(node_logp) * (node_logp - ref_node_logp), axis=-1)


def sequence_kl(node_logp: jax.Array, ref_node_logp: jax.Array, lang: Language) -> jax.Array:
    """Sequence-level ``KL(pi || pi_ref)`` per prompt in nats, ``[P]`` (exactly 0 when ``pi = pi_ref``).

    ``node_logp`` belongs to the current policy, ``ref_node_logp`` to the frozen reference.
    """
    checks.same_shape(("node_logp", "ref_node_logp"), node_logp, ref_node_logp)
    return jnp.sum(jnp.exp(reach_logp(node_logp, lang)) * token_kl(node_logp, ref_node_logp), axis=-1)


def response_kl(resp_logp: jax.Array, ref_resp_logp: jax.Array) -> jax.Array:
    """The same KL summed over responses: ``sum_y pi(y) (log pi(y) - log pi_ref(y))``, ``[P]``."""
    return jnp.sum(jnp.exp(resp_logp) * (resp_logp - ref_resp_logp), axis=-1)


def objective(resp_logp, ref_resp_logp, score, beta) -> jax.Array:
    """KL-regularised objective ``J(pi) = E_pi[s] - beta KL(pi || pi_ref)`` per prompt, ``[P]``."""
    _beta(beta)
    checks.same_shape(("resp_logp", "ref_resp_logp", "score"), resp_logp, ref_resp_logp, score)
    return expectation(resp_logp, score) - beta * response_kl(resp_logp, ref_resp_logp)


def optimal_logp(ref_resp_logp: jax.Array, score: jax.Array, beta) -> jax.Array:
    """``log pi*_beta(y | p) = log_softmax_y(log pi_ref(y | p) + s(y) / beta)``, ``[P, R]``."""
    _beta(beta)
    checks.same_shape(("ref_resp_logp", "score"), ref_resp_logp, score)
    return jax.nn.log_softmax(ref_resp_logp + score / beta, axis=-1)


def optimal_objective(ref_resp_logp: jax.Array, score: jax.Array, beta) -> jax.Array:
    """``J(pi*_beta) = beta log sum_y pi_ref(y) exp(s(y)/beta)`` per prompt, ``[P]`` (the maximum of J)."""
    _beta(beta)
    checks.same_shape(("ref_resp_logp", "score"), ref_resp_logp, score)
    return beta * jax.scipy.special.logsumexp(ref_resp_logp + score / beta, axis=-1)


def regret(resp_logp, ref_resp_logp, score, beta) -> jax.Array:
    """``J(pi*_beta) - J(pi)`` averaged over prompts (>= 0 up to float error)."""
    return jnp.mean(optimal_objective(ref_resp_logp, score, beta) - objective(resp_logp, ref_resp_logp, score, beta))


def prefix_values(node_logp, ref_node_logp, score, beta, lang: Language, gamma=1.0) -> jax.Array:
    """Exact ``V^pi(prefix)`` under PPO's per-token rewards, ``[P, n_prefixes]``.

    ``V(x) = sum_a pi(a|x) [ -beta (log pi(a|x) - log pi_ref(a|x)) + s(x+a) 1{x+a ends}
    + gamma V(x+a) 1{x+a continues} ]`` where a response ends at EOS or at ``max_len`` tokens
    (the score there already includes any missing-EOS penalty). With ``gamma = 1`` the value of the
    empty prefix equals :func:`objective`. This is the critic's true target.

    Args:
      node_logp: ``[P, n_prefixes, A]`` current policy; ref_node_logp: same shape, reference.
      score: ``[P, n_responses]`` terminal score of every response; beta: KL coefficient;
      gamma: discount in ``[0, 1]``.
    """
    checks.same_shape(("node_logp", "ref_node_logp"), node_logp, ref_node_logp)
    if np.shape(score)[-1] != lang.n_responses:
        raise ValueError(f"score must have n_responses={lang.n_responses} entries on its last axis, got shape {np.shape(score)}")
    if not isinstance(beta, jax.core.Tracer):
        check_beta_gamma(beta, gamma)
    tree = prefix_tree(lang)
    V = lang.n_tokens
    T = lang.max_len
    n_pre = tree.prefix_tokens.shape[0]
    probs = jnp.exp(node_logp)
    kl_r = -beta * (node_logp - ref_node_logp)  # per-action KL reward
    score_eos = score[..., :n_pre]
    trunc_score = score[..., n_pre:]
    values = [None] * T
    for k in reversed(range(T)):
        off, size = tree.level_offsets[k], tree.level_sizes[k]
        p = probs[..., off:off + size, :]
        r = kl_r[..., off:off + size, :]
        if k == T - 1:
            cont = trunc_score.reshape(trunc_score.shape[:-1] + (size, V))
        else:
            cont = gamma * values[k + 1].reshape(values[k + 1].shape[:-1] + (size, V))
        total = jnp.concatenate([r[..., :V] + cont, (r[..., V] + score_eos[..., off:off + size])[..., None]], -1)
        values[k] = jnp.sum(p * total, axis=-1)
    return jnp.concatenate(values, axis=-1)


def check_beta_gamma(beta, gamma):
    """Validate ``beta > 0`` and ``gamma`` in ``[0, 1]`` (plain Python, before tracing)."""
    b = checks.beta(beta)
    g = checks.finite_scalar("gamma", gamma)
    if not 0.0 <= g <= 1.0:
        raise ValueError(f"gamma (discount) must lie in [0, 1], got {g}")
    return b, g


def _tables(params, prefix_features, lang):
    node = prefix_logp(params, prefix_features)
    return node, response_logp(node, lang)


policy_tables = jax.jit(_tables, static_argnums=2)
policy_tables.__doc__ = """``(node_logp [P, N, A], resp_logp [P, R])`` of a policy: one forward pass over every prefix (jitted)."""
