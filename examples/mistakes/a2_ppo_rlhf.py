"""Classic-mistake recipes for the assignment ``a2_ppo_rlhf`` (notebooks in ``source/a2_ppo_rlhf/``).

Each recipe says which notebook and which autograded answer cell (its nbgrader ``grade_id``) to
overwrite, the complete student code to put in that cell, and which autograder test cells
(``grade_id`` -> a substring of the failure message, or ``None`` for "fails, any message") must
fail. Every other autograded test cell of that notebook must still pass (the mistake loses only the
points of the tests that target it).

Used by the example-submissions builder (take the release notebook, write ``source`` into the cell
with ``cell``'s grade_id) and by ``tests/test_source_ppo_rlhf.py``. ``classic`` marks the mistakes
named in the course issue; the others are extra probes of the hidden tests.

Helpers: :func:`apply_mistake` returns a copy of a notebook with the recipe applied.
"""
from __future__ import annotations

import copy

NB_LOSSES = "01_losses.ipynb"
NB_REWARD = "02_reward_and_reference.ipynb"
NB_ROLLOUTS = "03_rollouts.ipynb"
NB_MAKE_IT_YOURS = "04_make_it_yours.ipynb"

# --- 01_losses: ppo_loss variants ------------------------------------------------------------------

_PPO_SIGNATURE = "def ppo_loss(logits, old_logp, actions, advantages, ref_logp, beta=0.1, epsilon=0.2):\n"

CLIP_WITHOUT_SIGNED_MIN = _PPO_SIGNATURE + '''\
    logp = jax.nn.log_softmax(logits)
    ratio = jnp.exp(logp[actions] - jax.lax.stop_gradient(old_logp))
    advantages = jax.lax.stop_gradient(advantages)
    clipped = jnp.clip(ratio, 1.0 - epsilon, 1.0 + epsilon)
    # the min is taken over the RATIOS, then multiplied by A: the sign of A no longer picks the bound
    surrogate = jnp.mean(jnp.minimum(ratio, clipped) * advantages)
    kl = jnp.sum(jnp.exp(logp) * (logp - jax.lax.stop_gradient(ref_logp)))
    return -surrogate + beta * kl
'''

KL_AGAINST_OLD_IN_LOSS = _PPO_SIGNATURE + '''\
    logp = jax.nn.log_softmax(logits)
    old_logp = jax.lax.stop_gradient(old_logp)
    advantages = jax.lax.stop_gradient(advantages)
    ratio = jnp.exp(logp[actions] - old_logp)
    clipped = jnp.clip(ratio, 1.0 - epsilon, 1.0 + epsilon)
    surrogate = jnp.mean(jnp.minimum(ratio * advantages, clipped * advantages))
    kl = jnp.mean(logp[actions] - old_logp)  # "KL" against the behaviour policy, not the reference
    return -surrogate + beta * kl
'''

NO_STOP_GRADIENT_ADVANTAGES = _PPO_SIGNATURE + '''\
    logp = jax.nn.log_softmax(logits)
    ratio = jnp.exp(logp[actions] - jax.lax.stop_gradient(old_logp))
    clipped = jnp.clip(ratio, 1.0 - epsilon, 1.0 + epsilon)
    surrogate = jnp.mean(jnp.minimum(ratio * advantages, clipped * advantages))  # advantages not detached
    kl = jnp.sum(jnp.exp(logp) * (logp - jax.lax.stop_gradient(ref_logp)))
    return -surrogate + beta * kl
'''

DELEGATION_IMPORT = "from rlhf_lab import ppo_loss\n"

DELEGATION_WRAPPER = '''\
import rlhf_lab as _lab


''' + _PPO_SIGNATURE + '''\
    """A thin wrapper: the library does the work."""
    return _lab.ppo.ppo_loss(logits, old_logp, actions, advantages, ref_logp, beta, epsilon)
'''

PREFERENCE_MARGIN_SIGN = '''\
def preference_loss(w, chosen, rejected):
    margin = (chosen - rejected) @ w
    return jnp.mean(jax.nn.softplus(margin))  # sign flipped: rewards the rejected response
'''

# --- 02_reward_and_reference -----------------------------------------------------------------------

