"""One whole task, built deterministically from a seed: language, gold reward, demonstrator,
reference (SFT), preference pairs, proxy reward, and the exact tables every evaluator needs.

    task = make_task(seed=0)          # a fresh random task (other targets, bigrams, lengths, chain)
    task = default_task()             # the course's task (seed 0), built once per process

Build order (each step uses only the previous ones, like the real pipeline):

1. hidden gold reward and hidden Markov-chain demonstrator (from ``seed``);
2. ``n_demos`` demonstrations; the reference policy fitted to them by maximum likelihood, frozen;
3. ``n_pairs`` pairs drawn from the reference, labelled by Bradley-Terry on the gold reward;
4. the proxy fitted to the pairs and normalised under the reference; the training score is
   ``s(y) = proxy(y) - missing_eos_penalty * 1{y truncated}``.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from .. import checks
from . import exact
from .gold import GoldReward, gold_table, random_gold
from .language import DEFAULT_LANGUAGE, Language, check_language, decode, prefix_tree
from .preferences import Pairs, ProxyReward, fit_proxy, sample_pairs, table_features
from .sft import MarkovChain, SFTResult, chain_response_logp, fit_reference, random_chain, sample_demonstrations

DEFAULT_SEED = 0


class TaskArrays(NamedTuple):
    """The arrays compiled programs take as an ARGUMENT (so a fresh task never recompiles).

    Shapes depend only on the language and the network width.
    """

    ref_params: dict  # frozen reference policy parameters
    proxy_weights: jax.Array  # [P * n_tokens + 2] frozen proxy (normalised)
    proxy_bias: jax.Array  # []
    missing_eos_penalty: jax.Array  # []
    prefix_features: jax.Array  # [P, n_prefixes, n_features]
    gold: jax.Array  # [P, n_responses] gold reward of every response
    proxy: jax.Array  # [P, n_responses] proxy reward of every response
    score: jax.Array  # [P, n_responses] training score = proxy - penalty * truncated
    ref_node_logp: jax.Array  # [P, n_prefixes, n_actions] reference conditionals
    ref_resp_logp: jax.Array  # [P, n_responses] reference sequence log-probs


@dataclass(frozen=True, eq=False)
class Task:
    """Everything about one task. ``arrays`` is what compiled code receives."""

    lang: Language
    seed: int
    gold: GoldReward
    chain: MarkovChain
    demos: tuple  # (prompts [N], tokens [N, T], mask [N, T])
    sft: SFTResult
    pairs: Pairs
    proxy: ProxyReward
    missing_eos_penalty: float
    hidden: int
    arrays: TaskArrays = field(repr=False)

    def __repr__(self) -> str:
        lang = self.lang
        return (f"Task(seed={self.seed}, n_prompts={lang.n_prompts}, n_tokens={lang.n_tokens}, max_len={lang.max_len}, "
                f"hidden={self.hidden}, n_demos={len(self.demos[0])}, n_pairs={len(self.pairs.prompts)}; "
                f"see .describe())")

    @property
    def ref_params(self) -> dict:
        """The frozen reference policy (the SFT result)."""
        return self.arrays.ref_params

    def describe(self) -> str:
        """A short human-readable summary of the hidden gold reward and the proxy's fit."""
        names = self.lang.token_names()
        lines = [f"task seed {self.seed}: {self.lang.n_prompts} prompts, tokens {names[:self.lang.n_tokens]} + <eos>, "
                 f"max_len {self.lang.max_len}, {self.lang.n_responses} responses per prompt"]
        for p in range(self.lang.n_prompts):
            lines.append(
                f"  prompt {p}: target '{names[self.gold.target[p]]}' (best {self.gold.target_peak:g} copies), "
                f"forbidden '{names[self.gold.bigram_first[p]]} {names[self.gold.bigram_second[p]]}', "
                f"preferred length {self.gold.preferred_length[p]:g}")
        lines.append(f"  proxy: pair accuracy {self.proxy.accuracy:.3f} on {len(self.pairs.prompts)} pairs")
        return "\n".join(lines)

    def top_responses(self, resp_logp, prompt: int, k: int = 5) -> list[tuple[str, float]]:
        """The ``k`` most likely responses of ``prompt`` under ``resp_logp [P, R]``: ``(text, probability)``."""
        prompt = checks.positive_int("prompt", prompt, minimum=0)
        if prompt >= self.lang.n_prompts:
            raise ValueError(f"prompt must be in [0, {self.lang.n_prompts - 1}], got {prompt}")
        k = checks.positive_int("k", k)
        row = np.asarray(resp_logp)[prompt]
        order = np.argsort(-row, kind="stable")[:k]
        tokens = prefix_tree(self.lang).response_tokens
        return [(decode(self.lang, tokens[j]), float(np.exp(row[j]))) for j in order]


