"""The tiny language: prompts, tokens, EOS, padding, masks, and every response as a prefix tree.

Token ids (``n_tokens`` content tokens, default 5)::

    0 .. n_tokens-1   content tokens, shown as letters "a", "b", ...
    n_tokens          EOS: ends a response; it is a REAL token (it is sampled, has a log-prob, and
                      the score of an ended response sits on it)
    n_tokens + 1      PAD: fills the positions after the end; never sampled, always masked

The policy chooses among ``n_actions = n_tokens + 1`` actions (content tokens and EOS). A response
has at most ``max_len`` tokens: either ``k < max_len`` content tokens followed by EOS (length
``k + 1``), or ``max_len`` content tokens and no EOS (*truncated*; it pays the missing-EOS penalty).

Classic mistake named here: **EOS used as the padding token**. If padding is written with the EOS
id and the mask is computed as ``tokens != EOS``, the EOS token itself is masked: its log-prob
drops out of the sequence log-likelihood, the policy is never taught to stop, and the score that
belongs on the EOS position lands on a masked slot. Keep PAD distinct and build the mask from the
first EOS (:func:`response_mask`).

Exact enumeration. Every decision point is a *prefix* of content tokens of length ``0 .. max_len-1``
(``sum_k n_tokens**k`` of them: 3,906 for the default). Prefixes are stored level by level, each
level in base-``n_tokens`` lexicographic order, so the children of prefix ``i`` on level ``k`` are
``i * n_tokens + a`` on level ``k + 1``. Responses are ordered so that response ``j < n_prefixes``
is prefix ``j`` followed by EOS and the last ``n_tokens**max_len`` responses are the truncated ones
(in lexicographic order): 19,531 responses per prompt for the default. A policy is evaluated with
ONE batched forward pass over all prefixes (:func:`rlhf_lab.sequences.exact.prefix_logp`).
"""
from __future__ import annotations

import functools
from dataclasses import dataclass

import jax
import jax.numpy as jnp
import numpy as np

from .. import checks

LETTERS = "abcdefghijklmnopqrstuvwxyz"


@dataclass(frozen=True)
class Language:
    """Sizes of the tiny language (static: a new value means new array shapes and a new compile).

    Attributes:
      n_prompts: number of prompts (default 4), ids ``0 .. n_prompts-1``.
      n_tokens: number of content tokens (default 5); EOS is ``n_tokens``, PAD is ``n_tokens + 1``.
      max_len: longest response in tokens, EOS included (default 6).
    """

    n_prompts: int = 4
    n_tokens: int = 5
    max_len: int = 6

    def __post_init__(self):
        object.__setattr__(self, "n_prompts", checks.positive_int("n_prompts", self.n_prompts))
        n_tokens = checks.positive_int("n_tokens", self.n_tokens, minimum=2)
        if n_tokens > len(LETTERS):
            raise ValueError(f"n_tokens must be an integer in [2, {len(LETTERS)}], got {n_tokens}")
        object.__setattr__(self, "n_tokens", n_tokens)
        max_len = checks.positive_int("max_len", self.max_len)
        n_resp = sum(n_tokens**k for k in range(max_len + 1))
        if n_resp > 200_000:
            raise ValueError(
                f"max_len={max_len} with n_tokens={n_tokens} gives {n_resp} responses per prompt; "
                "exact enumeration allows at most 200,000 (lower max_len or n_tokens)"
            )
        object.__setattr__(self, "max_len", max_len)

    @property
    def eos(self) -> int:
        """Id of the end-of-sequence token (a real, sampled token)."""
        return self.n_tokens

    @property
    def pad(self) -> int:
        """Id of the padding token (never sampled, always masked; distinct from EOS)."""
        return self.n_tokens + 1

    @property
    def n_actions(self) -> int:
        """Size of the policy's output: content tokens plus EOS."""
        return self.n_tokens + 1

    @property
    def n_prefixes(self) -> int:
        """Decision points per prompt: content prefixes of length 0 .. max_len-1."""
        return sum(self.n_tokens**k for k in range(self.max_len))

    @property
    def n_responses(self) -> int:
        """Responses per prompt: ``n_prefixes`` ended by EOS plus ``n_tokens**max_len`` truncated."""
        return self.n_prefixes + self.n_tokens**self.max_len

    @property
    def n_features(self) -> int:
        """Width of :func:`context_features`: prompt, position, previous token (or start), counts."""
        return self.n_prompts + self.max_len + (self.n_tokens + 1) + self.n_tokens

    def token_names(self) -> list[str]:
        """Printable names: letters for content tokens, then ``<eos>`` and ``<pad>``."""
        return list(LETTERS[: self.n_tokens]) + ["<eos>", "<pad>"]


