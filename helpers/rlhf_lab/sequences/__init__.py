"""rlhf_lab.sequences: the whole RLHF loop on a tiny language, checked against exact answers.

A few prompts, five tokens plus EOS, responses of at most six tokens: every response of every
prompt can be enumerated (19,531 per prompt), so expected rewards, sequence KL, values and the
KL-regularised optimum are exact sums. Modules (lower ones never import upper ones)::

    language     tokens, EOS vs PAD, masks, context features, the prefix tree
    policy       policy and value networks (dict pytrees)
    gold         the hidden gold reward (readable terms)
    sft          hidden Markov-chain demonstrations, the reference fitted by maximum likelihood
    preferences  pairs from the reference, Bradley-Terry labels, the limited proxy reward model
    exact        enumeration-based evaluators (E[r], KL, V^pi, pi*_beta, regret)
    task         make_task(seed): all of the above, deterministic; default_task()
    estimators   k1, k2, k3, exact per-token KL, their gradients by placement
    ppo          per-token rewards, GAE, whitening, clipped losses, the compiled run, sweeps
    contrasts    GRPO, RLOO, DPO, best-of-n, exact-gradient ascent
    length_bias  a reward model that pays for length; the length-normalised score

Quick start::

    from rlhf_lab import sequences as sq
    task = sq.default_task()
    result = sq.train(task, sq.SeqPPOConfig(beta=0.05))
    result.gold, result.proxy, result.kl          # exact curves, every 10 iterations
"""
from .language import (
    DEFAULT_LANGUAGE, Language, Tree, context_features, decode, masked_mean, masked_nll, prefix_tree,
    response_mask, sequence_logprob, step_features,
)
from .policy import init_policy, init_value, policy_logits, policy_logp, token_logp, value
from .gold import GoldReward, gold_reward, gold_table, gold_terms, make_gold, random_gold
from .sft import MarkovChain, SFTResult, demonstration_counts, fit_reference, random_chain, sample_demonstrations
from .preferences import Pairs, ProxyReward, fit_proxy, preference_loss, proxy_features, proxy_reward, sample_pairs
from . import exact
from .task import DEFAULT_SEED, Task, TaskArrays, default_task, evaluate_policy, make_task, optimum_summary
from .estimators import (
    exact_token_kl, expected_estimates, k1, k2, k3, placement_gradients, sampled_placement_gradients,
    sequence_placement_gradients,
)
from .ppo import (
    Batch, SeqPPOConfig, SeqTrainResult, adaptive_kl_update, gae, last_token, per_token_rewards, policy_loss,
    sample_responses, sweep, train, train_python_loop, value_loss, whiten,
)
from .contrasts import (
    CurveResult, GRPOConfig, best_of_n_kl_formula, best_of_n_logp, best_of_n_summary, dpo_loss,
    exact_gradient_ascent, group_advantages, grpo_loss, rloo_advantages, rloo_loss, train_dpo, train_grpo, train_rloo,
)
from . import length_bias

__all__ = [
    "DEFAULT_LANGUAGE", "Language", "Tree", "context_features", "decode", "masked_mean", "masked_nll",
    "prefix_tree", "response_mask", "sequence_logprob", "step_features",
    "init_policy", "init_value", "policy_logits", "policy_logp", "token_logp", "value",
    "GoldReward", "gold_reward", "gold_table", "gold_terms", "make_gold", "random_gold",
    "MarkovChain", "SFTResult", "demonstration_counts", "fit_reference", "random_chain", "sample_demonstrations",
    "Pairs", "ProxyReward", "fit_proxy", "preference_loss", "proxy_features", "proxy_reward", "sample_pairs",
    "exact", "DEFAULT_SEED", "Task", "TaskArrays", "default_task", "evaluate_policy", "make_task", "optimum_summary",
    "exact_token_kl", "expected_estimates", "k1", "k2", "k3", "placement_gradients",
    "sampled_placement_gradients", "sequence_placement_gradients",
    "Batch", "SeqPPOConfig", "SeqTrainResult", "adaptive_kl_update", "gae", "last_token", "per_token_rewards",
    "policy_loss", "sample_responses", "sweep", "train", "train_python_loop", "value_loss", "whiten",
    "CurveResult", "GRPOConfig", "best_of_n_kl_formula", "best_of_n_logp", "best_of_n_summary", "dpo_loss",
    "exact_gradient_ascent", "group_advantages", "grpo_loss", "rloo_advantages", "rloo_loss", "train_dpo",
    "train_grpo", "train_rloo", "length_bias",
]
