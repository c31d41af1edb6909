# ---
# jupyter:
#   kernelspec:
#     display_name: Python 3 (ipykernel)
#     language: python
#     name: python3
# ---

# %% [markdown] nbgrader={"grade": false, "grade_id": "title", "locked": true, "schema_version": 3, "solution": false, "task": false}
# # a1 · PPO's objective, part 2: the KL penalty against a reference policy
#
# Notebook 1's clip removes a sample's incentive to move its ratio further outside the band in
# the direction its advantage favours. It does not bound the step, and nothing in it stops modest
# steps from adding up, batch after batch, to a policy that no longer looks like the model
# training started from. RLHF therefore also charges for distance: β times the KL divergence from
# the **reference policy**, a copy of the starting model (in practice, the supervised fine-tuned
# one) that is frozen for the whole run.
#
# **You will be able to** compute the exact KL between two categorical policies in log space,
# say what β trades, and show with `jax.grad` which part of the PPO loss still pulls when every
# surrogate term is clipped. **Prerequisites:** notebook 1 of this assignment, and `jax.grad`
# on a scalar function. **Expected time:** about one and a half hours.
#
# As before, write a guess in each **Predict** cell before running the experiment under it.
# Every graded piece is a numbered task, **Task 2.1** to **Task 2.12**.

# %% [markdown] nbgrader={"grade": false, "grade_id": "points_part2", "locked": true, "schema_version": 3, "solution": false, "task": false}
# **Points.** This notebook: **28 points**. The whole assignment `a1_ppo_objective` (two notebooks) is worth **46 points**: 31 autograded and 15 graded by hand.
#
# Tasks and the cells that grade them: Task 2.1 `test_kl_divergence`, Task 2.2 `test_penalized_reward`, Task 2.3 `test_beta_sweep`, Task 2.4 `ex2_discussion`, Task 2.5 `test_surrogate_gradients`, Task 2.6 `test_clipped_kl_loss`, Task 2.7 `challenge_answer`, Tasks 2.8 to 2.12 `cyu_q1` to `cyu_q5`.
#
# | graded cell | points | how |
# |---|---|---|
# | `test_kl_divergence` | 5 | autograded |
# | `test_penalized_reward` | 2 | autograded |
# | `test_beta_sweep` | 3 | autograded |
# | `ex2_discussion` | 3 | graded by hand |
# | `test_surrogate_gradients` | 3 | autograded |
# | `test_clipped_kl_loss` | 3 | autograded |
# | `challenge_answer` | 4 | graded by hand |
# | `cyu_q1` | 1 | graded by hand |
# | `cyu_q2` | 1 | graded by hand |
# | `cyu_q3` | 1 | graded by hand |
# | `cyu_q4` | 1 | graded by hand |
# | `cyu_q5` | 1 | graded by hand |
#
# Run the notebook top to bottom after restarting the kernel. Visible tests help you; hidden tests on fresh random inputs decide the grade. Validate's "Success! Your notebook passes all the tests." means the visible tests passed, not that you have full marks. Keep the first code cell as it is, and do not delete, move or edit the locked cells (the grader restores them); your own extra cells are fine anywhere, and a harmless line above the first cell (a `%matplotlib` magic, say) is only listed for the instructor, it costs nothing.

# %% nbgrader={"grade": false, "grade_id": "setup_grading", "locked": true, "schema_version": 3, "solution": false, "task": false}
from rlhf_lab import grading
grading.start()

# %% nbgrader={"grade": false, "grade_id": "imports", "locked": true, "schema_version": 3, "solution": false, "task": false}
import jax
import jax.numpy as jnp
import numpy as np
import matplotlib.pyplot as plt

# A four-action toy: the current policy and two frozen references, as logits.
LOGITS_POLICY = jnp.array([2.0, 0.5, 0.1, -1.0])
LOGITS_REF_CLOSE = jnp.array([1.8, 0.6, 0.0, -0.9])   # a reference close to the policy
LOGITS_REF_FAR = jnp.array([-1.0, 2.0, 1.5, 0.8])     # a reference far from it
RAW_REWARD = 1.0
BETA = 0.1


# %% [markdown] nbgrader={"grade": false, "grade_id": "concept_kl", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ## The penalised reward
#
# $$r_\text{penalised} = r - \beta\,\mathrm{KL}(\pi \,\|\, \pi_\text{ref}),\qquad
# \mathrm{KL}(\pi\,\|\,\pi_\text{ref}) = \sum_a \pi(a)\,\big(\log\pi(a) - \log\pi_\text{ref}(a)\big)\ \text{nats}.$$
#
# The direction matters: the sum is weighted by the **current policy** $\pi$, so the penalty
# is large when the policy puts probability where the reference puts little. $\beta > 0$ sets
# the exchange rate between reward and drift. With $r$ the policy's expected reward, this is the
# value of the regularised objective $\mathbb E_\pi[r] - \beta\,\mathrm{KL}$ for that policy: one number
# per policy, for comparing policies.

# %% [markdown] nbgrader={"grade": false, "grade_id": "task4_intro", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ### Task 2.1: `kl_divergence` (5 points)
#
# Implement `kl_divergence(logits_p, logits_q)` = KL(p ‖ q) exactly for two categorical
# distributions given by 1-D **logits** (unnormalised scores, not log-probabilities):
# `logits_p` is the current policy, `logits_q` the reference. Return a scalar in nats.
#
# Mind the inputs: this function takes logits and normalises them itself. The course
# library's `categorical_kl(logp, ref_logp)`, which you meet in `a2_ppo_rlhf`, takes
# **log-probabilities** that are already normalised (the output of `jax.nn.log_softmax`).
#
# Work in **log space**: get log-probabilities with `jax.nn.log_softmax`, not
# `jnp.log(jax.nn.softmax(...))`. The latter turns a tiny probability into `log(0) = -inf` and
# the KL into `inf` or `nan`; the hidden tests include such a case. Implement it yourself
# (the library's `categorical_kl` is off limits for this task).

