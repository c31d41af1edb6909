"""Classic-mistake recipes for the assignment ``a3_ppo_sequences`` (notebooks in ``source/a3_ppo_sequences/``).

Same format as ``examples/mistakes/a2_ppo_rlhf.py``: each recipe names the notebook and the answer cell
(nbgrader ``grade_id``) to overwrite, the complete student code for that cell, and the test cells
that must fail (``grade_id`` -> a substring of the failure message, or ``None``). Every other test
cell of the notebook must still pass. Recipes with ``classic: True`` are bundled as example
students (``make examples``); the others are exercised by ``tests/test_source_ppo_sequences.py``
only, to keep the bundled class small.

Helpers: :func:`apply_mistake` returns a copy of a notebook with the recipe applied.
"""
from __future__ import annotations

import copy

NB_MASKS = "01_masks_and_sft.ipynb"
NB_PIECES = "02_ppo_pieces.ipynb"
NB_LOOP = "03_loop_and_analysis.ipynb"

EOS_MASKED = '''\
def response_mask(tokens, eos, pad):
    # EOS treated like padding: the end token itself is masked out
    tokens = jnp.asarray(tokens)
    return ((tokens != eos) & (tokens != pad)).astype(jnp.float32)
'''

SCORE_ON_PADDING = '''\
def per_token_rewards(logp, ref_logp, score, mask, beta):
    # the score always goes on the final column: a padding position for every response that ended early
    last = jnp.zeros_like(mask).at[:, -1].set(1.0)
    return -beta * (logp - ref_logp) * mask + score[:, None] * last
'''

KL_WRONG_SIGN = '''\
def per_token_rewards(logp, ref_logp, score, mask, beta):
    length = jnp.sum(mask, axis=-1).astype(jnp.int32)
    last = jax.nn.one_hot(length - 1, mask.shape[-1]) * (length > 0)[:, None]
    return beta * (logp - ref_logp) * mask + score[:, None] * last   # the penalty became a bonus
'''

KL_AGAINST_OLD_POLICY = '''\
def batch_rewards(policy_params, ref_params, prompts, tokens, score, beta):
    mask = response_mask(tokens, EOS, PAD)
    feats = context_features(LANG, prompts, tokens)
    logp = token_logp(policy_params, feats, tokens) * mask
    ref_logp = token_logp(policy_params, feats, tokens) * mask   # the sampling policy, not the reference
    return per_token_rewards(logp, ref_logp, score, mask, beta)
'''

WHITEN_OVER_PADDING = '''\
def whiten(advantages, mask):
    # statistics over every position, padding zeros included
    mu = jnp.mean(advantages)
    return (advantages - mu) / jnp.sqrt(jnp.var(advantages) + 1e-8) * mask
'''

VALUE_LOSS_ON_PADDING = '''\
def value_loss(values, old_values, returns, mask, value_clip):
    v_clip = old_values + jnp.clip(values - old_values, -value_clip, value_clip)
    worst = jnp.maximum((values - returns) ** 2, (v_clip - returns) ** 2)
    return 0.5 * jnp.mean(worst)   # every position counts, padding included
'''

RECOMPUTE_OLD_LOGP = '''\
def ppo_epochs(params, prompts, tokens, old_logp, advantages, epsilon, learning_rate, epochs):
    mask = response_mask(tokens, EOS, PAD)
    feats = context_features(LANG, prompts, tokens)
    for _ in range(epochs):
        old_logp = token_logp(params, feats, tokens) * mask   # "refreshed" every epoch: the ratio is always 1

        def loss(p):
            return policy_loss(token_logp(p, feats, tokens), old_logp, advantages, mask, epsilon)

        grads = jax.grad(loss)(params)
        params = jax.tree_util.tree_map(lambda p, g: p - learning_rate * g, params, grads)
    return params
'''

GAE_BOOTSTRAP_PADDING = '''\
def gae(rewards, values, mask, gamma, lam):
    # values are not masked and the episode never ends: padding values are bootstrapped
    T = rewards.shape[-1]
    next_adv = jnp.zeros(rewards.shape[0])
    advs = []
    for t in reversed(range(T)):
        next_value = values[:, t + 1] if t + 1 < T else jnp.zeros(rewards.shape[0])
        not_last = 1.0 if t + 1 < T else 0.0
        delta = rewards[:, t] + gamma * next_value * not_last - values[:, t]
        next_adv = (delta + gamma * lam * not_last * next_adv) * mask[:, t]
        advs.append(next_adv)
    adv = jnp.stack(advs[::-1], axis=1)
    return adv, (adv + values * mask) * mask
'''

