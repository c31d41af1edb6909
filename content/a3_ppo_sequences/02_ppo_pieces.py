# ---
# jupyter:
#   kernelspec:
#     display_name: Python 3 (ipykernel)
#     language: python
#     name: python3
# ---

# %% [markdown] nbgrader={"grade": false, "grade_id": "intro_seq_02", "locked": true, "schema_version": 3, "solution": false, "task": false}
# # a3 · RLHF on sequences, step 2: per-token rewards, GAE and the clipped losses
#
# One PPO iteration on sequences samples a batch of responses, then freezes four things per token:
# the log-probs under the policy that sampled them (`old_logp`), under the frozen reference
# (`ref_logp`), the critic's values, and the reward-model score of each whole response. From these
# it builds per-token rewards, advantages by GAE, whitens them, and minimises a clipped policy loss
# and a clipped value loss for a few epochs. You write those pieces here, all on `[B, T]` arrays
# with a mask (1 on real tokens, EOS included; 0 on padding).

# %% [markdown] nbgrader={"grade": false, "grade_id": "points_seq_02", "locked": true, "schema_version": 3, "solution": false, "task": false}
# **Points.** This notebook: **14 points**. The whole assignment `a3_ppo_sequences` (three notebooks) is worth **45 points**: 39 autograded and 6 graded by hand.
#
# | graded cell | points | how |
# |---|---|---|
# | `test_seq_rewards_score_position` | 2 | autograded |
# | `test_seq_rewards_kl` | 2 | autograded |
# | `test_seq_gae` | 2 | autograded |
# | `test_seq_gae_edges` | 2 | autograded |
# | `test_seq_whiten` | 2 | autograded |
# | `test_seq_policy_loss` | 2 | autograded |
# | `test_seq_value_loss` | 2 | autograded |
#
# Run the notebook top to bottom after restarting the kernel. Visible tests help you; hidden tests on fresh random inputs decide the grade. Validate's "Success! Your notebook passes all the tests." means the visible tests passed, not that you have full marks. Keep the first code cell as it is.

# %% nbgrader={"grade": false, "grade_id": "grading_start_seq", "locked": true, "schema_version": 3, "solution": false, "task": false}
from rlhf_lab import grading
grading.start()

# %% nbgrader={"grade": false, "grade_id": "imports_seq_02", "locked": true, "schema_version": 3, "solution": false, "task": false}
import jax
import jax.numpy as jnp
import matplotlib.pyplot as plt
import numpy as np

# a small batch: "b <eos>", "<eos>" alone, a truncated response, "a c c <eos>" (mask given)
mask = jnp.array([[1, 1, 0, 0, 0, 0],
                  [1, 0, 0, 0, 0, 0],
                  [1, 1, 1, 1, 1, 1],
                  [1, 1, 1, 1, 0, 0]], jnp.float32)
old_logp = jnp.where(mask > 0, -jnp.array([[0.9, 0.4, 0, 0, 0, 0], [1.6, 0, 0, 0, 0, 0],
                                            [1.1, 1.2, 0.8, 1.5, 0.7, 1.0], [0.5, 0.9, 0.6, 0.3, 0, 0]]), 0.0)
ref_logp = jnp.where(mask > 0, old_logp - 0.2 * jnp.arange(6) / 5.0 + 0.1, 0.0)
score = jnp.array([0.5, -1.0, 1.2, 2.0])     # one reward-model score per response

# %% [markdown] nbgrader={"grade": false, "grade_id": "rewards_intro", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ## 1. KL-shaped per-token rewards
#
# Every real token pays the KL penalty against the **reference**, measured with the log-probs of
# the policy that sampled it, and the score of the whole response sits on its **last real token**
# (the EOS, or the 6th token of a truncated response):
#
# $$r_t = -\beta\,(\log\pi_{\text{old}}(y_t) - \log\pi_{\text{ref}}(y_t))\,m_t + s\cdot\mathbb 1\{t = \textstyle\sum_u m_u - 1\}.$$
#
# Write `per_token_rewards(logp, ref_logp, score, mask, beta)` returning `[B, T]`, 0 on padding.
# `logp`, `ref_logp` and `mask` are JAX float32 arrays `[B, T]`, `score` a JAX float32 array `[B]`
# (`B` may be 1), `beta` a Python float.