# %% nbgrader={"grade": false, "grade_id": "kl_divergence", "locked": false, "schema_version": 3, "solution": true, "task": false}
def kl_divergence(logits_p, logits_q):
    """Exact KL(p || q) = sum_a p(a) (log p(a) - log q(a)) in nats.

    Args:
      logits_p: [n] logits (not log-probabilities) of the current policy, the distribution
        doing the weighting.
      logits_q: [n] logits (not log-probabilities) of the frozen reference.

    Returns:
      scalar jax array, >= 0, exactly 0 when the two distributions are equal.
    """
    ### BEGIN SOLUTION
    logp = jax.nn.log_softmax(jnp.asarray(logits_p, dtype=jnp.float32))
    ref_logp = jax.nn.log_softmax(jnp.asarray(logits_q, dtype=jnp.float32))
    return jnp.sum(jnp.exp(logp) * (logp - ref_logp))
    ### END SOLUTION


# %% [markdown]
# **Predict.** Look at the three sets of logits. Roughly how large is the KL to the close
# reference, and to the far one? With β = 0.1 and a raw reward of 1.0, how much reward does
# each keep?
#
# *My prediction:*

# %% nbgrader={"grade": true, "grade_id": "test_kl_divergence", "locked": true, "points": 5, "schema_version": 3, "solution": false, "task": false}
# test_kl_divergence: kl_divergence(logits_p, logits_q) equals the exact KL(p || q) on fresh logits, in log space (no underflow), 0 for p = q
### BEGIN HIDDEN TESTS
grading.judge("test_kl_divergence")
### END HIDDEN TESTS
# Visible checks: the module's two numbers, and KL(p || p) = 0.
np.testing.assert_allclose(kl_divergence(LOGITS_POLICY, LOGITS_REF_CLOSE), 0.0072039, atol=1e-6,
                           err_msg="KL(policy || close reference) in nats (DESIRED is the expected value)")
np.testing.assert_allclose(kl_divergence(LOGITS_POLICY, LOGITS_REF_FAR), 1.9827589, atol=1e-6,
                           err_msg="KL(policy || far reference) in nats (DESIRED is the expected value)")
_self = float(kl_divergence(LOGITS_POLICY, LOGITS_POLICY))
assert _self == 0.0, f"KL of a distribution with itself: expected exactly 0.0, got {_self}"
print("kl_divergence: visible checks passed")


# %% [markdown] nbgrader={"grade": false, "grade_id": "task5_intro", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ### Task 2.2: `penalized_reward` (2 points)
#
# Implement `penalized_reward(reward, beta, kl)` = `reward - beta * kl`. It must work for
# scalars and for arrays that broadcast (for example one `beta` and arrays of rewards and KLs).

# %% nbgrader={"grade": false, "grade_id": "penalized_reward", "locked": false, "schema_version": 3, "solution": true, "task": false}
def penalized_reward(reward, beta, kl):
    """reward - beta * KL(policy || reference); beta > 0 is held fixed, shapes broadcast."""
    ### BEGIN SOLUTION
    return jnp.asarray(reward, dtype=jnp.float32) - beta * jnp.asarray(kl, dtype=jnp.float32)
    ### END SOLUTION


# %% nbgrader={"grade": true, "grade_id": "test_penalized_reward", "locked": true, "points": 2, "schema_version": 3, "solution": false, "task": false}
# test_penalized_reward: penalized_reward equals reward - beta * KL on fresh inputs
### BEGIN HIDDEN TESTS
grading.judge("test_penalized_reward")
### END HIDDEN TESTS
np.testing.assert_allclose(penalized_reward(1.0, 0.1, 0.0072039), 0.99928, atol=1e-5,
                           err_msg="penalized_reward(1.0, 0.1, 0.0072039) (DESIRED is the expected value)")
np.testing.assert_allclose(penalized_reward(1.0, 0.1, 1.9827589), 0.80172, atol=1e-5,
                           err_msg="penalized_reward(1.0, 0.1, 1.9827589) (DESIRED is the expected value)")
print("penalized_reward: visible checks passed")

# %% nbgrader={"grade": false, "grade_id": "show_kl", "locked": true, "schema_version": 3, "solution": false, "task": false}
kl_close = float(kl_divergence(LOGITS_POLICY, LOGITS_REF_CLOSE))
kl_far = float(kl_divergence(LOGITS_POLICY, LOGITS_REF_FAR))
print(f"KL(policy || close reference) = {kl_close:.7f} nats")
print(f"KL(policy || far reference)   = {kl_far:.7f} nats")
print(f"raw reward {RAW_REWARD}; penalised with beta={BETA}: "
      f"close {float(penalized_reward(RAW_REWARD, BETA, kl_close)):.5f}, "
      f"far {float(penalized_reward(RAW_REWARD, BETA, kl_far)):.5f}")

actions = np.arange(4)
fig, ax = plt.subplots(figsize=(6.5, 3.4))
for k, (label, logits) in enumerate((("current policy", LOGITS_POLICY),
                                     ("close reference", LOGITS_REF_CLOSE),
                                     ("far reference", LOGITS_REF_FAR))):
    ax.bar(actions + (k - 1) * 0.27, jax.nn.softmax(logits), width=0.27, label=label)
ax.set_xticks(actions)
ax.set_xlabel("action index")
ax.set_ylabel("probability (dimensionless)")
ax.set_title("The policy and the two references")
ax.legend()
fig.tight_layout()