DEFAULT_LANGUAGE = Language()


def check_language(lang) -> Language:
    """Return ``lang`` if it is a :class:`Language`, else raise ``ValueError``."""
    if not isinstance(lang, Language):
        raise ValueError(f"lang must be a rlhf_lab.sequences.Language, got {type(lang).__name__}")
    return lang


def decode(lang: Language, tokens) -> str:
    """Readable text of one response, e.g. ``"a c c <eos>"``; padding is dropped, truncation shown as ``...``."""
    lang = check_language(lang)
    names = lang.token_names()
    toks = [int(t) for t in np.asarray(tokens).reshape(-1)]
    out = []
    for t in toks:
        if not 0 <= t <= lang.pad:
            raise ValueError(f"tokens must be ids in [0, {lang.pad}], got {t}")
        if t == lang.pad:
            break
        out.append(names[t])
        if t == lang.eos:
            break
    if not out or out[-1] != "<eos>":
        out.append("...")
    return " ".join(out)


# ------------------------------------------------------------------------------------------
# Masks and masked sums (small pure functions students re-implement)
# ------------------------------------------------------------------------------------------


def response_mask(tokens: jax.Array, eos: int, pad: int) -> jax.Array:
    """Float mask of the real tokens of padded responses: 1 up to AND including the first EOS.

    ``mask[t] = 1`` iff ``tokens[t] != pad`` and no EOS occurs at a position ``< t``.

    Args:
      tokens: ``[..., T]`` int token ids (content, EOS, PAD).
      eos, pad: the EOS and PAD ids (must differ).

    Returns:
      ``[..., T]`` float32 mask. Mistake it avoids: ``tokens != eos`` would mask EOS itself.
    """
    if int(eos) == int(pad):
        raise ValueError(f"eos and pad must be different ids (EOS is a real token), both are {eos}")
    tokens = jnp.asarray(tokens)
    is_eos = (tokens == eos).astype(jnp.int32)
    eos_before = jnp.cumsum(is_eos, axis=-1) - is_eos
    return ((tokens != pad) & (eos_before == 0)).astype(jnp.float32)


def sequence_logprob(token_logp: jax.Array, mask: jax.Array) -> jax.Array:
    """Log-probability of whole responses: ``log pi(y) = sum_t mask_t * log pi(y_t | y_<t)``.

    Args:
      token_logp: ``[..., T]`` log-prob of each sampled token under one fixed policy (values at
        padding positions are ignored, whatever they are, as long as they are finite).
      mask: ``[..., T]`` 1 for real tokens (EOS included), 0 for padding.

    Returns:
      ``[...]`` sequence log-probabilities. Mistake it avoids: summing over padding.
    """
    checks.same_shape(("token_logp", "mask"), token_logp, mask)
    return jnp.sum(jnp.where(mask > 0, token_logp, 0.0), axis=-1)


def masked_mean(x: jax.Array, mask: jax.Array) -> jax.Array:
    """Mean of ``x`` over real tokens only: ``sum(x * mask) / sum(mask)`` (padding never counts)."""
    return jnp.sum(jnp.where(mask > 0, x, 0.0)) / jnp.maximum(jnp.sum(mask), 1.0)


def masked_nll(token_logp: jax.Array, mask: jax.Array) -> jax.Array:
    """SFT loss: mean negative log-likelihood per real token.

    ``L = -sum_{i,t} mask_it log pi(y_it | x_i, y_i,<t) / sum_{i,t} mask_it``

    The EOS token is a real token (mask 1): leaving it out means the fitted policy never learns
    when to stop. Padding (mask 0) never enters, neither in the sum nor in the count.

    Args:
      token_logp: ``[N, T]`` log-probs of the demonstration tokens under the policy being fitted.
      mask: ``[N, T]`` real-token mask.

    Returns:
      Scalar loss (nats per token).
    """
    checks.same_shape(("token_logp", "mask"), token_logp, mask)
    return -masked_mean(token_logp, mask)


