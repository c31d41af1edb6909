"""Mistake recipes for the ``a1_ppo_objective`` assignment (source/a1_ppo_objective/).

Each recipe turns the correct solution into a classic wrong submission by replacing the source of
ONE autograded answer cell. Format::

    name -> {
        "notebook": notebook file name inside the assignment,
        "grade_id": grade_id of the solution cell whose source is replaced,
        "code": the complete replacement source of that cell,
        "fails": grade_ids of the test cells (same notebook) that must lose their points,
        "message": a substring of the failure message the student sees in the first of them,
        "description": one line for grade tables and READMEs,
    }

Every other test cell of the assignment keeps its points (the dependent tasks are graded with a
trusted surrogate/penalty passed in, so one mistake is charged once). ``MISTAKES`` are the classic
mistakes the example-submission engineer should bundle; ``EXTRA_MISTAKES`` cover the remaining
diagnostics and are exercised by tests/test_source_ppo_objective.py. ``ALL_MISTAKES`` merges both.
"""
from __future__ import annotations

NB1 = "01_clipped_objective.ipynb"
NB2 = "02_kl_penalty_and_review.ipynb"

_SURROGATE_HEAD = '''def ppo_surrogate(ratio, advantage, epsilon=0.2, clip=True):
    ratio = jnp.asarray(ratio, dtype=jnp.float32)
    advantage = jnp.asarray(advantage, dtype=jnp.float32)
    unclipped = ratio * advantage
    if not clip:
        return unclipped
'''

MISTAKES: dict[str, dict] = {
    "dropped_signed_min": {
        "notebook": NB1,
        "grade_id": "ppo_surrogate",
        "code": _SURROGATE_HEAD + "    return jnp.clip(ratio, 1.0 - epsilon, 1.0 + epsilon) * advantage\n",
        "fails": ["test_ppo_surrogate"],
        "message": "Clipped the ratio but dropped the signed min",
        "description": "clips the ratio but returns clip(ratio)*A without the signed min",
    },
    "kl_direction_reversed": {
        "notebook": NB2,
        "grade_id": "kl_divergence",
        "code": '''def kl_divergence(logits_p, logits_q):
    logp = jax.nn.log_softmax(jnp.asarray(logits_p, dtype=jnp.float32))
    ref_logp = jax.nn.log_softmax(jnp.asarray(logits_q, dtype=jnp.float32))
    return jnp.sum(jnp.exp(ref_logp) * (ref_logp - logp))   # KL(reference || policy)
''',
        "fails": ["test_kl_divergence"],
        "message": "KL direction reversed: measure KL(policy || reference)",
        "description": "measures KL(reference || policy) instead of KL(policy || reference)",
    },
    "hard_coded_table": {
        "notebook": NB1,
        "grade_id": "surrogate_table",
        "code": '''def surrogate_table(ratios, advantages, epsilon=0.2, surrogate=ppo_surrogate):
    # copied from the module's printout instead of computed
    print("good action, ratio grows a lot  unclipped= 1.8000 clipped= 1.2000 diverge=True")
    print("bad action, ratio shrinks a lot unclipped=-0.3000 clipped=-0.8000 diverge=True")
    return (jnp.array([1.8, 1.05, -1.8, -0.3, 0.3]),
            jnp.array([1.2, 1.05, -1.8, -0.8, 0.3]),
            jnp.array([True, False, False, True, False]))
''',
        "fails": ["test_surrogate_table"],
        "message": "does not follow fresh inputs",
        "description": "prints and returns the module's table instead of computing it",
    },
    "delegated_alias": {
        "notebook": NB1,
        "grade_id": "ppo_surrogate",
        "code": "from rlhf_lab.ppo import clipped_surrogate as ppo_surrogate\n",
        "fails": ["test_ppo_surrogate"],
        "message": "must be implemented, not delegated",
        # graded: the grading kernel's library build has no clipped_surrogate (tests/test_library_build.py,
        # the hostile delegation cases); "message" is what a kernel with the full library says
        "delegation": True,
        "description": "imports the course library's clipped_surrogate under the task's name",
    },
    "delegated_wrapper": {
        "notebook": NB1,
        "grade_id": "ppo_surrogate",
        "code": '''import rlhf_lab

def ppo_surrogate(ratio, advantage, epsilon=0.2, clip=True):
    if not clip:
        return jnp.asarray(ratio) * advantage
    return rlhf_lab.clipped_surrogate(ratio, advantage, epsilon)
''',
        "fails": ["test_ppo_surrogate"],
        "message": "must be implemented, not delegated",
        # graded: the grading kernel's library build has no clipped_surrogate (tests/test_library_build.py,
        # the hostile delegation cases); "message" is what a kernel with the full library says
        "delegation": True,
        "description": "a thin wrapper around the course library's clipped_surrogate",
    },
}

