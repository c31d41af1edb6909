# ---
# jupyter:
#   kernelspec:
#     display_name: Python 3 (ipykernel)
#     language: python
#     name: python3
# ---

# %% [markdown] nbgrader={"grade": false, "grade_id": "intro_01", "locked": true, "schema_version": 3, "solution": false, "task": false}
# # a2 · Build step 1: the reward-model loss and the signed PPO loss
#
# This assignment follows one RLHF run on a *bandit*: one prompt, three possible responses
# (actions), a reward model fitted to pairwise preferences, and a policy trained with PPO.
# Because there are only three actions, every expectation can be summed exactly, so nothing
# you measure is blurred by sampling noise.
#
# In this notebook you write the two losses everything else is built on.
#
# * **You will be able to** write the Bradley-Terry preference loss, and assemble the PPO loss of
#   one inner step from the signed clip, the exact KL to the reference and `stop_gradient` on
#   everything the step must hold fixed.
# * **Prerequisites:** the assignment `a1_ppo_objective` (the signed clip and the KL penalty on their
#   own); `jax.grad` and `jax.nn.log_softmax`.
# * **Expected time:** about 45 minutes.

# %% [markdown] nbgrader={"grade": false, "grade_id": "points_01", "locked": true, "schema_version": 3, "solution": false, "task": false}
# **Points.** This notebook: **12 points**. The whole assignment `a2_ppo_rlhf` (four notebooks) is worth **56 points**: 48 autograded and 8 graded by hand.
#
# | graded cell | points | how |
# |---|---|---|
# | **Task 1.1: `preference_loss`** (2 points) | | |
# | `test_preference_loss` | 2 | autograded |
# | **Task 1.2: `ppo_loss`** (10 points) | | |
# | `test_clip_named_terms` | 1 | autograded |
# | `test_clip_both_signs` | 3 | autograded |
# | `test_kl_term` | 2 | autograded |
# | `test_ppo_loss_value_grad` | 2 | autograded |
# | `test_ppo_loss_detached` | 2 | autograded |
#
# Run the notebook top to bottom after restarting the kernel. Visible tests help you; hidden tests on fresh random inputs decide the grade. Validate's "Success! Your notebook passes all the tests." means the visible tests passed, not that you have full marks. Keep the first code cell as it is, and do not delete, move or edit the locked cells (the grader restores them); your own extra cells are fine anywhere, and a harmless line above the first cell (a `%matplotlib` magic, say) is only listed for the instructor, it costs nothing.

# %% nbgrader={"grade": false, "grade_id": "grading_start", "locked": true, "schema_version": 3, "solution": false, "task": false}
from rlhf_lab import grading
grading.start()

# %% nbgrader={"grade": false, "grade_id": "imports_01", "locked": true, "schema_version": 3, "solution": false, "task": false}
import jax
import jax.numpy as jnp
import numpy as np


# %% [markdown] nbgrader={"grade": false, "grade_id": "pref_intro", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ## 1. The preference loss
#
# A linear reward model scores a response with features $x$ as $r(x) = x \cdot w$. Given a
# pair where a labeller preferred `chosen` over `rejected`, the Bradley-Terry model says
# the preference happens with probability $\sigma(m)$ for the margin
# $m = (x_{\text{chosen}} - x_{\text{rejected}}) \cdot w$. Its negative log-likelihood,
# averaged over pairs, is
#
# $$L(w) = \frac{1}{n}\sum_i \operatorname{softplus}(-m_i), \qquad \operatorname{softplus}(z) = \log(1 + e^z).$$
#
# `softplus(-m)` equals $-\log\sigma(m)$ but never overflows. Only `w` is trained; the
# feature arrays are data.
#
# ### Task 1.1: `preference_loss` (2 points)

# %% nbgrader={"grade": false, "grade_id": "preference_loss_answer", "locked": false, "schema_version": 3, "solution": true, "task": false}
def preference_loss(w, chosen, rejected):
    """Bradley-Terry loss: mean_i softplus(-(chosen_i - rejected_i) . w).

    w: [d] reward weights (trained). chosen, rejected: [n_pairs, d] features (fixed data).
    Returns a scalar.
    """
    ### BEGIN SOLUTION
    margin = (chosen - rejected) @ w
    return jnp.mean(jax.nn.softplus(-margin))
    ### END SOLUTION


# %% nbgrader={"grade": true, "grade_id": "test_preference_loss", "locked": true, "points": 2, "schema_version": 3, "solution": false, "task": false}
# test_preference_loss: preference_loss matches the reference Bradley-Terry loss (value and gradient) on fresh random pairs
### BEGIN HIDDEN TESTS
grading.judge("test_preference_loss")
### END HIDDEN TESTS
# a zero margin costs log 2 per pair
assert abs(float(preference_loss(jnp.zeros(2), jnp.ones((3, 2)), jnp.zeros((3, 2)))) - np.log(2.0)) < 1e-6, (
    "with w = 0 every margin is 0, so the loss must be log 2 = 0.6931 (softplus(0), averaged over pairs)")


