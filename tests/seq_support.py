"""Independent NumPy re-implementations used as expectations by the tests of rlhf_lab.sequences.

Nothing here imports the code under test's arithmetic: features, the network forward pass and
response probabilities are written again from their definitions, looping over responses.
"""
import itertools

import numpy as np


def brute_force_responses(n_tokens, max_len):
    """Every response as a tuple of ids (EOS = n_tokens), by itertools."""
    eos = n_tokens
    out = []
    for k in range(max_len):
        out += [tuple(s) + (eos,) for s in itertools.product(range(n_tokens), repeat=k)]
    out += [tuple(s) for s in itertools.product(range(n_tokens), repeat=max_len)]
    return out


def features_np(n_prompts, n_tokens, max_len, prompt, prefix):
    """Context features of (prompt, prefix) written from the definition."""
    f = np.zeros(n_prompts + max_len + n_tokens + 1 + n_tokens)
    f[prompt] = 1.0
    f[n_prompts + len(prefix)] = 1.0
    prev = prefix[-1] if prefix else n_tokens
    f[n_prompts + max_len + prev] = 1.0
    for tok in prefix:
        f[n_prompts + max_len + n_tokens + 1 + tok] += 1.0 / max_len
    return f


def forward_np(params, x):
    p = {k: np.asarray(v, np.float64) for k, v in params.items()}
    h = np.tanh(x @ p["w1"] + p["b1"])
    if "w2" in p:
        h = np.tanh(h @ p["w2"] + p["b2"])
    return h @ p["w_out"] + p["b_out"]


def log_softmax_np(z):
    z = z - z.max(axis=-1, keepdims=True)
    return z - np.log(np.exp(z).sum(axis=-1, keepdims=True))


def response_logp_np(params, n_prompts, n_tokens, max_len, prompt, response):
    """log pi(response | prompt), one token at a time."""
    total = 0.0
    for t, tok in enumerate(response):
        x = features_np(n_prompts, n_tokens, max_len, prompt, list(response[:t]))
        total += log_softmax_np(forward_np(params, x))[tok]
    return total


def tokens_of(row, pad):
    """Tuple of the ids before padding."""
    return tuple(int(t) for t in row if t != pad)