# %% nbgrader={"grade": false, "grade_id": "per_token_rewards_answer", "locked": false, "schema_version": 3, "solution": true, "task": false}
def per_token_rewards(logp, ref_logp, score, mask, beta):
    """r_t = -beta (logp_t - ref_logp_t) m_t, plus score on the last real token of each response.

    logp, ref_logp, mask: JAX float32 [B, T]; score: JAX float32 [B]; beta: float. Returns [B, T].
    """
    ### BEGIN SOLUTION
    length = jnp.sum(mask, axis=-1).astype(jnp.int32)
    last = jax.nn.one_hot(length - 1, mask.shape[-1]) * (length > 0)[:, None]
    return -beta * (logp - ref_logp) * mask + score[:, None] * last
    ### END SOLUTION


# %% [markdown]
# **Predict** (not graded, but write it down *before* running the next cell):
# on which column does the score of each of the four responses land? Summed over a response,
# what do the rewards equal?
#
# *My prediction:* 

# %% nbgrader={"grade": false, "grade_id": "experiment_rewards", "locked": true, "schema_version": 3, "solution": false, "task": false}
rewards = per_token_rewards(old_logp, ref_logp, score, mask, 0.1)
print(np.round(np.asarray(rewards), 3) + 0.0)          # + 0.0 prints -0.0 as 0.0
print("sum per response:", np.round(np.asarray(rewards.sum(axis=1)), 4) + 0.0)
print("s - beta (log pi(y) - log pi_ref(y)):", np.round(np.asarray(score - 0.1 * (old_logp - ref_logp).sum(axis=1)), 4) + 0.0)

# %% nbgrader={"grade": true, "grade_id": "test_seq_rewards_score_position", "locked": true, "points": 2, "schema_version": 3, "solution": false, "task": false}
# test_seq_rewards_score_position: the score sits on the last real token (EOS-only, truncated and random responses)
### BEGIN HIDDEN TESTS
grading.judge("test_seq_rewards_score_position")
### END HIDDEN TESTS
_r0 = np.asarray(per_token_rewards(old_logp, old_logp, score, mask, 0.1))
assert np.allclose(_r0[[0, 1, 2, 3], [1, 0, 5, 3]], score, atol=1e-6), (
    f"with logp = ref_logp the score must appear at columns 1, 0, 5 and 3; got rows {np.round(_r0, 3)}")

# %% nbgrader={"grade": true, "grade_id": "test_seq_rewards_kl", "locked": true, "points": 2, "schema_version": 3, "solution": false, "task": false}
# test_seq_rewards_kl: the KL part is -beta (logp - ref_logp) on real tokens only, on fresh log-probs, junk on padding and batches of one response
### BEGIN HIDDEN TESTS
grading.judge("test_seq_rewards_kl")
### END HIDDEN TESTS
assert np.allclose(np.asarray(rewards.sum(axis=1)), np.asarray(score - 0.1 * (old_logp - ref_logp).sum(axis=1)),
                   atol=1e-5), "summed over a response the rewards must be s - beta (log pi(y) - log pi_ref(y))"

# %% [markdown] nbgrader={"grade": false, "grade_id": "gae_intro", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ## 2. Generalised advantage estimation
#
# With values $V_t$ from the critic (frozen with the batch) and the episode ending after the last
# real token (no bootstrap: $V$ and $A$ are 0 after it),
#
# $$\delta_t = r_t + \gamma V_{t+1} m_{t+1} - V_t, \qquad A_t = \delta_t + \gamma\lambda\, m_{t+1} A_{t+1},$$
#
# and the critic's target is `returns = A + V`. Write `gae(rewards, values, mask, gamma, lam)`
# returning `(advantages, returns)`, both 0 on padding. `values` may hold junk on padding. The
# arrays are JAX float32 `[B, T]` (`B` may be 1); `gamma` and `lam` are Python floats.
# A Python loop over the 6 positions, from the last to the first, is fine.