# %% [markdown] nbgrader={"grade": false, "grade_id": "ppo_intro", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ## 2. The signed clipped PPO loss
#
# Four objects appear in the loss, and each has its own lifetime:
#
# | name | what it is | changes when |
# |---|---|---|
# | `logits` | the **current** policy $\pi_\theta$ | every inner optimisation step |
# | `old_logp` | log-probabilities of the sampled actions under the **old (behaviour)** policy that collected the batch | once per rollout (frozen while the batch is reused) |
# | `ref_logp` | the **reference** policy $\pi_{\text{ref}}$, all actions | never |
# | `advantages` | frozen reward minus a baseline, per sample | once per rollout |
#
# With the ratio $\rho_i = \pi_\theta(a_i)/\pi_{\text{old}}(a_i) = \exp(\log\pi_\theta(a_i) - \texttt{old\_logp}_i)$,
# the loss minimised by one inner step is
#
# $$L(\theta) = -\frac{1}{B}\sum_i \min\big(\rho_i A_i,\ \operatorname{clip}(\rho_i, 1-\epsilon, 1+\epsilon)\,A_i\big)
# \;+\; \beta \sum_a \pi_\theta(a)\,\big(\log\pi_\theta(a) - \log\pi_{\text{ref}}(a)\big).$$
#
# Take the minimum of the two **products**: the sign of $A$ decides which bound can bind.
# The KL term is exact (a sum over all actions) and is measured against the reference,
# not the old policy. `old_logp`, `advantages` and `ref_logp` are constants of the update:
# wrap them in `jax.lax.stop_gradient` so no gradient can flow into them.
#
# ### Task 1.2: `ppo_loss` (10 points, five test cells)
#
# You met the signed clip and the exact KL in `a1_ppo_objective`; here they become one loss with the
# lifetimes above. From notebook 3 on, the course library's `ppo_loss` is given.

# %% nbgrader={"grade": false, "grade_id": "ppo_loss_answer", "locked": false, "schema_version": 3, "solution": true, "task": false}
def ppo_loss(logits, old_logp, actions, advantages, ref_logp, beta=0.1, epsilon=0.2):
    """-mean_i min(rho_i A_i, clip(rho_i, 1-eps, 1+eps) A_i) + beta * KL(pi || pi_ref).

    logits:     [n_actions] current policy parameters (the only trained argument)
    old_logp:   [batch] behaviour-policy log probs of the sampled actions (constant)
    actions:    [batch] int sampled actions
    advantages: [batch] advantages (constant)
    ref_logp:   [n_actions] reference log probs (constant for the whole run)
    Returns a scalar.
    """
    ### BEGIN SOLUTION
    logp = jax.nn.log_softmax(logits)
    old_logp = jax.lax.stop_gradient(old_logp)
    advantages = jax.lax.stop_gradient(advantages)
    ref_logp = jax.lax.stop_gradient(ref_logp)
    ratio = jnp.exp(logp[actions] - old_logp)
    clipped = jnp.clip(ratio, 1.0 - epsilon, 1.0 + epsilon)
    surrogate = jnp.mean(jnp.minimum(ratio * advantages, clipped * advantages))
    kl = jnp.sum(jnp.exp(logp) * (logp - ref_logp))
    return -surrogate + beta * kl
    ### END SOLUTION


# %% [markdown]
# **Prediction** (not graded, but write it down *before* running the next cell):
# with $\epsilon = 0.2$, what are the surrogate terms $\min(\rho A, \operatorname{clip}(\rho)A)$ for
# $(\rho, A) = (1.5, 2)$ and for $(\rho, A) = (0.5, -2)$? Which bound of the clip range matters
# in each case?
#
# *My prediction:* 

# %% nbgrader={"grade": false, "grade_id": "experiment_clip_terms", "locked": true, "schema_version": 3, "solution": false, "task": false}
def one_sample_term(loss_fn, ratio, advantage, epsilon):
    """The surrogate term of ONE sample, read off your loss: -loss on a batch of one with beta = 0.

    The batch is built so that pi(a) / pi_old(a) = ratio; with beta = 0 the KL penalty vanishes.
    """
    logits = jnp.array([0.4, -0.3, 0.1])
    logp = jax.nn.log_softmax(logits)
    old_logp = logp[1:2] - jnp.log(ratio)
    loss = loss_fn(logits, old_logp, jnp.array([1]), jnp.array([advantage]), logp, 0.0, epsilon)
    return -float(loss)