EXTRA_MISTAKES: dict[str, dict] = {
    "max_instead_of_min": {
        "notebook": NB1,
        "grade_id": "ppo_surrogate",
        "code": _SURROGATE_HEAD + "    return jnp.maximum(unclipped, jnp.clip(ratio, 1.0 - epsilon, 1.0 + epsilon) * advantage)\n",
        "fails": ["test_ppo_surrogate"],
        "message": "Used max instead of min",
        "description": "takes the max of the two products instead of the min",
    },
    "sign_of_advantage_dropped": {
        "notebook": NB1,
        "grade_id": "ppo_surrogate",
        "code": _SURROGATE_HEAD + "    return jnp.minimum(ratio, jnp.clip(ratio, 1.0 - epsilon, 1.0 + epsilon)) * advantage\n",
        "fails": ["test_ppo_surrogate"],
        "message": "the sign of A was dropped",
        "description": "takes the min of the ratios, then multiplies by A",
    },
    "asymmetric_clip_bounds": {
        "notebook": NB1,
        "grade_id": "ppo_surrogate",
        "code": _SURROGATE_HEAD + "    return jnp.minimum(unclipped, jnp.clip(ratio, 1.0 / (1.0 + epsilon), 1.0 + epsilon) * advantage)\n",
        "fails": ["test_ppo_surrogate"],
        "message": "Clip bounds wrong (epsilon not applied symmetrically)",
        "description": "clips to [1/(1+eps), 1+eps] instead of [1-eps, 1+eps]",
    },
    "table_exact_comparison": {
        "notebook": NB1,
        "grade_id": "surrogate_table",
        "code": '''def surrogate_table(ratios, advantages, epsilon=0.2, surrogate=ppo_surrogate):
    unclipped = surrogate(ratios, advantages, epsilon, clip=False)
    clipped = surrogate(ratios, advantages, epsilon, clip=True)
    return unclipped, clipped, unclipped != clipped
''',
        "fails": ["test_surrogate_table"],
        "message": "use |unclipped - clipped| > DIVERGE_TOL",
        "description": "diverge compares exactly instead of with the 1e-6 tolerance",
    },
    "boundary_first_diverging": {
        "notebook": NB1,
        "grade_id": "clip_boundary",
        "code": '''def clip_boundary(epsilon, advantage, ratios=DEFAULT_RATIOS, surrogate=ppo_surrogate):
    ratios = jnp.asarray(ratios, dtype=jnp.float32)
    gap = jnp.abs(surrogate(ratios, advantage, epsilon, clip=False) - surrogate(ratios, advantage, epsilon))
    return float(ratios[np.asarray(gap > DIVERGE_TOL)][0])   # first diverging ratio
''',
        "fails": ["test_clip_boundary"],
        "message": "You returned the first DIVERGING ratio",
        "description": "returns the first diverging grid ratio instead of the boundary",
    },
    "boundary_from_formula": {
        "notebook": NB1,
        "grade_id": "clip_boundary",
        "code": '''def clip_boundary(epsilon, advantage, ratios=DEFAULT_RATIOS, surrogate=ppo_surrogate):
    return 1.0 + epsilon if advantage > 0 else 1.0 - epsilon
''',
        "fails": ["test_clip_boundary"],
        "message": "That is the formula value",
        "description": "returns 1 +/- epsilon without sweeping the grid",
    },
    "capped_pair_bad_action": {
        "notebook": NB1,
        "grade_id": "capped_pair",
        "code": "capped_ratio = 0.3\ncapped_advantage = -1.0\n",
        "fails": ["test_capped_pair"],
        "message": "the advantage must be positive",
        "description": "picks a clipped bad action instead of a capped good one",
    },
    "cap_lost_reversed": {
        "notebook": NB1,
        "grade_id": "cap_numbers",
        "code": '''def cap_numbers(ratio, advantage, epsilon=0.2, surrogate=ppo_surrogate):
    unclipped = float(surrogate(ratio, advantage, epsilon, clip=False))
    clipped = float(surrogate(ratio, advantage, epsilon, clip=True))
    return unclipped, clipped, clipped - unclipped   # sign of the lost incentive reversed
''',
        "fails": ["test_capped_pair"],
        "message": "lost is unclipped - clipped",
        "description": "reports the lost incentive as clipped - unclipped (negative)",
    },
    "kl_log_of_softmax": {
        "notebook": NB2,
        "grade_id": "kl_divergence",
        "code": '''def kl_divergence(logits_p, logits_q):
    p = jax.nn.softmax(jnp.asarray(logits_p, dtype=jnp.float32))
    q = jax.nn.softmax(jnp.asarray(logits_q, dtype=jnp.float32))
    return jnp.sum(p * (jnp.log(p) - jnp.log(q)))
''',
        "fails": ["test_kl_divergence"],
        "message": "Compute in log space",
        "description": "log(softmax(...)) instead of log_softmax: inf/nan for a tiny probability",
    },
    "penalty_added": {
        "notebook": NB2,
        "grade_id": "penalized_reward",
        "code": '''def penalized_reward(reward, beta, kl):
    return jnp.asarray(reward, dtype=jnp.float32) + beta * jnp.asarray(kl, dtype=jnp.float32)
''',
        "fails": ["test_penalized_reward"],
        "message": "The KL penalty is SUBTRACTED",
        "description": "adds the KL penalty instead of subtracting it",
    },
    "share_in_percent": {
        "notebook": NB2,
        "grade_id": "beta_sweep",
        "code": '''def beta_sweep(reward, kl, betas, penalize=penalized_reward):
    betas = jnp.asarray(betas, dtype=jnp.float32)
    return penalize(reward, betas, kl), 100 * betas * kl / reward
''',
        "fails": ["test_beta_sweep"],
        "message": "as a fraction (0.198), not a percentage",
        "description": "returns the consumed share in percent instead of as a fraction",
    },
    "gradient_of_unclipped_term": {
        "notebook": NB2,
        "grade_id": "surrogate_gradients",
        "code": '''def surrogate_gradients(ratios, advantages, epsilon=0.2, surrogate=clipped_surrogate):
    ratios = jnp.asarray(ratios, dtype=jnp.float32)
    advantages = jnp.asarray(advantages, dtype=jnp.float32)
    return jax.vmap(jax.grad(lambda r, a: r * a))(ratios, advantages)   # d(rho A)/d rho, the clip ignored
''',
        "fails": ["test_surrogate_gradients"],
        "message": "must have gradient exactly 0",
        "description": "differentiates the unclipped product rho*A, so no case ever has gradient 0",
    },
    "loss_without_kl": {
        "notebook": NB2,
        "grade_id": "clipped_kl_loss",
        "code": '''def clipped_kl_loss(logits, old_logp, actions, advantages, ref_logits, beta, epsilon=0.2,
                    surrogate=clipped_surrogate, kl=kl_divergence):
    logp = jax.nn.log_softmax(jnp.asarray(logits, dtype=jnp.float32))
    ratio = jnp.exp(logp[actions] - old_logp)
    return -jnp.mean(surrogate(ratio, advantages, epsilon))   # the KL penalty forgotten
''',
        "fails": ["test_clipped_kl_loss"],
        "message": "The KL term is missing",
        "description": "leaves beta * KL out of the PPO loss (no gradient at all once every term is clipped)",
    },
}

ALL_MISTAKES: dict[str, dict] = {**MISTAKES, **EXTRA_MISTAKES}