# %% nbgrader={"grade": false, "grade_id": "gae_answer", "locked": false, "schema_version": 3, "solution": true, "task": false}
def gae(rewards, values, mask, gamma, lam):
    """(advantages [B, T], returns [B, T]) by GAE over the real tokens of each response."""
    ### BEGIN SOLUTION
    values = values * mask
    T = rewards.shape[-1]
    next_adv = jnp.zeros(rewards.shape[0])
    advs = []
    for t in reversed(range(T)):
        next_mask = mask[:, t + 1] if t + 1 < T else jnp.zeros(rewards.shape[0])
        next_value = values[:, t + 1] if t + 1 < T else jnp.zeros(rewards.shape[0])
        delta = rewards[:, t] + gamma * next_value * next_mask - values[:, t]
        next_adv = (delta + gamma * lam * next_mask * next_adv) * mask[:, t]
        advs.append(next_adv)
    adv = jnp.stack(advs[::-1], axis=1)
    return adv, (adv + values) * mask
    ### END SOLUTION


# %% [markdown]
# **Predict** (not graded, but write it down *before* running the next cell):
# with all values 0, $\gamma = 1$ and $\lambda = 1$, what is the advantage of the first token of each
# response? With $\lambda = 0$?
#
# *My prediction:* 

# %% nbgrader={"grade": false, "grade_id": "experiment_gae", "locked": true, "schema_version": 3, "solution": false, "task": false}
zero_values = jnp.zeros_like(mask)
adv_1, _ = gae(rewards, zero_values, mask, 1.0, 1.0)
adv_0, _ = gae(rewards, zero_values, mask, 1.0, 0.0)
print("A_0 with lambda = 1:", np.round(np.asarray(adv_1[:, 0]), 4))
print("A_0 with lambda = 0:", np.round(np.asarray(adv_0[:, 0]), 4))
lams = np.linspace(0.0, 1.0, 11)
first_adv = [float(gae(rewards, zero_values, mask, 1.0, lam)[0][2, 0]) for lam in lams]
fig, ax = plt.subplots(figsize=(5.5, 3.2))
ax.plot(lams, first_adv, marker="o")
ax.set_xlabel("GAE lambda (dimensionless)")
ax.set_ylabel("A_0 of the truncated response (reward units)")
ax.set_title("How far back the score reaches")
plt.show()

# %% nbgrader={"grade": true, "grade_id": "test_seq_gae", "locked": true, "points": 2, "schema_version": 3, "solution": false, "task": false}
# test_seq_gae: advantages and returns on fresh rewards and values (junk values on padding), fresh gamma and lambda
### BEGIN HIDDEN TESTS
grading.judge("test_seq_gae")
### END HIDDEN TESTS
assert np.allclose(np.asarray(adv_1[:, 0]), np.asarray((rewards * mask).sum(axis=1)), atol=1e-5), (
    "with V = 0, gamma = 1 and lambda = 1, A_0 is the sum of the response's rewards (real tokens)")

# %% nbgrader={"grade": true, "grade_id": "test_seq_gae_edges", "locked": true, "points": 2, "schema_version": 3, "solution": false, "task": false}
# test_seq_gae_edges: lambda = 0, lambda = 1, gamma = 0, a response of length 1, one truncated response and float64 inputs
### BEGIN HIDDEN TESTS
grading.judge("test_seq_gae_edges")
### END HIDDEN TESTS
assert np.allclose(np.asarray(adv_0), np.asarray(rewards * mask), atol=1e-6), (
    "with V = 0 and lambda = 0 the advantage of each real token is its own reward")

# %% [markdown] nbgrader={"grade": false, "grade_id": "whiten_intro", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ## 3. Whitening over real tokens
#
# Advantages are normalised per batch: $\mu = \sum A m / \sum m$, $\sigma^2 = \sum (A-\mu)^2 m / \sum m$,
# $A' = (A - \mu)/\sqrt{\sigma^2 + 10^{-8}}\cdot m$. Padding must neither enter $\mu$ and $\sigma$ nor
# become non-zero afterwards. Write `whiten(advantages, mask)` (JAX float32 arrays `[B, T]`).

# %% nbgrader={"grade": false, "grade_id": "whiten_answer", "locked": false, "schema_version": 3, "solution": true, "task": false}
def whiten(advantages, mask):
    """Advantages with mean 0 and std 1 over the real tokens; 0 on padding (inputs: JAX float32 [B, T])."""
    ### BEGIN SOLUTION
    n = jnp.maximum(jnp.sum(mask), 1.0)
    mu = jnp.sum(advantages * mask) / n
    var = jnp.sum((advantages - mu) ** 2 * mask) / n
    return (advantages - mu) / jnp.sqrt(var + 1e-8) * mask
    ### END SOLUTION