NLL_OVER_PADDING = '''\
def masked_nll(token_logp, mask):
    return -jnp.mean(token_logp * mask)   # padding positions counted in the mean


def sequence_logprob(token_logp, mask):
    return jnp.sum(jnp.where(mask > 0, token_logp, 0.0), axis=-1)
'''

POLICY_LOSS_OVER_PADDING = '''\
def policy_loss(logp, old_logp, advantages, mask, epsilon):
    ratio = jnp.exp(logp - jax.lax.stop_gradient(old_logp))
    adv = jax.lax.stop_gradient(advantages)
    terms = jnp.minimum(ratio * adv, jnp.clip(ratio, 1.0 - epsilon, 1.0 + epsilon) * adv)
    return -jnp.mean(terms * mask)
'''

MISTAKES: dict[str, dict] = {
    "eos_masked_as_padding": {
        "classic": True,
        "description": "the mask treats EOS like padding, so EOS itself is masked",
        "notebook": NB_MASKS,
        "cell": "response_mask_answer",
        "source": EOS_MASKED,
        "fails": {"test_seq_response_mask": "EOS itself is masked"},
    },
    "score_on_padding": {
        "classic": True,
        "description": "the score is put on the last column, a padding position for responses that ended early",
        "notebook": NB_PIECES,
        "cell": "per_token_rewards_answer",
        "source": SCORE_ON_PADDING,
        "fails": {
            "test_seq_rewards_score_position": "score put on a padding position",
            "test_seq_rewards_kl": "score put on a padding position",
        },
    },
    "kl_penalty_wrong_sign": {
        "classic": False,
        "description": "+beta instead of -beta: the KL penalty rewards drifting from the reference",
        "notebook": NB_PIECES,
        "cell": "per_token_rewards_answer",
        "source": KL_WRONG_SIGN,
        "fails": {"test_seq_rewards_kl": "the KL penalty has the wrong sign"},
    },
    "kl_against_old_policy_seq": {
        "classic": True,
        "description": "the KL part of the rewards compares the sampling policy with itself, not with the reference",
        "notebook": NB_LOOP,
        "cell": "batch_rewards_answer",
        "source": KL_AGAINST_OLD_POLICY,
        "fails": {"test_seq_batch_rewards": "KL measured against the old policy"},
    },
    "whiten_over_padding": {
        "classic": False,
        "description": "advantages whitened with statistics over padding too",
        "notebook": NB_PIECES,
        "cell": "whiten_answer",
        "source": WHITEN_OVER_PADDING,
        "fails": {"test_seq_whiten": "advantages whitened over padding"},
    },
    "value_loss_on_padding": {
        "classic": False,
        "description": "the value loss is averaged over every position, padding included",
        "notebook": NB_PIECES,
        "cell": "value_loss_answer",
        "source": VALUE_LOSS_ON_PADDING,
        "fails": {"test_seq_value_loss": "the value loss is taken on padding"},
    },
    "recompute_old_logp_epochs": {
        "classic": True,
        "description": "old log-probs recomputed from the current parameters at every epoch",
        "notebook": NB_LOOP,
        "cell": "ppo_epochs_answer",
        "source": RECOMPUTE_OLD_LOGP,
        "fails": {"test_seq_ppo_epochs": "old log-probs recomputed during the epochs"},
    },
    "gae_bootstrap_padding": {
        "classic": False,
        "description": "GAE bootstraps from the values on padding positions",
        "notebook": NB_PIECES,
        "cell": "gae_answer",
        "source": GAE_BOOTSTRAP_PADDING,
        "fails": {"test_seq_gae": "bootstrapped from a padding position",
                  "test_seq_gae_edges": "bootstrapped from a padding position"},
    },
    "nll_over_padding": {
        "classic": False,
        "description": "the SFT loss averages over padding positions too",
        "notebook": NB_MASKS,
        "cell": "masked_nll_answer",
        "source": NLL_OVER_PADDING,
        "fails": {"test_seq_masked_nll": "padding counted"},
    },
    "policy_loss_over_padding": {
        "classic": False,
        "description": "the clipped policy loss averages over padding positions too",
        "notebook": NB_PIECES,
        "cell": "policy_loss_answer",
        "source": POLICY_LOSS_OVER_PADDING,
        "fails": {"test_seq_policy_loss": "averaged over padding too"},
    },
}


def apply_mistake(nb, recipe: dict):
    """A deep copy of notebook ``nb`` whose cell ``recipe['cell']`` (by nbgrader grade_id) holds ``recipe['source']``."""
    out = copy.deepcopy(nb)
    for cell in out.cells:
        if cell.get("metadata", {}).get("nbgrader", {}).get("grade_id") == recipe["cell"]:
            cell.source = recipe["source"]
            return out
    raise KeyError(f"no cell with grade_id {recipe['cell']!r} in the notebook")