# %% [markdown] nbgrader={"grade": false, "grade_id": "read_kl", "locked": true, "schema_version": 3, "solution": false, "task": false}
# The raw reward is the same in both cases; only the drift differs. The close reference costs
# almost nothing, the far one removes about a fifth of the reward. These are values of the
# objective, one per policy. Subtracted as that one number from the reward of every sample, β·KL
# shifts all rewards by the same constant, and a constant shift changes no policy gradient (`a2_ppo_rlhf`,
# notebook 3, section 4, computes it exactly). What pulls the policy back towards the reference is a
# penalty that differs per sample, $-\beta\,(\log\pi(a) - \log\pi_\text{ref}(a))$, whose expectation is
# the KL, or a KL term in the loss, as in Task 2.6 below.

# %% [markdown] nbgrader={"grade": false, "grade_id": "ex2_intro", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ### Task 2.3: how sensitive is the penalty to β? (3 points)
#
# Implement `beta_sweep(reward, kl, betas, penalize=penalized_reward)` returning a tuple
# `(penalised, share)` of two arrays, one entry per β:
#
# * `penalised[i] = penalize(reward, betas[i], kl)`;
# * `share[i] = betas[i] * kl / reward`, the **fraction** of the raw reward the penalty
#   consumes (0.198 means 19.8 %; `reward` is positive here).
#
# As in notebook 1, call the `penalize` argument: the tests pass a trusted one in (and another
# function with the same signature), a JAX function like `penalized_reward` that you may call
# with all the betas at once or `jax.vmap` over them. Then discuss the result (Task 2.4, 3 points).

# %% [markdown]
# **Predict.** For the far reference (KL ≈ 1.98 nats) and β in {0.01, 0.1, 0.5, 1.0}: from
# which β on does the penalty eat more than half of a raw reward of 1.0? Can the penalised
# reward become negative?
#
# *My prediction:*

# %% nbgrader={"grade": false, "grade_id": "beta_sweep", "locked": false, "schema_version": 3, "solution": true, "task": false}
def beta_sweep(reward, kl, betas, penalize=penalized_reward):
    """Penalised reward and the share of the raw reward consumed, for each beta.

    Args:
      reward: positive raw reward (scalar). kl: KL(policy || reference) in nats (scalar).
      betas: 1-D array of KL coefficients.
      penalize: function like penalized_reward(reward, beta, kl).

    Returns:
      (penalised, share): arrays of shape [len(betas)]; share = beta * kl / reward (a fraction).
    """
    ### BEGIN SOLUTION
    betas = jnp.asarray(betas, dtype=jnp.float32)
    penalised = penalize(reward, betas, kl)
    share = betas * kl / reward
    return penalised, share
    ### END SOLUTION


# %% nbgrader={"grade": false, "grade_id": "show_beta", "locked": true, "schema_version": 3, "solution": false, "task": false}
BETAS = jnp.array([0.01, 0.1, 0.5, 1.0])
penalised, share = beta_sweep(RAW_REWARD, kl_far, BETAS)
for beta, pen, sh in zip(BETAS, penalised, share):
    print(f"beta={float(beta):5.2f}: penalised reward {float(pen):+.5f}, penalty consumes {float(sh):7.2%} of the raw reward")

fig, (ax_r, ax_s) = plt.subplots(1, 2, figsize=(10, 3.6))
ax_r.plot(BETAS, penalised, "o-", label="penalised reward")
ax_r.axhline(RAW_REWARD, color="grey", ls="--", label="raw reward")
ax_r.axhline(0.0, color="black", lw=0.6)
ax_r.set_xscale("log")
ax_r.set_xlabel("KL coefficient β (dimensionless, log scale)")
ax_r.set_ylabel("reward (reward-model units)")
ax_r.set_title(f"far reference, KL = {kl_far:.3f} nats")
ax_r.legend()
ax_s.plot(BETAS, 100 * share, "o-", color="C3")
ax_s.axhline(100, color="grey", ls="--", label="the whole raw reward")
ax_s.set_xscale("log")
ax_s.set_xlabel("KL coefficient β (dimensionless, log scale)")
ax_s.set_ylabel("share of raw reward consumed (%)")
ax_s.legend()
fig.tight_layout()

# %% nbgrader={"grade": true, "grade_id": "test_beta_sweep", "locked": true, "points": 3, "schema_version": 3, "solution": false, "task": false}
# test_beta_sweep: beta_sweep returns the penalised reward and the KL share for each beta of a fresh grid
### BEGIN HIDDEN TESTS
grading.judge("test_beta_sweep")
### END HIDDEN TESTS
# Visible checks with the far reference's KL (a reference penalize is passed in).
_pen, _share = beta_sweep(1.0, 1.9827589, jnp.array([0.01, 0.1, 0.5, 1.0]),
                          penalize=lambda r, b, k: r - b * k)
np.testing.assert_allclose(_pen, [0.980172, 0.801724, 0.008621, -0.982759], atol=1e-5,
                           err_msg="penalised rewards (DESIRED is the expected value)")
np.testing.assert_allclose(_share, [0.019828, 0.198276, 0.991379, 1.982759], atol=1e-5,
                           err_msg="share of the raw reward consumed, as a fraction (DESIRED is the expected value)")
print("beta_sweep: visible checks passed")

# %% [markdown] nbgrader={"grade": false, "grade_id": "ex2_question", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ### Task 2.4: discuss the β trade-off (3 points, graded by hand)
#
# Quote the shares you printed. In a real
# RLHF run, what does a team gain by choosing a larger β, and what does it give up?

