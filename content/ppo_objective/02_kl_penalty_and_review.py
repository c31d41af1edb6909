# ---
# jupyter:
#   kernelspec:
#     display_name: Python 3 (ipykernel)
#     language: python
#     name: python3
# ---

# %% [markdown] nbgrader={"grade": false, "grade_id": "title", "locked": true, "schema_version": 3, "solution": false, "task": false}
# # PPO's objective, part 2: the KL penalty against a reference policy
#
# Notebook 1's clip only limits how much one batch can push the policy. Nothing in it stops a
# long run of modest steps from adding up, batch after batch, to a policy that no longer looks
# like the model training started from. RLHF therefore also charges the reward for distance:
# it subtracts β times the KL divergence from the **reference policy**, a copy of the
# starting model (in practice, the supervised fine-tuned one) that is frozen for the whole run.
#
# As before, write a guess in each **Predict** cell before running the experiment under it.

# %% [markdown] nbgrader={"grade": false, "grade_id": "points_part2", "locked": true, "schema_version": 3, "solution": false, "task": false}
# **Points.** This notebook: **22 points**. The whole assignment `ppo_objective` (two notebooks) is worth **40 points**: 25 autograded and 15 graded by hand.
#
# | graded cell | points | how |
# |---|---|---|
# | `test_kl_divergence` | 5 | autograded |
# | `test_penalized_reward` | 2 | autograded |
# | `test_beta_sweep` | 3 | autograded |
# | `ex2_discussion` | 3 | graded by hand |
# | `challenge_answer` | 4 | graded by hand |
# | `cyu_q1` | 1 | graded by hand |
# | `cyu_q2` | 1 | graded by hand |
# | `cyu_q3` | 1 | graded by hand |
# | `cyu_q4` | 1 | graded by hand |
# | `cyu_q5` | 1 | graded by hand |
#
# Run the notebook top to bottom after restarting the kernel. Visible tests help you; hidden tests on fresh random inputs decide the grade. Keep the first code cell as it is, and do not delete, move or edit the locked cells (the grader restores them); your own extra cells are fine anywhere, and a harmless line above the first cell (a `%matplotlib` magic, say) is only listed for the instructor, it costs nothing.

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
# the exchange rate between reward and drift.

# %% [markdown] nbgrader={"grade": false, "grade_id": "task4_intro", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ### Task 4: `kl_divergence` (5 points)
#
# Implement `kl_divergence(logits_p, logits_q)` = KL(p ‖ q) exactly for two categorical
# distributions given by 1-D logits: `logits_p` is the current policy, `logits_q` the
# reference. Return a scalar in nats.
#
# Work in **log space**: get log-probabilities with `jax.nn.log_softmax`, not
# `jnp.log(jax.nn.softmax(...))`. The latter turns a tiny probability into `log(0) = -inf` and
# the KL into `inf` or `nan`; the hidden tests include such a case. Implement it yourself
# (the library's `categorical_kl` is off limits for this task).