# %% nbgrader={"grade": false, "grade_id": "experiment_whiten", "locked": true, "schema_version": 3, "solution": false, "task": false}
white = whiten(adv_1, mask)
real = np.asarray(mask) > 0
print("mean and std over real tokens:", float(np.asarray(white)[real].mean()), float(np.asarray(white)[real].std()))

# %% nbgrader={"grade": true, "grade_id": "test_seq_whiten", "locked": true, "points": 2, "schema_version": 3, "solution": false, "task": false}
# test_seq_whiten: mean 0 and std 1 over real tokens only, padding 0, on fresh advantages, junk on padding and advantages with no spread
### BEGIN HIDDEN TESTS
grading.judge("test_seq_whiten")
### END HIDDEN TESTS
assert abs(float(np.asarray(white)[real].mean())) < 1e-5 and abs(float(np.asarray(white)[real].std()) - 1) < 1e-3, (
    "over the real tokens the whitened advantages must have mean 0 and standard deviation 1")
assert not np.any(np.asarray(white)[~real]), "padding must stay exactly 0 after whitening"

# %% [markdown] nbgrader={"grade": false, "grade_id": "losses_intro", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ## 4. The clipped policy and value losses
#
# With $\rho_t = \exp(\log\pi_\theta(y_t) - \texttt{old\_logp}_t)$ (old log-probs detached),
#
# $$L^{\pi} = -\frac{\sum_t m_t \min(\rho_t A_t,\ \operatorname{clip}(\rho_t, 1-\epsilon, 1+\epsilon) A_t)}{\sum_t m_t},\qquad
# L^{V} = \frac{1}{2}\frac{\sum_t m_t \max\big((v_t - R_t)^2, (v^{\text{clip}}_t - R_t)^2\big)}{\sum_t m_t},$$
#
# with $v^{\text{clip}} = v^{\text{old}} + \operatorname{clip}(v - v^{\text{old}}, -c, c)$. Write
# `policy_loss(logp, old_logp, advantages, mask, epsilon)` and
# `value_loss(values, old_values, returns, mask, value_clip)`. Both average over real tokens only.
# `policy_loss` is called with JAX float32 arrays `[B, T]` and differentiated (`jax.grad` with respect
# to `logp` and `old_logp`); `value_loss` is called with JAX float32 arrays and also with NumPy
# float64 arrays.

# %% nbgrader={"grade": false, "grade_id": "policy_loss_answer", "locked": false, "schema_version": 3, "solution": true, "task": false}
def policy_loss(logp, old_logp, advantages, mask, epsilon):
    """Clipped policy loss averaged over real tokens (to minimise); inputs JAX float32 [B, T]."""
    ### BEGIN SOLUTION
    ratio = jnp.exp(logp - jax.lax.stop_gradient(old_logp))
    adv = jax.lax.stop_gradient(advantages)
    terms = jnp.minimum(ratio * adv, jnp.clip(ratio, 1.0 - epsilon, 1.0 + epsilon) * adv)
    return -jnp.sum(jnp.where(mask > 0, terms, 0.0)) / jnp.maximum(jnp.sum(mask), 1.0)
    ### END SOLUTION


# %% nbgrader={"grade": false, "grade_id": "value_loss_answer", "locked": false, "schema_version": 3, "solution": true, "task": false}
def value_loss(values, old_values, returns, mask, value_clip):
    """Clipped value loss averaged over real tokens; inputs [B, T], JAX float32 or NumPy float64."""
    ### BEGIN SOLUTION
    v_clip = old_values + jnp.clip(values - old_values, -value_clip, value_clip)
    worst = jnp.maximum((values - returns) ** 2, (v_clip - returns) ** 2)
    return 0.5 * jnp.sum(jnp.where(mask > 0, worst, 0.0)) / jnp.maximum(jnp.sum(mask), 1.0)
    ### END SOLUTION


# %% [markdown]
# **Predict** (not graded, but write it down *before* running the next cell):
# at the start of an epoch the current policy equals the old one. What is the policy loss then,
# given whitened advantages? What is its gradient with respect to `old_logp`?
#
# *My prediction:* 