# %% [markdown] nbgrader={"grade": true, "grade_id": "ex2_discussion", "locked": false, "points": 3, "schema_version": 3, "solution": true, "task": false}
# ### BEGIN SOLUTION
# **Model answer.** For the far reference (KL = 1.9827589 nats) and a raw reward of 1.0 the sweep
# printed: β = 0.01 consumes 1.98% (penalised +0.98017), β = 0.1 consumes 19.83% (+0.80172),
# β = 0.5 consumes 99.14% (+0.00862) and β = 1.0 consumes 198.28% (−0.98276). The share is
# $\beta\,\mathrm{KL}/r$, so it grows in proportion to β: at 0.5 almost nothing of the reward is left,
# and at 1.0 the drift is charged about twice what the reward is worth, so the penalised reward is
# negative and moving that far does not pay at all.
#
# A larger β makes every nat of drift from the frozen reference (the supervised model) more
# expensive, so the policy stays close to it. The team keeps more of what that model already does
# well (fluent text, general knowledge, following instructions), leaves the policy less room to
# find and exploit the weak spots of an imperfect reward model (reward hacking), and gets a
# steadier run.
#
# What it gives up is improvement: the policy may move less, so it learns more slowly and ends with
# less reward; the best penalised policy lies nearer the reference, so some of the gains the reward
# model asks for are never made. Too small a β has the opposite failure: the policy drifts far and
# over-optimises the reward model. β is a dial between the two, which teams tune, or adjust during
# training so that the measured KL stays near a chosen target.
#
# **Rubric (3 points).**
# - 1 pt: quotes the numbers: for KL about 1.98 nats, beta 0.01 / 0.1 / 0.5 / 1.0 consume
#   about 2 % / 20 % / 99 % / 198 % of a raw reward of 1.0 (penalised 0.980 / 0.802 / 0.009 /
#   -0.983): the cost grows linearly in beta and at beta = 1 drifting costs more than the whole
#   reward is worth.
# - 1 pt: larger beta buys safety: the policy is held near the reference, which preserves
#   general capabilities and instruction following, limits reward hacking of an imperfect
#   reward model, and keeps training stable.
# - 1 pt: larger beta costs improvement: the policy can move less, so it collects less of the
#   reward (slower learning, a lower reward ceiling; the optimum sits closer to the
#   reference); too small a beta lets it drift and exploit the reward model. The choice is a
#   trade-off, often tuned or adapted to a KL target.
# ### END SOLUTION

# %% [markdown] nbgrader={"grade": false, "grade_id": "concept_grad", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ## Gradients: what the clip switches off, and what the KL keeps
#
# An optimiser follows the **gradient** of the objective, not its value. Notebook 1 showed
# where the clip changes a term's value; this section asks where it changes the term's
# gradient with respect to its own ratio, and what is left of the gradient of the whole loss
# when the clip binds on every sample. The section has two tasks: the gradient column of
# notebook 1's five cases (Task 2.5), and the whole PPO loss with the KL penalty (Task 2.6).

# %% nbgrader={"grade": false, "grade_id": "grad_cases", "locked": true, "schema_version": 3, "solution": false, "task": false}
from rlhf_lab.ppo import clipped_surrogate   # given: clipped_surrogate(ratio, advantage, epsilon), the signed clip of notebook 1

EPSILON = 0.2
# notebook 1's five situations (name, probability ratio, advantage)
CASE_NAMES = (
    "good action, ratio grew a lot",
    "good action, ratio grew a little",
    "bad action, ratio grew a lot",
    "bad action, ratio shrank a lot",
    "good action, ratio shrank a lot",
)
CASE_RATIOS = jnp.array([1.8, 1.05, 1.8, 0.3, 0.3])
CASE_ADVANTAGES = jnp.array([1.0, 1.0, -1.0, -1.0, 1.0])


# %% [markdown] nbgrader={"grade": false, "grade_id": "task25_intro", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ### Task 2.5: the gradient column (3 points)
#
# Implement `surrogate_gradients(ratios, advantages, epsilon=0.2, surrogate=clipped_surrogate)`.
# It returns one number per case: the derivative of that case's term
# `surrogate(ratio, advantage, epsilon)` with respect to its own ratio, computed with
# `jax.grad` (for example `jax.vmap(jax.grad(...))` over the cases). The advantage and
# epsilon are held fixed. `surrogate` takes three arguments, like the library's
# `clipped_surrogate`; call the argument, the hidden tests pass their own in.

# %% [markdown]
# **Predict.** For each of the five cases, will the gradient be 0, +1 or −1? Which case
# surprises you?
#
# *My prediction:*

# %% nbgrader={"grade": false, "grade_id": "surrogate_gradients", "locked": false, "schema_version": 3, "solution": true, "task": false}
def surrogate_gradients(ratios, advantages, epsilon=0.2, surrogate=clipped_surrogate):
    """d/d ratio_i of surrogate(ratio_i, advantage_i, epsilon), one value per case.

    Args:
      ratios: [n] probability ratios pi_new(a) / pi_old(a) (the variable).
      advantages: [n] advantages (held fixed).
      epsilon: clip range (held fixed).
      surrogate: function surrogate(ratio, advantage, epsilon) -> objective term.

    Returns:
      [n] jax array: 0 where the clip binds, the advantage elsewhere.
    """
    ratios = jnp.asarray(ratios, dtype=jnp.float32)
    advantages = jnp.asarray(advantages, dtype=jnp.float32)
    ### BEGIN SOLUTION
    one_term = lambda r, a: surrogate(r, a, epsilon)
    return jax.vmap(jax.grad(one_term))(ratios, advantages)
    ### END SOLUTION