# ------------------------------------------------------------------------------------------
# Context features: what the policy and value networks see of a prefix
# ------------------------------------------------------------------------------------------


def step_features(lang: Language, prompts, position, prev, counts) -> jax.Array:
    """Features of one decision point (before the token at ``position`` is chosen).

    ``[one_hot(prompt, P) | one_hot(position, max_len) | one_hot(prev, n_tokens + 1) | counts]``
    where ``prev`` is the previous content token or ``n_tokens`` (meaning "start": nothing yet) and
    ``counts[v]`` is how many times content token ``v`` already occurred, divided by ``max_len``.

    Args:
      prompts: ``[...]`` int prompt ids; position: ``[...]`` (or scalar) int positions;
      prev: ``[...]`` int previous token (``n_tokens`` at the start); counts: ``[..., n_tokens]``.

    Returns:
      ``[..., lang.n_features]`` float32.
    """
    prompts = jnp.asarray(prompts)
    shape = prompts.shape
    position = jnp.broadcast_to(jnp.asarray(position), shape)
    prev = jnp.broadcast_to(jnp.asarray(prev), shape)
    return jnp.concatenate([
        jax.nn.one_hot(prompts, lang.n_prompts, dtype=jnp.float32),
        jax.nn.one_hot(position, lang.max_len, dtype=jnp.float32),
        jax.nn.one_hot(prev, lang.n_tokens + 1, dtype=jnp.float32),
        jnp.asarray(counts, jnp.float32) / lang.max_len,
    ], axis=-1)


def context_features(lang: Language, prompts, tokens) -> jax.Array:
    """Features of the prefix before every position of padded responses.

    Args:
      prompts: ``[B]`` int prompt ids; tokens: ``[B, T]`` token ids with ``T == lang.max_len``.

    Returns:
      ``[B, T, n_features]``: row ``t`` describes ``(prompt, y_<t)``; rows after the end are
      well defined but belong to padding (mask them).
    """
    tokens = jnp.asarray(tokens)
    b, t = tokens.shape
    content = jax.nn.one_hot(tokens, lang.n_tokens, dtype=jnp.float32)  # EOS/PAD -> all zeros
    counts_before = jnp.cumsum(content, axis=1) - content
    start = jnp.full((b, 1), lang.n_tokens, tokens.dtype)
    prev = jnp.concatenate([start, jnp.minimum(tokens[:, :-1], lang.n_tokens)], axis=1)
    prompts_bt = jnp.broadcast_to(jnp.asarray(prompts)[:, None], (b, t))
    positions = jnp.broadcast_to(jnp.arange(t), (b, t))
    return step_features(lang, prompts_bt, positions, prev, counts_before)


# ------------------------------------------------------------------------------------------
# The prefix tree (NumPy, cached per Language)
# ------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Tree:
    """Enumeration tables of one :class:`Language` (NumPy arrays; shared by every task).

    Attributes:
      level_sizes: ``n_tokens**k`` for ``k = 0 .. max_len-1``; level_offsets: start of each level.
      prefix_tokens: ``[n_prefixes, max_len]`` content prefixes, PAD after the prefix.
      prefix_level: ``[n_prefixes]`` prefix length.
      prefix_features: ``[n_prompts, n_prefixes, n_features]`` float32 context features.
      response_tokens: ``[n_responses, max_len]`` every response, PAD-padded.
      response_mask: ``[n_responses, max_len]`` real-token mask.
      counts: ``[n_responses, n_tokens]`` content-token counts; length: ``[n_responses]`` number of
        content tokens (EOS not counted); has_eos: ``[n_responses]`` 1.0 if ended by EOS.
      response_prefix: ``[n_responses, max_len]`` index of the prefix each real token was chosen
        at (-1 on padding); response_action: ``[n_responses, max_len]`` the action taken there.
    """

    level_sizes: tuple
    level_offsets: tuple
    prefix_tokens: np.ndarray
    prefix_level: np.ndarray
    prefix_features: np.ndarray
    response_tokens: np.ndarray
    response_mask: np.ndarray
    counts: np.ndarray
    length: np.ndarray
    has_eos: np.ndarray
    response_prefix: np.ndarray
    response_action: np.ndarray