worked_terms = [one_sample_term(ppo_loss, 1.5, 2.0, 0.2), one_sample_term(ppo_loss, 0.5, -2.0, 0.2)]
print("clipped surrogate terms for (1.5, 2) and (0.5, -2):", np.round(worked_terms, 6))

# %% nbgrader={"grade": true, "grade_id": "test_clip_named_terms", "locked": true, "points": 1, "schema_version": 3, "solution": false, "task": false}
# test_clip_named_terms: the lesson's worked example: (rho, A) = (1.5, 2) and (0.5, -2) with epsilon 0.2 give [2.4, -1.6]
### BEGIN HIDDEN TESTS
grading.judge("test_clip_named_terms")
### END HIDDEN TESTS
assert not np.allclose(worked_terms, [2.4, -1.0], atol=1e-5), (
    "ratio clipped but the signed min was dropped (negative-advantage case wrong)")
assert np.allclose(worked_terms, [2.4, -1.6], atol=1e-5), f"expected [2.4, -1.6], got {worked_terms}"

# %% nbgrader={"grade": true, "grade_id": "test_clip_both_signs", "locked": true, "points": 3, "schema_version": 3, "solution": false, "task": false}
# test_clip_both_signs: per-sample terms equal min(rho*A, clip(rho)*A) for both signs of A, ratios below, inside and above the band
### BEGIN HIDDEN TESTS
grading.judge("test_clip_both_signs")
### END HIDDEN TESTS
# a ratio inside the band is not clipped, whatever the sign of A
assert abs(one_sample_term(ppo_loss, 1.1, -1.0, 0.2) - (-1.1)) < 1e-5, (
    "ratio 1.1 is inside the band [0.8, 1.2], so with A = -1 the surrogate term must be rho*A = -1.1")

# %% nbgrader={"grade": true, "grade_id": "test_kl_term", "locked": true, "points": 2, "schema_version": 3, "solution": false, "task": false}
# test_kl_term: with every ratio inside the clip band, the loss is -mean(rho*A) + beta*KL(pi || pi_ref): checks the KL penalty
### BEGIN HIDDEN TESTS
grading.judge("test_kl_term")
### END HIDDEN TESTS
# at the reference, with ratios of 1 and zero advantages, the loss is exactly 0
_logp = jax.nn.log_softmax(jnp.array([0.2, 0.0, -0.2]))
assert float(ppo_loss(jnp.array([0.2, 0.0, -0.2]), _logp[jnp.array([0, 2])], jnp.array([0, 2]),
                      jnp.zeros(2), _logp, 0.5, 0.2)) == 0.0, (
    "at the reference with zero advantages both terms vanish: the loss must be exactly 0.0")

# %% nbgrader={"grade": true, "grade_id": "test_ppo_loss_value_grad", "locked": true, "points": 2, "schema_version": 3, "solution": false, "task": false}
# test_ppo_loss_value_grad: value and gradient w.r.t. logits match the reference on a fresh batch (clipping and KL both active)
### BEGIN HIDDEN TESTS
grading.judge("test_ppo_loss_value_grad")
### END HIDDEN TESTS
_g = jax.grad(ppo_loss)(jnp.array([0.2, 0.0, -0.2]), jnp.log(jnp.array([0.3, 0.3])), jnp.array([0, 1]),
                        jnp.array([1.0, -1.0]), jax.nn.log_softmax(jnp.zeros(3)), 0.1, 0.2)
assert _g.shape == (3,) and bool(jnp.all(jnp.isfinite(_g))), (
    f"jax.grad of ppo_loss w.r.t. the 3 logits must be 3 finite numbers, got {_g}")

# %% nbgrader={"grade": true, "grade_id": "test_ppo_loss_detached", "locked": true, "points": 2, "schema_version": 3, "solution": false, "task": false}
# test_ppo_loss_detached: gradients w.r.t. old_logp and advantages are exactly zero (both are constants of the update)
### BEGIN HIDDEN TESTS
grading.judge("test_ppo_loss_detached")
### END HIDDEN TESTS
_go, _ga = jax.grad(ppo_loss, argnums=(1, 3))(jnp.array([0.2, 0.0, -0.2]), jnp.log(jnp.array([0.3, 0.3])),
                                              jnp.array([0, 1]), jnp.array([1.0, -1.0]),
                                              jax.nn.log_softmax(jnp.zeros(3)), 0.1, 0.2)
assert not bool(jnp.any(_ga)), "gradient flows into advantages: wrap them in stop_gradient"
assert not bool(jnp.any(_go)), "gradient flows into old_logp: wrap the behaviour log probs in stop_gradient"