SNAPSHOT_ALIASES_POLICY = '''\
def snapshot_reference(params):
    # np.asarray makes no copy of a float32 array: the "reference" IS the buffer the optimiser updates
    return np.asarray(params, dtype=np.float32)
'''

# --- 03_rollouts -----------------------------------------------------------------------------------

_ROLLOUT_SIGNATURE = '''\
def rollout_update(logits, draw_key, rewards, ref_logp, *, batch_size, epochs, beta, epsilon,
                   learning_rate):
'''

RECOMPUTE_OLD_LOGP = _ROLLOUT_SIGNATURE + '''\
    logits = jnp.asarray(logits, jnp.float32)
    old_logp_all = jax.nn.log_softmax(logits)
    actions = jax.random.categorical(draw_key, old_logp_all, shape=(batch_size,))
    advantages = rewards[actions] - jnp.sum(jnp.exp(old_logp_all) * rewards)
    for _ in range(epochs):
        old_logp = jax.nn.log_softmax(logits)[actions]  # recomputed every inner step: the ratio is always 1
        _, grad = ppo_step(logits, old_logp, actions, advantages, ref_logp, beta, epsilon)
        logits = logits - learning_rate * grad
    return logits
'''

KL_AGAINST_OLD_POLICY = _ROLLOUT_SIGNATURE + '''\
    logits = jnp.asarray(logits, jnp.float32)
    old_logp_all = jax.nn.log_softmax(logits)
    actions = jax.random.categorical(draw_key, old_logp_all, shape=(batch_size,))
    old_logp = old_logp_all[actions]
    advantages = rewards[actions] - jnp.sum(jnp.exp(old_logp_all) * rewards)
    for _ in range(epochs):
        # the behaviour policy is passed where the reference belongs
        _, grad = ppo_step(logits, old_logp, actions, advantages, old_logp_all, beta, epsilon)
        logits = logits - learning_rate * grad
    return logits
'''

DIAGNOSTICS_AFTER_STEP = '''\
def inner_diagnostics(logits, draw_key, rewards, ref_logp, *, batch_size, epochs, beta, epsilon,
                      learning_rate):
    logits = jnp.asarray(logits, jnp.float32)
    old_logp_all = jax.nn.log_softmax(logits)
    actions = jax.random.categorical(draw_key, old_logp_all, shape=(batch_size,))
    old_logp = old_logp_all[actions]
    advantages = rewards[actions] - jnp.sum(jnp.exp(old_logp_all) * rewards)
    rows = {"clip_frac": [], "k1": [], "k3": [], "exact_kl": [], "ratio": []}
    for _ in range(epochs):
        _, grad = ppo_step(logits, old_logp, actions, advantages, ref_logp, beta, epsilon)
        logits = logits - learning_rate * grad
        logp_all = jax.nn.log_softmax(logits)  # measured AFTER the step: the first ratios are not 1
        log_r = logp_all[actions] - old_logp
        r = jnp.exp(log_r)
        rows["ratio"].append(np.asarray(r))
        rows["clip_frac"].append(float(jnp.mean(jnp.abs(r - 1.0) > epsilon)))
        rows["k1"].append(float(jnp.mean(-log_r)))
        rows["k3"].append(float(jnp.mean((r - 1.0) - log_r)))
        rows["exact_kl"].append(float(jnp.sum(jnp.exp(old_logp_all) * (old_logp_all - logp_all))))
    return {**{name: np.array(values) for name, values in rows.items()}, "logits": np.asarray(logits)}
'''

HARD_CODED_RUN = '''\
def run_ppo(rewards, init_logits, *, iterations=40, batch_size=128, epochs=3, beta=0.2, epsilon=0.2,
            learning_rate=0.15, seed=11, update=rollout_update):
    # numbers copied from the lesson's printed output instead of running PPO
    print("Reward initial/final and final KL: 0.28191882 1.9185448 0.7824773")
    return {
        "reward": np.linspace(0.28191882, 1.9185448, iterations),
        "kl": np.linspace(0.0, 0.7824773, iterations),
        "probs": np.tile([[0.93, 0.05, 0.02]], (iterations, 1)),
        "final_logits": np.array([2.0, -0.6, -1.5], np.float32),
        "ref_logp": np.asarray(jax.nn.log_softmax(jnp.asarray(init_logits, jnp.float32))),
        "initial_reward": 0.28191882,
    }
'''