def make_task(seed: int = DEFAULT_SEED, lang: Language = DEFAULT_LANGUAGE, n_demos: int = 2048,
              n_pairs: int = 2048, hidden: int = 32, sft_steps: int = 300, missing_eos_penalty: float = 1.0,
              bt_temperature: float = 1.0) -> Task:
    """Build a fresh task from ``seed`` (deterministic; see the module docstring for the steps).

    Args:
      seed: integer >= 0; lang: the language sizes; n_demos: SFT demonstrations; n_pairs:
      preference pairs; hidden: network width; sft_steps: Adam steps of the SFT fit;
      missing_eos_penalty: subtracted from the proxy score of truncated responses (>= 0);
      bt_temperature: Bradley-Terry temperature of the labels (> 0).
    """
    lang = check_language(lang)
    seed = checks.positive_int("seed", seed, minimum=0)
    if seed > 2**31 - 1:
        raise ValueError(f"seed must be an integer in [0, {2**31 - 1}], got {seed}")
    hidden = checks.positive_int("hidden", hidden)
    penalty = checks.finite_scalar("missing_eos_penalty", missing_eos_penalty)
    if penalty < 0:
        raise ValueError(f"missing_eos_penalty must be >= 0, got {penalty}")
    if not checks.finite_scalar("bt_temperature", bt_temperature) > 0:
        raise ValueError(f"bt_temperature (Bradley-Terry temperature) must be > 0, got {bt_temperature}")
    n_demos = checks.positive_int("n_demos", n_demos)
    n_pairs = checks.positive_int("n_pairs", n_pairs)
    sft_steps = checks.positive_int("sft_steps", sft_steps)
    tree = prefix_tree(lang)
    gold = random_gold(lang, seed)
    chain = random_chain(lang, seed)
    demos = sample_demonstrations(chain, lang, n_demos, seed)
    sft = fit_reference(lang, *demos, hidden=hidden, steps=sft_steps, seed=seed)
    feats = jnp.asarray(tree.prefix_features)
    ref_node, ref_resp = exact.policy_tables(sft.params, feats, lang)
    gold_t = gold_table(gold, lang)
    pairs = sample_pairs(lang, ref_resp, gold_t, n_pairs, seed, bt_temperature)
    proxy = fit_proxy(lang, pairs, ref_resp)
    proxy_t = (table_features(lang) @ np.asarray(proxy.weights) + float(proxy.bias)).astype(np.float32)
    score_t = proxy_t - np.float32(penalty) * (1.0 - tree.has_eos)[None, :]
    arrays = TaskArrays(
        ref_params=sft.params, proxy_weights=proxy.weights, proxy_bias=proxy.bias,
        missing_eos_penalty=jnp.float32(penalty), prefix_features=feats, gold=jnp.asarray(gold_t),
        proxy=jnp.asarray(proxy_t), score=jnp.asarray(score_t, jnp.float32), ref_node_logp=ref_node,
        ref_resp_logp=ref_resp,
    )
    return Task(lang, seed, gold, chain, demos, sft, pairs, proxy, penalty, hidden, arrays)


@functools.lru_cache(maxsize=4)
def default_task() -> Task:
    """The course's task (``make_task(DEFAULT_SEED)``), built once per process."""
    return make_task(DEFAULT_SEED)


def chain_table(task: Task) -> np.ndarray:
    """Exact ``log P_chain(y | p)`` of every response under the hidden demonstrator, ``[P, R]``."""
    tree = prefix_tree(task.lang)
    R = tree.response_tokens.shape[0]
    return np.stack([chain_response_logp(task.chain, task.lang, tree.response_tokens, np.full(R, p))
                     for p in range(task.lang.n_prompts)])


def evaluate_policy(task: Task, policy_params: dict, beta: float) -> dict:
    """Exact numbers of one policy on ``task`` as plain floats (prompts averaged), for notebooks.

    Keys: ``gold``, ``proxy``, ``score`` (proxy minus the missing-EOS penalty), ``kl`` (sequence
    ``KL(pi || pi_ref)`` in nats), ``objective`` (``score - beta * kl``), ``optimum`` (objective of
    ``pi*_beta``), ``regret`` (optimum - objective), ``p_truncated`` and ``mean_length`` (content tokens).
    """
    if not isinstance(task, Task):
        raise ValueError(f"task must be a rlhf_lab.sequences.Task (see make_task), got {type(task).__name__}")
    beta = checks.beta(beta)
    a = task.arrays
    node, resp = exact.policy_tables(policy_params, a.prefix_features, task.lang)
    tree = prefix_tree(task.lang)
    probs = np.exp(np.asarray(resp, np.float64))
    kl = float(np.mean(np.asarray(exact.sequence_kl(node, a.ref_node_logp, task.lang))))
    score = float(np.mean(np.sum(probs * np.asarray(a.score), axis=1)))
    optimum = float(np.mean(np.asarray(exact.optimal_objective(a.ref_resp_logp, a.score, beta))))
    return {
        "gold": float(np.mean(np.sum(probs * np.asarray(a.gold), axis=1))),
        "proxy": float(np.mean(np.sum(probs * np.asarray(a.proxy), axis=1))),
        "score": score, "kl": kl, "objective": score - beta * kl, "optimum": optimum,
        "regret": optimum - (score - beta * kl),
        "p_truncated": float(np.mean(np.sum(probs * (1.0 - tree.has_eos), axis=1))),
        "mean_length": float(np.mean(np.sum(probs * tree.length, axis=1))),
    }


def optimum_summary(task: Task, beta: float) -> dict:
    """Exact gold, proxy, score and KL of the optimum ``pi*_beta ∝ pi_ref exp(score / beta)`` (prompts averaged)."""
    if not isinstance(task, Task):
        raise ValueError(f"task must be a rlhf_lab.sequences.Task (see make_task), got {type(task).__name__}")
    beta = checks.beta(beta)
    a = task.arrays
    opt = exact.optimal_logp(a.ref_resp_logp, a.score, beta)
    return {
        "gold": float(jnp.mean(exact.expectation(opt, a.gold))),
        "proxy": float(jnp.mean(exact.expectation(opt, a.proxy))),
        "score": float(jnp.mean(exact.expectation(opt, a.score))),
        "kl": float(jnp.mean(exact.response_kl(opt, a.ref_resp_logp))),
        "objective": float(jnp.mean(exact.optimal_objective(a.ref_resp_logp, a.score, beta))),
    }