# %% nbgrader={"grade": false, "grade_id": "show_gradients", "locked": true, "schema_version": 3, "solution": false, "task": false}
values = clipped_surrogate(CASE_RATIOS, CASE_ADVANTAGES, EPSILON)
grads = surrogate_gradients(CASE_RATIOS, CASE_ADVANTAGES, EPSILON)
for name, r, a, v, g in zip(CASE_NAMES, CASE_RATIOS, CASE_ADVANTAGES, values, grads):
    print(f"{name:34s} ratio={float(r):4.2f} A={float(a):+4.1f} clipped={float(v):+7.4f} "
          f"d/d ratio={float(g) + 0.0:+5.2f}")

# %% nbgrader={"grade": true, "grade_id": "test_surrogate_gradients", "locked": true, "points": 3, "schema_version": 3, "solution": false, "task": false}
# test_surrogate_gradients: surrogate_gradients is the per-case d term / d ratio by jax.grad on fresh cases (exactly 0 where the clip binds, A elsewhere)
### BEGIN HIDDEN TESTS
grading.judge("test_surrogate_gradients")
### END HIDDEN TESTS
# Visible checks on the five cases (the library's surrogate is passed in).
_got = np.asarray(surrogate_gradients(CASE_RATIOS, CASE_ADVANTAGES, surrogate=clipped_surrogate), np.float64)
_want = np.array([0.0, 1.0, -1.0, 0.0, 1.0])
assert _got.shape == (5,), f"one gradient per case: expected shape (5,), got {_got.shape}"
assert np.allclose(_got, _want, atol=1e-6), f"gradients of the five cases: expected {_want}, got {_got}"
print("surrogate_gradients: visible checks passed")


# %% [markdown] nbgrader={"grade": false, "grade_id": "read_gradients", "locked": true, "schema_version": 3, "solution": false, "task": false}
# **Reading the column.** For one term,
#
# $$\frac{\partial}{\partial\rho}\min\big(\rho A,\ \operatorname{clip}(\rho, 1-\varepsilon, 1+\varepsilon)A\big)
# = \begin{cases} 0 & \text{where the clipped product is the smaller one (the clip binds)}\\
# A & \text{otherwise.}\end{cases}$$
#
# Where the clip binds, the clipped product is a constant in $\rho$, so that sample stops
# contributing to the update. This is a statement about single samples, not a band the policy
# is kept inside: nothing stops the ratio from leaving $[1-\varepsilon, 1+\varepsilon]$, and
# any other term of the loss still has its full gradient there.
# In the table, the two rows where the clip binds have gradient exactly 0: the
# update no longer pushes those samples at all. The row "bad action, ratio grew a lot" keeps
# its full gradient −1: for $A < 0$ the min picks the unclipped $\rho A$ (−1.8 is smaller
# than −1.2), which still depends on $\rho$, so the update keeps pulling that action's
# probability down however far the ratio has grown. Inside the band both products coincide
# and the gradient is $A$.

# %% [markdown] nbgrader={"grade": false, "grade_id": "task26_intro", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ### Task 2.6: the KL gradient survives the clip (3 points)
#
# The PPO loss of one inner step, minimised by gradient descent, is
#
# $$L(\theta) = -\frac{1}{B}\sum_{i=1}^{B} \operatorname{surrogate}(\rho_i, A_i, \varepsilon)
# + \beta\,\mathrm{KL}(\pi_\theta \,\|\, \pi_\text{ref}),\qquad
# \rho_i = \exp\big(\log\pi_\theta(a_i) - \texttt{old\_logp}_i\big).$$
#
# Implement `clipped_kl_loss(logits, old_logp, actions, advantages, ref_logits, beta,
# epsilon=0.2, surrogate=clipped_surrogate, kl=kl_divergence)`. Mind which inputs are logits
# and which are log-probabilities:
#
# * `logits` ([n], trained): the current policy's **logits**; take
#   `jax.nn.log_softmax(logits)[actions]` for $\log\pi_\theta(a_i)$;
# * `old_logp` ([B], fixed for the batch): **log-probabilities** of the sampled actions under
#   the old policy that collected the batch;
# * `ref_logits` ([n], fixed for the run): the reference's **logits**, passed to `kl` as
#   `kl(logits, ref_logits)`, your `kl_divergence` of Task 2.1;
# * `actions` ([B] ints), `advantages` ([B], fixed), `beta`, `epsilon` (fixed).
#
# Call the `surrogate` and `kl` arguments: the hidden tests pass their own in and take
# `jax.grad` of your loss on fresh batches, among them batches where every term is clipped.

# %% nbgrader={"grade": false, "grade_id": "clipped_kl_loss", "locked": false, "schema_version": 3, "solution": true, "task": false}
def clipped_kl_loss(logits, old_logp, actions, advantages, ref_logits, beta, epsilon=0.2,
                    surrogate=clipped_surrogate, kl=kl_divergence):
    """-mean_i surrogate(rho_i, A_i, epsilon) + beta * kl(logits, ref_logits), a scalar to minimise.

    rho_i = exp(log_softmax(logits)[actions_i] - old_logp_i). Only ``logits`` is trained;
    ``old_logp`` (log-probabilities, [B]), ``advantages`` ([B]) and ``ref_logits`` (logits,
    [n]) are held fixed.
    """
    ### BEGIN SOLUTION
    logp = jax.nn.log_softmax(jnp.asarray(logits, dtype=jnp.float32))
    ratio = jnp.exp(logp[actions] - old_logp)
    return -jnp.mean(surrogate(ratio, advantages, epsilon)) + beta * kl(logits, ref_logits)
    ### END SOLUTION