# --- 04_make_it_yours ------------------------------------------------------------------------------

TRANSFER_NO_STOP_GRADIENT = '''\
def multi_prompt_ppo_loss(logits, old_logp, actions, advantages, ref_logp, beta, epsilon):
    logp = jax.nn.log_softmax(logits, axis=-1)
    ratio = jnp.exp(jnp.take_along_axis(logp, actions, axis=1) - old_logp)  # nothing detached
    clipped = jnp.clip(ratio, 1.0 - epsilon, 1.0 + epsilon)
    surrogate = jnp.mean(jnp.minimum(ratio * advantages, clipped * advantages))
    kl = jnp.mean(jnp.sum(jnp.exp(logp) * (logp - ref_logp), axis=-1))
    return -surrogate + beta * kl
'''

NAIVE_EXP_OPTIMUM = '''\
def analytic_optimum(ref_logp, rewards, beta):
    unnormalised = jnp.exp(jnp.asarray(ref_logp)) * jnp.exp(jnp.asarray(rewards) / beta)  # overflows for small beta
    return jnp.log(unnormalised / jnp.sum(unnormalised))
'''

HARD_CODED_OPTIMUM = '''\
def analytic_optimum(ref_logp, rewards, beta):
    # the lesson's optimum, copied instead of computed
    return jnp.log(jnp.array([0.9404, 0.0487, 0.0109]))
'''


