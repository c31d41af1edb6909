"""Policy and value networks in plain JAX; parameters are dicts of named arrays.

Both networks read the context features of a prefix (:func:`rlhf_lab.sequences.language.step_features`:
prompt, position, previous token, token counts so far) through one tanh layer (two with
``layers=2``)::

    h = tanh(features @ w1 + b1)         w1: [n_features, hidden]
    (h = tanh(h @ w2 + b2)               w2: [hidden, hidden], only with layers=2)
    policy logits = h @ w_out + b_out    w_out: [hidden, n_actions]   (content tokens + EOS)
    value         = h @ w_out + b_out    w_out: [hidden, 1]

The networks are separate (no shared trunk), so the value loss never moves the policy.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from .. import checks

PARAM_NAMES = ("w1", "b1", "w_out", "b_out")  # plus "w2", "b2" with layers=2


def _init(key, n_features: int, hidden: int, n_out: int, out_scale: float, layers: int) -> dict:
    if layers not in (1, 2):
        raise ValueError(f"layers must be 1 or 2, got {layers!r}")
    k1, k2, k3 = jax.random.split(key, 3)
    params = {
        "w1": jax.random.normal(k1, (n_features, hidden), jnp.float32) * np.float32(1.0 / np.sqrt(n_features)),
        "b1": jnp.zeros((hidden,), jnp.float32),
    }
    if layers == 2:
        params["w2"] = jax.random.normal(k2, (hidden, hidden), jnp.float32) * np.float32(1.0 / np.sqrt(hidden))
        params["b2"] = jnp.zeros((hidden,), jnp.float32)
    params["w_out"] = jax.random.normal(k3, (hidden, n_out), jnp.float32) * np.float32(out_scale / np.sqrt(hidden))
    params["b_out"] = jnp.zeros((n_out,), jnp.float32)
    return params


def init_policy(key, n_features: int, n_actions: int, hidden: int = 32, layers: int = 1) -> dict:
    """Random policy parameters (small output layer, so the initial policy is near uniform)."""
    n_features = checks.positive_int("n_features", n_features)
    n_actions = checks.positive_int("n_actions", n_actions, minimum=2)
    hidden = checks.positive_int("hidden", hidden)
    return _init(key, n_features, hidden, n_actions, out_scale=0.1, layers=layers)


def init_value(key, n_features: int, hidden: int = 32, layers: int = 1) -> dict:
    """Random value-network parameters (output starts near 0)."""
    n_features = checks.positive_int("n_features", n_features)
    hidden = checks.positive_int("hidden", hidden)
    return _init(key, n_features, hidden, 1, out_scale=0.1, layers=layers)


def _trunk(params: dict, features: jax.Array) -> jax.Array:
    h = jnp.tanh(features @ params["w1"] + params["b1"])
    if "w2" in params:
        h = jnp.tanh(h @ params["w2"] + params["b2"])
    return h


def policy_logits(params: dict, features: jax.Array) -> jax.Array:
    """Unnormalised next-token scores ``[..., n_actions]`` for features ``[..., n_features]``."""
    return _trunk(params, features) @ params["w_out"] + params["b_out"]


def policy_logp(params: dict, features: jax.Array) -> jax.Array:
    """Next-token log-probabilities ``log pi(. | prefix)``, shape ``[..., n_actions]``."""
    return jax.nn.log_softmax(policy_logits(params, features), axis=-1)


def value(params: dict, features: jax.Array) -> jax.Array:
    """Value estimate ``V(prefix)``, shape ``[...]``."""
    return (_trunk(params, features) @ params["w_out"] + params["b_out"])[..., 0]


def token_logp(params: dict, features: jax.Array, tokens: jax.Array) -> jax.Array:
    """Log-prob of the given tokens: ``log pi(y_t | prefix_t)``, shape ``[..., T]``.

    Padding ids (outside the action range) get log-prob 0 here; mask them anyway.

    Args:
      params: policy parameters (the policy the log-probs belong to: current, old or reference).
      features: ``[..., T, n_features]`` context features; tokens: ``[..., T]`` token ids.
    """
    logp = policy_logp(params, features)
    n_actions = logp.shape[-1]
    safe = jnp.clip(tokens, 0, n_actions - 1)
    picked = jnp.take_along_axis(logp, safe[..., None], axis=-1)[..., 0]
    return jnp.where(tokens < n_actions, picked, 0.0)