# %% nbgrader={"grade": false, "grade_id": "clip_batch", "locked": true, "schema_version": 3, "solution": false, "task": false}
# A batch collected by a uniform old policy, one sample of each action.
OLD_LOGITS = jnp.zeros(4)                        # the old policy that collected the batch (uniform)
ACTIONS = jnp.array([0, 1, 2, 3])                # one sample of each action
ADVANTAGES = jnp.array([1.0, -1.0, -1.0, -1.0])
OLD_LOGP = jax.nn.log_softmax(OLD_LOGITS)[ACTIONS]   # log-probabilities, fixed for the batch

# %% [markdown]
# **Predict.** In the batch above, with the current policy `LOGITS_POLICY`, every ratio is outside the band on the side where the clip binds.
# What is the gradient of the surrogate part of the loss? Is the gradient of the whole loss
# zero?
#
# *My prediction:*

# %% nbgrader={"grade": false, "grade_id": "show_clipped_kl", "locked": true, "schema_version": 3, "solution": false, "task": false}
ratios = jnp.exp(jax.nn.log_softmax(LOGITS_POLICY)[ACTIONS] - OLD_LOGP)
print("ratios:", np.round(np.asarray(ratios), 4), "(A = +1 above 1.2, A = -1 below 0.8: every term clipped)")
no_kl = jax.grad(clipped_kl_loss)(LOGITS_POLICY, OLD_LOGP, ACTIONS, ADVANTAGES, LOGITS_REF_FAR, 0.0)
with_kl = jax.grad(clipped_kl_loss)(LOGITS_POLICY, OLD_LOGP, ACTIONS, ADVANTAGES, LOGITS_REF_FAR, BETA)
kl_part = BETA * jax.grad(kl_divergence)(LOGITS_POLICY, LOGITS_REF_FAR)
print("gradient of the loss with beta = 0:  ", np.round(np.asarray(no_kl), 6))
print(f"gradient of the loss with beta = {BETA}:", np.round(np.asarray(with_kl), 6))
print("beta * gradient of the KL alone:      ", np.round(np.asarray(kl_part), 6))

# %% nbgrader={"grade": true, "grade_id": "test_clipped_kl_loss", "locked": true, "points": 3, "schema_version": 3, "solution": false, "task": false}
# test_clipped_kl_loss: clipped_kl_loss and its jax.grad match the PPO loss on fresh batches; with every term clipped the gradient is beta * grad KL
### BEGIN HIDDEN TESTS
grading.judge("test_clipped_kl_loss")
### END HIDDEN TESTS
# Visible checks on the batch above, with the library's surrogate and a stand-in for the KL whose
# gradient is easy to check by hand (half the squared distance of the logits: gradient logits - ref_logits).
_half_sq = lambda p, q: 0.5 * jnp.sum((jnp.asarray(p) - jnp.asarray(q)) ** 2)
_args = (LOGITS_POLICY, OLD_LOGP, ACTIONS, ADVANTAGES, LOGITS_REF_FAR)
_loss = float(clipped_kl_loss(*_args, 0.1, surrogate=clipped_surrogate, kl=_half_sq))
assert abs(_loss - 1.1225) < 1e-5, f"loss on the clipped batch: expected 1.1225 (0.3 + 0.1 * 8.225), got {_loss}"
for _beta, _want in ((0.0, [0.0, 0.0, 0.0, 0.0]), (0.1, [0.3, -0.15, -0.14, -0.18])):
    _g = np.asarray(jax.grad(clipped_kl_loss)(*_args, _beta, surrogate=clipped_surrogate, kl=_half_sq), np.float64)
    assert np.allclose(_g, _want, atol=1e-6), (f"gradient with every term clipped, beta={_beta}: expected "
                                               f"beta * (logits - ref_logits) = {_want}, got {_g}")
print("clipped_kl_loss: visible checks passed")

# %% [markdown] nbgrader={"grade": false, "grade_id": "read_clipped_kl", "locked": true, "schema_version": 3, "solution": false, "task": false}
# **Reading the gradients.** With β = 0 the gradient is exactly zero: every sample is
# clipped, so the surrogate no longer moves the policy. With β = 0.1 the gradient is exactly
# β times the KL's gradient. Clipping switches off the surrogate's incentive on those samples;
# it does not hold the policy anywhere. The KL term keeps pulling towards the reference
# whatever the ratios are.

# %% [markdown] nbgrader={"grade": false, "grade_id": "challenge_intro", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ### Task 2.7: independent challenge (4 points, graded by hand)
#
# A colleague claims that PPO can never make a large change to a policy, even a change the
# data clearly support, because the clip caps every update; in their view this makes PPO
# useless for RLHF.
#
# Is the claim right, partly right or wrong? Argue from what you measured in notebook 1 and
# in the gradient section above (quote your own numbers).