MISTAKES: dict[str, dict] = {
    "clip_without_signed_min": {
        "classic": True,
        "description": "clips the ratio but takes the min over ratios, so the sign of A no longer picks the bound",
        "notebook": NB_LOSSES,
        "cell": "ppo_loss_answer",
        "source": CLIP_WITHOUT_SIGNED_MIN,
        "fails": {
            "test_clip_named_terms": "ratio clipped but the signed min was dropped",
            "test_clip_both_signs": "ratio clipped but the signed min was dropped",
            "test_ppo_loss_value_grad": "ratio clipped but the signed min was dropped",
        },
    },
    "recompute_old_logp": {
        "classic": True,
        "description": "recomputes the old log probs from the current logits before every inner step",
        "notebook": NB_ROLLOUTS,
        "cell": "rollout_update_answer",
        "source": RECOMPUTE_OLD_LOGP,
        "fails": {
            "test_rollout_update_fresh": "ratios are always 1: old log probs recomputed after every inner step",
            "test_old_logp_frozen": "ratios are always 1: old log probs recomputed after every inner step",
        },
    },
    "kl_against_old_policy": {
        "classic": True,
        "description": "passes the behaviour policy's log probs where the fixed reference belongs",
        "notebook": NB_ROLLOUTS,
        "cell": "rollout_update_answer",
        "source": KL_AGAINST_OLD_POLICY,
        "fails": {
            "test_rollout_update_fresh": "KL measured against the old policy, not the reference",
            "test_kl_against_reference": "KL measured against the old policy, not the reference",
        },
    },
    "kl_against_old_in_loss": {
        "classic": True,
        "description": "the loss's KL term is a sample estimate against old_logp instead of KL(pi || pi_ref)",
        "notebook": NB_LOSSES,
        "cell": "ppo_loss_answer",
        "source": KL_AGAINST_OLD_IN_LOSS,
        "fails": {
            "test_kl_term": "KL not measured against ref_logp",
            "test_ppo_loss_value_grad": "KL not measured against ref_logp",
        },
    },
    "no_stop_gradient_advantages": {
        "classic": True,
        "description": "advantages are not wrapped in stop_gradient",
        "notebook": NB_LOSSES,
        "cell": "ppo_loss_answer",
        "source": NO_STOP_GRADIENT_ADVANTAGES,
        "fails": {"test_ppo_loss_detached": "gradient flows into advantages: wrap them in stop_gradient"},
    },
    "hard_coded_run": {
        "classic": True,
        "description": "run_ppo returns (and prints) the recorded numbers without running PPO",
        "notebook": NB_ROLLOUTS,
        "cell": "run_ppo_answer",
        "source": HARD_CODED_RUN,
        "fails": {
            "test_loop": "run_ppo must call its update argument once per rollout",
            "test_recorded_numbers": "fresh short run",
        },
    },
    "delegation_import": {
        "classic": True,
        "delegation": True,  # graded: the grading kernel's build has no ppo_loss (see a1's delegated_alias)
        "description": "`from rlhf_lab import ppo_loss` instead of an implementation",
        "notebook": NB_LOSSES,
        "cell": "ppo_loss_answer",
        "source": DELEGATION_IMPORT,
        "fails": {
            name: "must be implemented, not delegated"
            for name in ("test_clip_named_terms", "test_clip_both_signs", "test_kl_term",
                         "test_ppo_loss_value_grad", "test_ppo_loss_detached")
        },
    },
    "delegation_wrapper": {
        "classic": False,
        "delegation": True,
        "description": "a thin wrapper around rlhf_lab.ppo.ppo_loss",
        "notebook": NB_LOSSES,
        "cell": "ppo_loss_answer",
        "source": DELEGATION_WRAPPER,
        "fails": {
            name: "must be implemented, not delegated"
            for name in ("test_clip_named_terms", "test_clip_both_signs", "test_kl_term",
                         "test_ppo_loss_value_grad", "test_ppo_loss_detached")
        },
    },
    "preference_margin_sign": {
        "classic": False,
        "description": "preference loss with the margin's sign flipped",
        "notebook": NB_LOSSES,
        "cell": "preference_loss_answer",
        "source": PREFERENCE_MARGIN_SIGN,
        "fails": {"test_preference_loss": "the margin has the wrong sign"},
    },
    "snapshot_aliases_policy": {
        "classic": False,
        "description": "the reference is np.asarray of the parameters: the same buffer the optimiser updates in place",
        "notebook": NB_REWARD,
        "cell": "snapshot_reference_answer",
        "source": SNAPSHOT_ALIASES_POLICY,
        "fails": {"test_reference_snapshot": "it shares memory with the parameters"},
    },
    "diagnostics_after_step": {
        "classic": False,
        "description": "the PPO diagnostics are measured after each inner step, so the first ratios are not 1",
        "notebook": NB_ROLLOUTS,
        "cell": "inner_diagnostics_answer",
        "source": DIAGNOSTICS_AFTER_STEP,
        "fails": {"test_inner_diagnostics": "measured AFTER each inner step"},
    },
    "transfer_no_stop_gradient": {
        "classic": False,
        "description": "several-prompt loss without stop_gradient on old log probs and advantages",
        "notebook": NB_MAKE_IT_YOURS,
        "cell": "multi_prompt_loss_answer",
        "source": TRANSFER_NO_STOP_GRADIENT,
        "fails": {"test_transfer_detached": "gradient flows into advantages: wrap them in stop_gradient"},
    },
    "naive_exp_optimum": {
        "classic": False,
        "description": "analytic optimum computed with exp(r / beta) instead of in log space",
        "notebook": NB_MAKE_IT_YOURS,
        "cell": "analytic_optimum_answer",
        "source": NAIVE_EXP_OPTIMUM,
        "fails": {
            "test_optimum_log_space": "compute it in log space",
            "test_optimum_bound": "compute it in log space",
        },
    },
    "hard_coded_optimum": {
        "classic": False,
        "description": "the lesson's optimum probabilities copied instead of computed",
        "notebook": NB_MAKE_IT_YOURS,
        "cell": "analytic_optimum_answer",
        "source": HARD_CODED_OPTIMUM,
        "fails": {"test_optimum_log_space": None, "test_optimum_bound": None},
    },
}


def apply_mistake(nb, recipe: dict):
    """Return a deep copy of notebook ``nb`` with ``recipe['source']`` in the cell ``recipe['cell']``.

    The cell is found by its nbgrader ``grade_id`` (works for source and release notebooks).
    Raises ``KeyError`` when no such cell exists.
    """
    out = copy.deepcopy(nb)
    for cell in out.cells:
        if cell.get("metadata", {}).get("nbgrader", {}).get("grade_id") == recipe["cell"]:
            cell.source = recipe["source"]
            return out
    raise KeyError(f"no cell with grade_id {recipe['cell']!r} in the notebook")