# %% nbgrader={"grade": false, "grade_id": "kl_divergence", "locked": false, "schema_version": 3, "solution": true, "task": false}
def kl_divergence(logits_p, logits_q):
    """Exact KL(p || q) = sum_a p(a) (log p(a) - log q(a)) in nats.

    Args:
      logits_p: [n] logits of the current policy (the distribution doing the weighting).
      logits_q: [n] logits of the frozen reference.

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
np.testing.assert_allclose(kl_divergence(LOGITS_POLICY, LOGITS_REF_CLOSE), 0.0072039, atol=1e-6)
np.testing.assert_allclose(kl_divergence(LOGITS_POLICY, LOGITS_REF_FAR), 1.9827589, atol=1e-6)
assert float(kl_divergence(LOGITS_POLICY, LOGITS_POLICY)) == 0.0
print("kl_divergence: visible checks passed")


# %% [markdown] nbgrader={"grade": false, "grade_id": "task5_intro", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ### Task 5: `penalized_reward` (2 points)
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
np.testing.assert_allclose(penalized_reward(1.0, 0.1, 0.0072039), 0.99928, atol=1e-5)
np.testing.assert_allclose(penalized_reward(1.0, 0.1, 1.9827589), 0.80172, atol=1e-5)
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
# almost nothing, the far one removes about a fifth of the reward. In a full RLHF run this
# term is charged at every step, so sustained drift turns into a steady pull back towards
# the reference.

# %% [markdown] nbgrader={"grade": false, "grade_id": "ex2_intro", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ## Exercise 2: how sensitive is the penalty to β? (6 points)
#
# Implement `beta_sweep(reward, kl, betas, penalize=penalized_reward)` returning a tuple
# `(penalised, share)` of two arrays, one entry per β:
#
# * `penalised[i] = penalize(reward, betas[i], kl)`;
# * `share[i] = betas[i] * kl / reward`, the **fraction** of the raw reward the penalty
#   consumes (0.198 means 19.8 %; `reward` is positive here).
#
# As in notebook 1, call the `penalize` argument: the tests pass a trusted one in
# (3 points). Then discuss the result
# (3 points).

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
np.testing.assert_allclose(_pen, [0.980172, 0.801724, 0.008621, -0.982759], atol=1e-5)
np.testing.assert_allclose(_share, [0.019828, 0.198276, 0.991379, 1.982759], atol=1e-5)
print("beta_sweep: visible checks passed")

# %% [markdown] nbgrader={"grade": false, "grade_id": "ex2_question", "locked": true, "schema_version": 3, "solution": false, "task": false}
# **Discuss (3 points).** Quote the shares you printed. In a real
# RLHF run, what does a team gain by choosing a larger β, and what does it give up?

# %% [markdown] nbgrader={"grade": true, "grade_id": "ex2_discussion", "locked": false, "points": 3, "schema_version": 3, "solution": true, "task": false}
# ### BEGIN SOLUTION
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

# %% [markdown] nbgrader={"grade": false, "grade_id": "challenge_intro", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ## Independent challenge (4 points, graded by hand)
#
# Someone on your team argues that because the clip caps every update, a PPO-trained policy
# can never move far, not even when the data say it should, and so RLHF with PPO cannot
# work in practice.
#
# Judge that argument with what you measured in notebook 1 (quote your own numbers): is it
# right, partly right or wrong, and why?

# %% [markdown] nbgrader={"grade": true, "grade_id": "challenge_answer", "locked": false, "points": 4, "schema_version": 3, "solution": true, "task": false}
# ### BEGIN SOLUTION
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
# ## Check your understanding (5 points, 1 each, graded by hand)
#
# Answer each question in two or three sentences in the cell below it.

# %% [markdown] nbgrader={"grade": false, "grade_id": "cyu_q1_text", "locked": true, "schema_version": 3, "solution": false, "task": false}
# **Q1.** This assignment verifies two formulas of PPO and leaves the rest of a PPO iteration out. What does it leave out, and which two pieces does it verify?

# %% [markdown] nbgrader={"grade": true, "grade_id": "cyu_q1", "locked": false, "points": 1, "schema_version": 3, "solution": true, "task": false}
# ### BEGIN SOLUTION
# **Rubric (1 point).** Full credit: names what a full PPO iteration needs and is not run here (rollouts from a live
# policy, a reward model scoring them, a value function / critic for the advantage, many
# iterations of weight updates on a real model: too expensive for a CPU toy) and the two
# verified pieces: the clipped surrogate objective and the KL penalty against a frozen
# reference policy, the two formulas that keep PPO's updates safe.
# ### END SOLUTION

# %% [markdown] nbgrader={"grade": false, "grade_id": "cyu_q2_text", "locked": true, "schema_version": 3, "solution": false, "task": false}
# **Q2.** Write the clipped surrogate objective. What does ε control, and what range of ratios does ε = 0.2 give?

# %% [markdown] nbgrader={"grade": true, "grade_id": "cyu_q2", "locked": false, "points": 1, "schema_version": 3, "solution": true, "task": false}
# ### BEGIN SOLUTION
# **Rubric (1 point).** Full credit: objective = min(ratio * A, clip(ratio, 1 - eps, 1 + eps) * A); epsilon is the
# half-width of the clip band around ratio = 1 (no change); with epsilon = 0.2 the ratio
# is clipped to [0.8, 1.2] inside the clipped term before multiplying by the advantage (a band
# where the incentive stops, not a trust region: nothing forbids a ratio outside it).
# ### END SOLUTION

# %% [markdown] nbgrader={"grade": false, "grade_id": "cyu_q3_text", "locked": true, "schema_version": 3, "solution": false, "task": false}
# **Q3.** For ratio 1.8 and advantage +1, what are the unclipped and clipped objectives, and why do they differ?

# %% [markdown] nbgrader={"grade": true, "grade_id": "cyu_q3", "locked": false, "points": 1, "schema_version": 3, "solution": true, "task": false}
# ### BEGIN SOLUTION
# **Rubric (1 point).** Full credit: unclipped 1.8, clipped 1.2. The ratio exceeds 1 + epsilon = 1.2, so the clipped
# term caps it at 1.2 before multiplying by the positive advantage and the min picks 1.2: one
# step gets no extra reward for pushing a good action's probability further.
# ### END SOLUTION

# %% [markdown] nbgrader={"grade": false, "grade_id": "cyu_q4_text", "locked": true, "schema_version": 3, "solution": false, "task": false}
# **Q4.** For ratio 1.8 and advantage −1, work out both terms and the minimum. What does the result say about the clip's asymmetry?

# %% [markdown] nbgrader={"grade": true, "grade_id": "cyu_q4", "locked": false, "points": 1, "schema_version": 3, "solution": true, "task": false}
# ### BEGIN SOLUTION
# **Rubric (1 point).** Full credit: clip(1.8, 0.8, 1.2) = 1.2, clipped term 1.2 * -1 = -1.2; unclipped 1.8 * -1 =
# -1.8; min(-1.8, -1.2) = -1.8, the unclipped value, so the clip has no effect. The clip never
# softens the incentive to correct an update that raised a bad action's probability; it only
# caps over-pushing in a direction that already improved things.
# ### END SOLUTION

# %% [markdown] nbgrader={"grade": false, "grade_id": "cyu_q5_text", "locked": true, "schema_version": 3, "solution": false, "task": false}
# **Q5.** Compare the penalised rewards for the close and the far reference at β = 0.1. What does the comparison show?

# %% [markdown] nbgrader={"grade": true, "grade_id": "cyu_q5", "locked": false, "points": 1, "schema_version": 3, "solution": true, "task": false}
# ### BEGIN SOLUTION
# **Rubric (1 point).** Full credit: close reference KL about 0.0072 nats gives 0.99928, nearly the raw 1.0; far
# reference KL about 1.98 nats gives 0.80172, about a fifth of the reward lost. The same raw
# reward is penalised in proportion to how far the policy has drifted from the frozen
# reference (linear in KL at fixed beta).
# ### END SOLUTION