# %% [markdown] nbgrader={"grade": true, "grade_id": "challenge_answer", "locked": false, "points": 4, "schema_version": 3, "solution": true, "task": false}
# ### BEGIN SOLUTION
# **Model answer.** Partly right about a single step, wrong as a conclusion. The clip limits the
# incentive of one update only: the ratio is measured against $\pi_\text{old}$, the policy that
# sampled the current batch, and a sample stops paying once its ratio has moved past the band in
# the direction its advantage favours. It says nothing about the total change over training.
#
# What I measured: ratio 1.8 with $A = +1$ gives unclipped +1.8000 but clipped +1.2000; the sweep
# puts the boundary at 1.20 (the grid ratios 1.25 to 2.00 all diverge), and the gradient column
# gives d/d ratio = +0.00 for that row. Beyond $1 + \varepsilon$ the objective is flat, so within
# one step there is nothing to gain by pushing that probability higher.
#
# But PPO alternates rollouts and updates many times. Each rollout is sampled from the latest
# policy, which becomes the new $\pi_\text{old}$, so every ratio restarts at 1 and the band is again
# centred on the current probabilities. While the data keep giving the action a positive
# advantage, every iteration raises its probability again, and compounded over many iterations the
# change can be as large as the data justify: reached gradually, not capped. That is the bargain:
# less aggressive single steps, in exchange for not letting one noisy or overestimated advantage
# throw the policy far off in a single update.
#
# The clip is also one-sided. Ratio 1.8 with $A = -1$ keeps the full −1.8000 (not −1.2) and its
# gradient is −1.00, so an update that wrongly raised a bad action is always corrected in full.
# And the clip does not hold the policy anywhere: in the batch where every term was clipped the
# gradient was exactly 0 with β = 0, and with β = 0.1 it was exactly β times the KL's gradient,
# [0.093956, −0.049622, −0.032211, −0.012122]. What limits the long-run drift in RLHF is the KL
# penalty (a choice of β), not the clip. The colleague mistakes a bound on one step for a ceiling
# on the total change: the clip makes PPO more careful, at most slower, not unable to learn.
#
# **Rubric (4 points).**
# - 1 pt: identifies what the clip bounds: the incentive of ONE update step relative to the
#   old policy that collected the batch (ratio measured against pi_old), not the total change
#   over training.
# - 1 pt: uses the verified case: ratio 1.8, A = +1 gives unclipped 1.8 but clipped 1.2; the
#   objective is flat beyond 1 + epsilon, so one step cannot profit from pushing further.
# - 1 pt: explains accumulation: PPO runs many iterations; each new rollout resets the ratio
#   to 1 with a new old policy, so a consistent positive advantage keeps moving the
#   probability up, step by step, to a large total change. The clip trades per-step
#   aggressiveness for stability against noisy or overestimated advantages.
# - 1 pt: notes the asymmetry: ratio 1.8 with A = -1 keeps the full -1.8 (not -1.2), so the
#   clip never softens the correction of a bad update; conclusion: the claim confuses a
#   per-step bound with a ceiling on total change (at most "slower", not "cannot work").
# ### END SOLUTION

# %% [markdown] nbgrader={"grade": false, "grade_id": "cyu_intro", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ## Check your understanding: Tasks 2.8 to 2.12 (5 points, 1 each, graded by hand)
#
# Answer each question in two or three sentences in the cell below it.

# %% [markdown] nbgrader={"grade": false, "grade_id": "cyu_q1_text", "locked": true, "schema_version": 3, "solution": false, "task": false}
# **Task 2.8 (Q1, 1 point).** This assignment verifies two formulas of PPO and leaves the rest of a PPO iteration out. What does it leave out, and which two pieces does it verify?

# %% [markdown] nbgrader={"grade": true, "grade_id": "cyu_q1", "locked": false, "points": 1, "schema_version": 3, "solution": true, "task": false}
# ### BEGIN SOLUTION
# **Model answer.** A full PPO iteration samples responses from the live policy, scores them with
# a reward model, estimates each advantage with a value function (a critic), then updates the
# weights of a real model, and repeats this many times. None of that runs in this assignment, which
# isolates the objective; the course runs it later, on a CPU: `a2_ppo_rlhf` fits a reward model and
# trains the loop on a three-action bandit, and `a3_ppo_sequences` on short sequences from a small
# network, with a critic and GAE.
#
# What the assignment does check, on hand-picked numbers, are the two formulas that keep PPO's
# updates safe: the clipped surrogate objective
# $\min(\rho A, \operatorname{clip}(\rho, 1-\varepsilon, 1+\varepsilon)A)$ and the KL penalty
# $r - \beta\,\mathrm{KL}(\pi \,\|\, \pi_\text{ref})$ against a frozen reference policy.
#
# **Rubric (1 point).** Full credit: names what a full PPO iteration needs and is not run here (rollouts from a live
# policy, a reward model scoring them, a value function / critic for the advantage, many
# iterations of weight updates) and the two verified pieces: the clipped surrogate objective and
# the KL penalty against a frozen reference policy, the two formulas that keep PPO's updates safe.
# No reason for leaving the rest out is required; "too expensive for a CPU" is not a correct one
# (`a2_ppo_rlhf` and `a3_ppo_sequences` run rollouts, a fitted reward model, a critic and runs of
# 200 iterations on a CPU), so it earns nothing by itself.
# ### END SOLUTION

# %% [markdown] nbgrader={"grade": false, "grade_id": "cyu_q2_text", "locked": true, "schema_version": 3, "solution": false, "task": false}
# **Task 2.9 (Q2, 1 point).** Write the clipped surrogate objective. What does ε control, and what range of ratios does ε = 0.2 give?

# %% [markdown] nbgrader={"grade": true, "grade_id": "cyu_q2", "locked": false, "points": 1, "schema_version": 3, "solution": true, "task": false}
# ### BEGIN SOLUTION
# **Model answer.** $\text{objective}(\rho, A) = \min\big(\rho A,\ \operatorname{clip}(\rho, 1-\varepsilon, 1+\varepsilon)\,A\big)$
# with $\rho = \pi_\text{new}(a)/\pi_\text{old}(a)$. ε is the half-width of the
# band around $\rho = 1$ (probability unchanged) inside which the clipped term follows the ratio;
# with ε = 0.2 the clipped term uses the ratio limited to [0.8, 1.2] before multiplying by $A$,
# which is why my sweep found the boundaries 1.20 for $A > 0$ and 0.80 for $A < 0$. Outside the band
# a sample just stops adding incentive; it is not a trust region, and nothing prevents a ratio
# from leaving it.
#
# **Rubric (1 point).** Full credit: objective = min(ratio * A, clip(ratio, 1 - eps, 1 + eps) * A); epsilon is the
# half-width of the clip band around ratio = 1 (no change); with epsilon = 0.2 the ratio
# is clipped to [0.8, 1.2] inside the clipped term before multiplying by the advantage (a band
# where the incentive stops, not a trust region: nothing forbids a ratio outside it).
# ### END SOLUTION