# %% nbgrader={"grade": false, "grade_id": "experiment_losses", "locked": true, "schema_version": 3, "solution": false, "task": false}
print("policy loss at rho = 1:", float(policy_loss(old_logp, old_logp, white, mask, 0.2)))
grad_logp, grad_old = jax.grad(policy_loss, argnums=(0, 1))(old_logp, old_logp, white, mask, 0.2)
print("largest |d loss / d logp|    :", float(jnp.max(jnp.abs(grad_logp))))
print("largest |d loss / d old_logp|:", float(jnp.max(jnp.abs(grad_old))))

# %% [markdown] nbgrader={"grade": false, "grade_id": "clip_shape_intro", "locked": true, "schema_version": 3, "solution": false, "task": false}
# The loss is 0 at $\rho = 1$, but its gradient with respect to `logp` is not: that gradient is the
# policy-gradient step. With respect to `old_logp` it is 0, because the old log-probs are constants of
# the batch (`stop_gradient`). The next figure is the clipped objective of **one token**,
# $\min(\rho A, \operatorname{clip}(\rho, 1-\epsilon, 1+\epsilon) A)$ (your loss with its sign
# flipped, on a batch of one token), for $A = +1$ and for $A = -1$. For $A > 0$ it follows $\rho A$
# up to $1 + \epsilon$ and is flat above it: making a good token still more likely gains nothing
# there, and the gradient is 0. For $A < 0$ it is flat below $1 - \epsilon$. On the other side of
# the band it keeps following $\rho A$: the minimum never hides a change that makes the objective worse.

# %% nbgrader={"grade": false, "grade_id": "clip_shape", "locked": true, "schema_version": 3, "solution": false, "task": false}
ratios = np.linspace(0.5, 1.5, 21)                 # steps of 0.05: the kinks at 0.8 and 1.2 are points
one = jnp.ones((1, 1))
fig, axes = plt.subplots(1, 2, figsize=(8.5, 3.2), sharey=True)
axes[0].set_ylabel("objective of one token (advantage units)")
for ax, adv in zip(axes, (1.0, -1.0)):
    objective = [-float(policy_loss(np.log(r) * one, 0.0 * one, adv * one, one, 0.2)) for r in ratios]
    ax.axvspan(0.8, 1.2, color="grey", alpha=0.15, label="band [1 - eps, 1 + eps]")
    ax.plot(ratios, adv * ratios, ":", color="grey", label="rho A, unclipped")
    ax.plot(ratios, objective, label="clipped objective")
    ax.set_xlabel("ratio rho = pi / pi_old of the token (dimensionless)")
    ax.set_title(f"A = {adv:+.0f}")
    ax.legend(fontsize="small")
plt.show()

# %% nbgrader={"grade": true, "grade_id": "test_seq_policy_loss", "locked": true, "points": 2, "schema_version": 3, "solution": false, "task": false}
# test_seq_policy_loss: value and gradients of the clipped policy loss over real tokens on fresh inputs, junk on padding, zero advantages and one token
### BEGIN HIDDEN TESTS
grading.judge("test_seq_policy_loss")
### END HIDDEN TESTS
_centred = jnp.where(mask > 0, jnp.arange(24.0).reshape(4, 6), 0.0)
_centred = (_centred - jnp.sum(_centred) / jnp.sum(mask)) * mask          # mean 0 over real tokens
assert abs(float(policy_loss(old_logp, old_logp, _centred, mask, 0.2))) < 1e-4, (
    "at rho = 1 with advantages of mean 0 over the real tokens the policy loss is 0")

# %% nbgrader={"grade": true, "grade_id": "test_seq_value_loss", "locked": true, "points": 2, "schema_version": 3, "solution": false, "task": false}
# test_seq_value_loss: the clipped value loss over real tokens on fresh values and returns, float64 inputs and one token
### BEGIN HIDDEN TESTS
grading.judge("test_seq_value_loss")
### END HIDDEN TESTS
assert abs(float(value_loss(jnp.ones_like(mask), jnp.ones_like(mask), jnp.zeros_like(mask), mask, 0.2)) - 0.5) < 1e-6, (
    "values 1 against returns 0 give 0.5 * 1^2 = 0.5 per real token")