def _np_prefix_features(lang: Language, prefix_tokens: np.ndarray, prefix_level: np.ndarray) -> np.ndarray:
    """NumPy twin of :func:`step_features` for every (prompt, prefix): ``[P, n_prefixes, n_features]``."""
    V, T, P = lang.n_tokens, lang.max_len, lang.n_prompts
    n = prefix_tokens.shape[0]
    rows = np.arange(n)
    position = np.eye(T, dtype=np.float32)[prefix_level]
    prev_id = np.where(prefix_level > 0, prefix_tokens[rows, np.maximum(prefix_level - 1, 0)], V)
    prev = np.eye(V + 1, dtype=np.float32)[prev_id]
    counts = np.stack([(prefix_tokens == v).sum(axis=1) for v in range(V)], axis=1).astype(np.float32) / T
    shared = np.concatenate([position, prev, counts], axis=1)
    prompt = np.broadcast_to(np.eye(P, dtype=np.float32)[:, None, :], (P, n, P))
    return np.concatenate([prompt, np.broadcast_to(shared, (P,) + shared.shape)], axis=2)


def _level_strings(n_tokens: int, k: int) -> np.ndarray:
    """All content strings of length k in lexicographic order, shape ``[n_tokens**k, k]``."""
    if k == 0:
        return np.zeros((1, 0), np.int32)
    idx = np.arange(n_tokens**k)
    digits = [(idx // n_tokens ** (k - 1 - j)) % n_tokens for j in range(k)]
    return np.stack(digits, axis=1).astype(np.int32)


@functools.lru_cache(maxsize=8)
def prefix_tree(lang: Language = DEFAULT_LANGUAGE) -> Tree:
    """Build (once per language, then cached) the enumeration tables described in :class:`Tree`."""
    lang = check_language(lang)
    V, T, P = lang.n_tokens, lang.max_len, lang.n_prompts
    sizes = tuple(V**k for k in range(T))
    offsets = tuple(int(x) for x in np.concatenate([[0], np.cumsum(sizes)[:-1]]))
    n_pre = sum(sizes)
    prefix_tokens = np.full((n_pre, T), lang.pad, np.int32)
    prefix_level = np.zeros(n_pre, np.int32)
    for k in range(T):
        s = _level_strings(V, k)
        prefix_tokens[offsets[k]:offsets[k] + sizes[k], :k] = s
        prefix_level[offsets[k]:offsets[k] + sizes[k]] = k
    # responses: prefix + EOS, then the truncated strings of length T
    trunc = _level_strings(V, T)
    eos_resp = prefix_tokens.copy()
    eos_resp[np.arange(n_pre), prefix_level] = lang.eos
    response_tokens = np.concatenate([eos_resp, trunc], axis=0)
    n_resp = response_tokens.shape[0]
    is_eos = (response_tokens == lang.eos).astype(np.int32)
    mask = ((response_tokens != lang.pad) & (np.cumsum(is_eos, axis=1) - is_eos == 0)).astype(np.float32)
    content = response_tokens < V
    counts = np.stack([(response_tokens == v).sum(axis=1) for v in range(V)], axis=1).astype(np.float32)
    length = content.sum(axis=1).astype(np.float32)
    has_eos = (response_tokens == lang.eos).any(axis=1).astype(np.float32)
    # prefix index of each position: index of the string response[:t] on level t
    resp_prefix = np.full((n_resp, T), -1, np.int32)
    code = np.zeros(n_resp, np.int64)
    for t in range(T):
        real = mask[:, t] > 0
        resp_prefix[real, t] = offsets[t] + code[real]
        code = code * V + np.where(response_tokens[:, t] < V, response_tokens[:, t], 0)
    resp_action = np.where(mask > 0, response_tokens, lang.pad).astype(np.int32)
    feats = _np_prefix_features(lang, prefix_tokens, prefix_level)
    return Tree(
        level_sizes=sizes, level_offsets=offsets, prefix_tokens=prefix_tokens, prefix_level=prefix_level,
        prefix_features=feats.astype(np.float32), response_tokens=response_tokens, response_mask=mask,
        counts=counts, length=length, has_eos=has_eos, response_prefix=resp_prefix,
        response_action=resp_action,
    )