# %% [markdown] nbgrader={"grade": false, "grade_id": "cyu_q3_text", "locked": true, "schema_version": 3, "solution": false, "task": false}
# **Task 2.10 (Q3, 1 point).** For ratio 1.8 and advantage +1, what are the unclipped and clipped objectives, and why do they differ?

# %% [markdown] nbgrader={"grade": true, "grade_id": "cyu_q3", "locked": false, "points": 1, "schema_version": 3, "solution": true, "task": false}
# ### BEGIN SOLUTION
# **Model answer.** Unclipped: $1.8 \times 1 = 1.8$. Clipped: $\operatorname{clip}(1.8, 0.8, 1.2) = 1.2$,
# so $1.2 \times 1 = 1.2$, and $\min(1.8, 1.2) = 1.2$ (my table printed +1.8000 and +1.2000,
# diverge=True). They differ because 1.8 lies above $1 + \varepsilon = 1.2$: with a positive advantage
# the capped term is the smaller product, so the objective stops growing at 1.2 and this step earns
# nothing more for raising a good action's probability further.
#
# **Rubric (1 point).** Full credit: unclipped 1.8, clipped 1.2. The ratio exceeds 1 + epsilon = 1.2, so the clipped
# term caps it at 1.2 before multiplying by the positive advantage and the min picks 1.2: one
# step gets no extra reward for pushing a good action's probability further.
# ### END SOLUTION

# %% [markdown] nbgrader={"grade": false, "grade_id": "cyu_q4_text", "locked": true, "schema_version": 3, "solution": false, "task": false}
# **Task 2.11 (Q4, 1 point).** For ratio 1.8 and advantage −1, work out both terms and the minimum. What does the result say about the clip's asymmetry?

# %% [markdown] nbgrader={"grade": true, "grade_id": "cyu_q4", "locked": false, "points": 1, "schema_version": 3, "solution": true, "task": false}
# ### BEGIN SOLUTION
# **Model answer.** Unclipped: $1.8 \times (-1) = -1.8$. Clipped: $\operatorname{clip}(1.8, 0.8, 1.2) = 1.2$,
# so $1.2 \times (-1) = -1.2$. The minimum is $\min(-1.8, -1.2) = -1.8$, the unclipped term, so the
# clip has no effect here (my table printed −1.8000 for both, diverge=False, and the gradient
# stays −1). The clip is asymmetric: it removes the reward for going on in a direction that already
# helped, but when an update has raised a bad action's probability the full penalty and its full
# gradient remain, so that mistake is corrected without any discount.
#
# **Rubric (1 point).** Full credit: clip(1.8, 0.8, 1.2) = 1.2, clipped term 1.2 * -1 = -1.2; unclipped 1.8 * -1 =
# -1.8; min(-1.8, -1.2) = -1.8, the unclipped value, so the clip has no effect. The clip never
# softens the incentive to correct an update that raised a bad action's probability; it only
# caps over-pushing in a direction that already improved things.
# ### END SOLUTION

# %% [markdown] nbgrader={"grade": false, "grade_id": "cyu_q5_text", "locked": true, "schema_version": 3, "solution": false, "task": false}
# **Task 2.12 (Q5, 1 point).** Compare the penalised rewards for the close and the far reference at β = 0.1. What does the comparison show?

# %% [markdown] nbgrader={"grade": true, "grade_id": "cyu_q5", "locked": false, "points": 1, "schema_version": 3, "solution": true, "task": false}
# ### BEGIN SOLUTION
# **Model answer.** With β = 0.1 the close reference (KL = 0.0072039 nats) leaves a penalised
# reward of 0.99928, practically the whole raw 1.0; the far reference (KL = 1.9827589 nats) leaves
# 0.80172, about a fifth less. The raw reward is identical, so the whole gap is drift: the penalty
# is β times the KL, so at a fixed β it grows linearly with how far the policy has moved from the
# frozen reference, and the same behaviour is worth less the further the policy has wandered.
#
# **Rubric (1 point).** Full credit: close reference KL about 0.0072 nats gives 0.99928, nearly the raw 1.0; far
# reference KL about 1.98 nats gives 0.80172, about a fifth of the reward lost. The same raw
# reward is penalised in proportion to how far the policy has drifted from the frozen
# reference (linear in KL at fixed beta).
# ### END SOLUTION

# %% [markdown] nbgrader={"grade": false, "grade_id": "reading_list", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ## Further reading
#
# * Schulman et al. (2017), *Proximal Policy Optimization Algorithms*: the clipped objective (section 3).
# * OpenAI Spinning Up, *Proximal Policy Optimization*: the clip, its gradient, and early stopping on KL.
# * Huang et al. (2022), *The 37 Implementation Details of Proximal Policy Optimization*: what the
#   papers leave out.
# * Ziegler et al. (2019), *Fine-Tuning Language Models from Human Preferences*, and Ouyang et al.
#   (2022), *Training language models to follow instructions with human feedback*: the KL penalty
#   against the supervised model in RLHF.
# * Rafailov et al. (2023), *Direct Preference Optimization*: starts from the maximiser of the
#   penalised objective, π* ∝ π_ref exp(r/β), and fits the policy to preferences without PPO.
