# ---
# jupyter:
#   kernelspec:
#     display_name: Python 3 (ipykernel)
#     language: python
#     name: python3
# ---

# %% [markdown] nbgrader={"grade": false, "grade_id": "intro_seq_03", "locked": true, "schema_version": 3, "solution": false, "task": false}
# # a3 · RLHF on sequences, step 3: the loop, KL estimators, over-optimisation and the alternatives
#
# This notebook uses the course library's trusted versions of everything you wrote in the first
# two notebooks (`rlhf_lab.sequences`), so it does not depend on your earlier answers. The task:
# a reference policy fitted by SFT to demonstrations, a proxy reward model fitted to preference
# pairs and normalised to mean 0, std 1 under the reference, and a hidden gold reward that the
# proxy only partly sees. Every expected reward and KL below is an exact sum over all responses.

# %% [markdown] nbgrader={"grade": false, "grade_id": "points_seq_03", "locked": true, "schema_version": 3, "solution": false, "task": false}
# **Points.** This notebook: **19 points**. The whole assignment `a3_ppo_sequences` (three notebooks) is worth **41 points**: 35 autograded and 6 graded by hand.
#
# | graded cell | points | how |
# |---|---|---|
# | `test_seq_batch_rewards` | 2 | autograded |
# | `test_seq_ppo_epochs` | 3 | autograded |
# | `test_seq_kl_estimators` | 2 | autograded |
# | `test_seq_overopt_fit` | 2 | autograded |
# | `test_seq_group_advantages` | 2 | autograded |
# | `test_seq_dpo_loss` | 2 | autograded |
# | `seq_analysis_a1` | 3 | graded by hand |
# | `seq_analysis_a2` | 3 | graded by hand |
#
# Run the notebook top to bottom after restarting the kernel. Visible tests help you; hidden tests on fresh random inputs decide the grade. Keep the first code cell as it is.

# %% nbgrader={"grade": false, "grade_id": "grading_start_seq", "locked": true, "schema_version": 3, "solution": false, "task": false}
from rlhf_lab import grading
grading.start()

# %% nbgrader={"grade": false, "grade_id": "imports_seq_03", "locked": true, "schema_version": 3, "solution": false, "task": false}
import jax
import jax.numpy as jnp
import matplotlib.pyplot as plt
import numpy as np
import rlhf_lab.sequences as sq

# the library's trusted pieces used below
(SeqPPOConfig, best_of_n_summary, context_features, decode, per_token_rewards, placement_gradients, policy_loss,
 response_mask, sample_responses, token_logp, train) = (
    sq.SeqPPOConfig, sq.best_of_n_summary, sq.context_features, sq.decode, sq.per_token_rewards,
    sq.placement_gradients, sq.policy_loss, sq.response_mask, sq.sample_responses, sq.token_logp, sq.train)
optimum_summary = sq.task.optimum_summary

LANG = sq.DEFAULT_LANGUAGE
EOS, PAD = LANG.eos, LANG.pad
task = sq.default_task()                   # reference, proxy and gold reward (seed 0)
ref_params = task.arrays.ref_params        # the frozen SFT reference: a dict of arrays
print("policy parameters:", {k: v.shape for k, v in ref_params.items()})

# %% [markdown] nbgrader={"grade": false, "grade_id": "batch_intro", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ## 1. The rewards of a sampled batch
#
# Write `batch_rewards(policy_params, ref_params, prompts, tokens, score, beta)`: the per-token
# rewards of a batch sampled by `policy_params`. Build the mask with `response_mask(tokens, EOS, PAD)`,
# the features with `context_features(LANG, prompts, tokens)`, the per-token log-probs of each
# network with `token_logp(params, features, tokens)` (multiply by the mask), then call
# `per_token_rewards`. The sampling policy gives `logp`; the frozen reference gives `ref_logp`.

# %% nbgrader={"grade": false, "grade_id": "batch_rewards_answer", "locked": false, "schema_version": 3, "solution": true, "task": false}
def batch_rewards(policy_params, ref_params, prompts, tokens, score, beta):
    """Per-token KL-shaped rewards [B, T] of responses sampled by policy_params."""
    ### BEGIN SOLUTION
    mask = response_mask(tokens, EOS, PAD)
    feats = context_features(LANG, prompts, tokens)
    logp = token_logp(policy_params, feats, tokens) * mask
    ref_logp = token_logp(ref_params, feats, tokens) * mask
    return per_token_rewards(logp, ref_logp, score, mask, beta)
    ### END SOLUTION


# %% [markdown]
# **Predict** (not graded, but write it down *before* running the next cell):
# the first iteration of PPO samples from a policy that IS the reference. How large is the KL
# part of each token's reward then?
#
# *My prediction:* 

# %% nbgrader={"grade": false, "grade_id": "experiment_batch", "locked": true, "schema_version": 3, "solution": false, "task": false}
prompts = jnp.arange(8, dtype=jnp.int32) % LANG.n_prompts
tokens, batch_mask = sample_responses(jax.random.key(1), ref_params, LANG, prompts)
fake_score = jnp.linspace(-1.0, 1.0, 8)
first_rewards = np.asarray(batch_rewards(ref_params, ref_params, prompts, tokens, fake_score, 0.05))
for row, r in zip(tokens[:4], first_rewards[:4]):
    print(f"{decode(LANG, row):28s}", np.round(r, 3))

# %% nbgrader={"grade": true, "grade_id": "test_seq_batch_rewards", "locked": true, "points": 2, "schema_version": 3, "solution": false, "task": false}
# test_seq_batch_rewards: rewards of a fresh batch from two fresh networks: KL against the reference network, EOS kept, tokens after EOS ignored
### BEGIN HIDDEN TESTS
grading.judge("test_seq_batch_rewards")
### END HIDDEN TESTS
assert np.allclose(first_rewards.sum(axis=1), np.asarray(fake_score), atol=1e-5), (
    "when the sampling policy is the reference the KL part is 0: each response's rewards sum to its score")

# %% [markdown] nbgrader={"grade": false, "grade_id": "epochs_intro", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ## 2. Several epochs on one frozen batch
#
# Write `ppo_epochs(params, prompts, tokens, old_logp, advantages, epsilon, learning_rate, epochs)`:
# `epochs` plain gradient-descent steps (`p <- p - learning_rate * grad`) on the whole batch, each on
# `policy_loss(token_logp(params, features, tokens), old_logp, advantages, mask, epsilon)`. The
# `old_logp` you are given were computed once, when the batch was sampled; keep them frozen.
# Return the new parameter dict (same keys). `jax.tree_util.tree_map` updates a dict in one line.

# %% nbgrader={"grade": false, "grade_id": "ppo_epochs_answer", "locked": false, "schema_version": 3, "solution": true, "task": false}
def ppo_epochs(params, prompts, tokens, old_logp, advantages, epsilon, learning_rate, epochs):
    """epochs gradient steps of the clipped policy loss on one batch; returns the new params dict."""
    ### BEGIN SOLUTION
    mask = response_mask(tokens, EOS, PAD)
    feats = context_features(LANG, prompts, tokens)

    def loss(p):
        return policy_loss(token_logp(p, feats, tokens), old_logp, advantages, mask, epsilon)

    for _ in range(epochs):
        grads = jax.grad(loss)(params)
        params = jax.tree_util.tree_map(lambda p, g: p - learning_rate * g, params, grads)
    return params
    ### END SOLUTION


# %% [markdown]
# **Predict** (not graded, but write it down *before* running the next cell):
# after the first epoch, will any ratio leave the band $[1-\epsilon, 1+\epsilon]$? What would the
# fraction be after every epoch if the old log-probs were recomputed at the start of each epoch?
#
# *My prediction:* 

# %% nbgrader={"grade": false, "grade_id": "experiment_epochs", "locked": true, "schema_version": 3, "solution": false, "task": false}
feats = context_features(LANG, prompts, tokens)
frozen_old = token_logp(ref_params, feats, tokens) * batch_mask
toy_adv = jnp.where(batch_mask > 0, jnp.sin(jnp.arange(6.0))[None, :] * jnp.linspace(-1, 1, 8)[:, None], 0.0)
clip_fraction = []
for n in range(1, 6):
    moved = ppo_epochs(ref_params, prompts, tokens, frozen_old, toy_adv, 0.2, 2.0, n)
    ratio = np.exp(np.asarray(token_logp(moved, feats, tokens) * batch_mask - frozen_old))
    clip_fraction.append(float(np.sum((np.abs(ratio - 1) > 0.2) * np.asarray(batch_mask)) / np.sum(batch_mask)))
print("fraction of real tokens outside the band after 1..5 epochs:", np.round(clip_fraction, 3))

# %% nbgrader={"grade": true, "grade_id": "test_seq_ppo_epochs", "locked": true, "points": 3, "schema_version": 3, "solution": false, "task": false}
# test_seq_ppo_epochs: epochs of gradient steps on a fresh batch with the old log-probs frozen at collection, tokens after EOS ignored, zero advantages
### BEGIN HIDDEN TESTS
grading.judge("test_seq_ppo_epochs")
### END HIDDEN TESTS
assert sorted(moved) == sorted(ref_params), "ppo_epochs must return a dict with the same keys as params"

# %% [markdown] nbgrader={"grade": false, "grade_id": "loop_intro", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ## 3. The whole loop, compiled
#
# The library's `train` runs the full algorithm you built: sampling, `old_logp` and `ref_logp`
# frozen per batch, your per-token rewards, GAE, whitening over real tokens, epochs of minibatches
# of the clipped policy and value losses (Adam), all in one compiled `lax.scan`. Every 10
# iterations it records the exact expected gold and proxy rewards and the exact sequence KL.

# %% [markdown]
# **Predict** (not graded, but write it down *before* running the next cell):
# with a small beta (0.05) and 60 iterations, will the gold reward rise all the way, rise and
# fall, or fall from the start? And the proxy?
#
# *My prediction:* 

# %% nbgrader={"grade": false, "grade_id": "experiment_loop", "locked": true, "schema_version": 3, "solution": false, "task": false}
config = SeqPPOConfig(iterations=60, batch_size=64, minibatch_size=16, eval_every=10, beta=0.05)
run = train(task, config)
fig, ax = plt.subplots(figsize=(6, 3.5))
ax.plot(run.eval_iteration, run.proxy, marker="o", label="proxy (training reward)")
ax.plot(run.eval_iteration, run.gold, marker="o", label="gold (hidden)")
ax.plot(run.eval_iteration, np.sqrt(run.kl), marker="o", label="sqrt KL(pi || pi_ref)")
ax.set_xlabel("PPO iteration (batches of 64 responses)")
ax.set_ylabel("exact expected reward (reward units) / sqrt(nats)")
ax.set_title("One PPO run, beta = 0.05")
ax.legend(fontsize="small")
plt.show()

# %% [markdown] nbgrader={"grade": false, "grade_id": "kl_intro_seq", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ## 4. KL estimators
#
# With one sampled token, $k_1 = \log\pi - \log\pi_{\text{ref}}$, $k_2 = \tfrac12(\log\pi - \log\pi_{\text{ref}})^2$ and,
# with $r = \log\pi_{\text{ref}} - \log\pi$, $k_3 = (e^{r} - 1) - r$. Write
# `kl_estimators(logp, ref_logp)` returning a dict `{"k1", "k2", "k3"}` of arrays shaped like `logp`
# (elementwise).

# %% nbgrader={"grade": false, "grade_id": "kl_estimators_answer", "locked": false, "schema_version": 3, "solution": true, "task": false}
def kl_estimators(logp, ref_logp):
    """{"k1": ..., "k2": ..., "k3": ...} for the sampled tokens' log-probs (elementwise)."""
    ### BEGIN SOLUTION
    log_ratio = logp - ref_logp
    r = -log_ratio
    return {"k1": log_ratio, "k2": 0.5 * log_ratio**2, "k3": jnp.expm1(r) - r}
    ### END SOLUTION


# %% [markdown]
# **Predict** (not graded, but write it down *before* running the next cell):
# averaged under $\pi$ over all actions of one token, which estimators equal the exact KL? Which
# one can be negative on a single sample? Whose gradient, placed in the loss, follows
# $\nabla \mathrm{KL}(\pi\Vert\pi_{\text{ref}})$?
#
# *My prediction:* 

# %% nbgrader={"grade": false, "grade_id": "experiment_kl", "locked": true, "schema_version": 3, "solution": false, "task": false}
tok_logits = jnp.array([0.8, -0.2, 0.3, -1.0, 0.1, 0.4])
tok_ref = jax.nn.log_softmax(jnp.array([0.0, 0.5, -0.3, 0.2, 0.0, -0.6]))
tok_logp = jax.nn.log_softmax(tok_logits)
ks = kl_estimators(tok_logp, tok_ref)
p = np.exp(np.asarray(tok_logp))
exact_kl = float(np.sum(p * (np.asarray(tok_logp) - np.asarray(tok_ref))))
print("exact KL:", round(exact_kl, 5), {k: round(float(np.sum(p * np.asarray(v))), 5) for k, v in ks.items()})
print("smallest single-sample value:", {k: round(float(np.min(v)), 4) for k, v in ks.items()})
grads = placement_gradients(tok_logits, tok_ref)   # exact expected gradient of each placement
print(f"{'placement':14s} max |g - grad KL(pi||ref)|   max |g - grad KL(ref||pi)|")
for name in ("k1_in_reward", "k1_in_loss", "k2_in_loss", "k3_in_loss"):
    g = np.asarray(grads[name])
    print(f"{name:14s} {np.abs(g - np.asarray(grads['kl'])).max():24.2e} {np.abs(g - np.asarray(grads['reverse_kl'])).max():26.2e}")

# %% nbgrader={"grade": true, "grade_id": "test_seq_kl_estimators", "locked": true, "points": 2, "schema_version": 3, "solution": false, "task": false}
# test_seq_kl_estimators: k1, k2, k3 on fresh log-probs (also equal, far apart and [3, 4]-shaped), and E_pi[k1] = E_pi[k3] = the exact KL on a fresh token
### BEGIN HIDDEN TESTS
grading.judge("test_seq_kl_estimators")
### END HIDDEN TESTS
assert abs(float(np.sum(p * np.asarray(ks["k3"]))) - exact_kl) < 1e-5, "E_pi[k3] must equal the exact KL"
assert float(np.min(ks["k3"])) >= 0.0, "k3 = (e^r - 1) - r is never negative"

# %% [markdown] nbgrader={"grade": false, "grade_id": "overopt_intro", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ## 5. Over-optimisation, on exact numbers
#
# For each beta the best possible policy is $\pi^*_\beta \propto \pi_{\text{ref}}\,e^{s/\beta}$ (over all
# responses). `optimum_summary(task, beta)` gives its exact gold and proxy reward and KL. Following
# Gao et al. (2022), with $d = \sqrt{\mathrm{KL}}$ the gold gain over the reference is well described by
# $\text{gain}(d) = \alpha d - b d^2$. Write `fit_overoptimisation(kl, gain)` returning the
# least-squares `np.array([alpha, b])` (no intercept; `np.linalg.lstsq` helps).

# %% nbgrader={"grade": false, "grade_id": "fit_overopt_answer", "locked": false, "schema_version": 3, "solution": true, "task": false}
def fit_overoptimisation(kl, gain):
    """Least-squares (alpha, b) of gain = alpha * d - b * d**2 with d = sqrt(kl); returns np.array([alpha, b])."""
    ### BEGIN SOLUTION
    d = np.sqrt(np.asarray(kl, np.float64))
    design = np.stack([d, -d**2], axis=1)
    return np.linalg.lstsq(design, np.asarray(gain, np.float64), rcond=None)[0]
    ### END SOLUTION


# %% [markdown]
# **Predict** (not graded, but write it down *before* running the next cell):
# as beta falls from 3 to 0.02, the optimum moves further from the reference. Sketch the proxy and
# the gold reward against $\sqrt{\mathrm{KL}}$. Where does the gold reward peak?
#
# *My prediction:* 

# %% nbgrader={"grade": false, "grade_id": "experiment_overopt", "locked": true, "schema_version": 3, "solution": false, "task": false}
betas = np.geomspace(3.0, 0.02, 14)
optima = [optimum_summary(task, float(b)) for b in betas]
reference = optimum_summary(task, 1e6)        # beta -> infinity: the reference itself
opt_kl = np.array([o["kl"] for o in optima])
opt_gold = np.array([o["gold"] for o in optima])
opt_proxy = np.array([o["proxy"] for o in optima])
alpha, b = fit_overoptimisation(opt_kl, opt_gold - reference["gold"])
d_grid = np.linspace(0.0, np.sqrt(opt_kl.max()), 100)
fig, ax = plt.subplots(figsize=(6.5, 3.8))
ax.plot(np.sqrt(opt_kl), opt_proxy, "o-", label="proxy of pi*_beta")
ax.plot(np.sqrt(opt_kl), opt_gold, "o-", label="gold of pi*_beta")
ax.plot(d_grid, reference["gold"] + alpha * d_grid - b * d_grid**2, "k--",
        label=f"fit: gold_ref + {alpha:.2f} d - {b:.2f} d^2")
ax.plot(np.sqrt(np.asarray(run.kl)), run.gold, "s:", label="gold of the PPO run above")
ax.set_xlabel("d = sqrt(KL(pi || pi_ref)) (sqrt nats)")
ax.set_ylabel("exact expected reward (reward units)")
ax.set_title("Optimising the proxy harder eventually lowers the gold reward")
ax.legend(fontsize="small")
plt.show()
print(f"gold peaks at d = {np.sqrt(opt_kl)[np.argmax(opt_gold)]:.2f}; the fit puts the peak at d = {alpha / (2 * b):.2f}")

# %% nbgrader={"grade": true, "grade_id": "test_seq_overopt_fit", "locked": true, "points": 2, "schema_version": 3, "solution": false, "task": false}
# test_seq_overopt_fit: least-squares (alpha, b) of gain = alpha d - b d^2 in d = sqrt(KL) on fresh noisy curves and an exact one
### BEGIN HIDDEN TESTS
grading.judge("test_seq_overopt_fit")
### END HIDDEN TESTS
assert np.shape(fit_overoptimisation(opt_kl, opt_gold - reference["gold"])) == (2,), "return np.array([alpha, b])"
assert b > 0, f"on this task the gold gain bends down (b > 0), got b = {b}"

# %% [markdown] nbgrader={"grade": false, "grade_id": "contrast_intro", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ## 6. Best-of-n, GRPO and DPO against the optimum
#
# *Best-of-n* draws n responses from the reference and keeps the highest-scoring one; its exact
# distribution and KL are known (`best_of_n_summary`), and its KL is at most $\log n - (n-1)/n$.
# *GRPO* drops the critic: it samples a group of responses per prompt and uses the group-normalised
# score as the advantage of every token, $A_{ij} = (s_{ij} - \bar s_i)/(\operatorname{std}_i s + 10^{-6})$
# (population std). A group whose scores are all equal carries no signal: its advantages are 0
# (the library's `group_advantages` also treats a group whose std is at most $10^{-4}$ of its largest
# $|s|$ as constant, so float32 rounding of the mean cannot turn into a large advantage; the hidden
# test accepts the formula with or without that rule). *DPO* skips the reward model: on the preference pairs it minimises
# $\operatorname{mean}\operatorname{softplus}\big(-\beta[(\log\pi(y^c) - \log\pi_{\text{ref}}(y^c)) - (\log\pi(y^r) - \log\pi_{\text{ref}}(y^r))]\big)$
# over sequence log-probs. Write `group_advantages(scores)` (`[n_groups, group_size]`) and
# `dpo_loss(logp_chosen, logp_rejected, ref_logp_chosen, ref_logp_rejected, beta)`.

# %% nbgrader={"grade": false, "grade_id": "group_advantages_answer", "locked": false, "schema_version": 3, "solution": true, "task": false}
def group_advantages(scores):
    """GRPO advantages: scores normalised within each row (group); same shape as scores."""
    ### BEGIN SOLUTION
    scores = jnp.asarray(scores)
    mu = jnp.mean(scores, axis=-1, keepdims=True)
    return (scores - mu) / (jnp.std(scores, axis=-1, keepdims=True) + 1e-6)
    ### END SOLUTION


# %% nbgrader={"grade": false, "grade_id": "dpo_loss_answer", "locked": false, "schema_version": 3, "solution": true, "task": false}
def dpo_loss(logp_chosen, logp_rejected, ref_logp_chosen, ref_logp_rejected, beta):
    """DPO loss on [n] sequence log-probs (a scalar)."""
    ### BEGIN SOLUTION
    margin = (logp_chosen - ref_logp_chosen) - (logp_rejected - ref_logp_rejected)
    return jnp.mean(jax.nn.softplus(-beta * margin))
    ### END SOLUTION


# %% [markdown]
# **Predict** (not graded, but write it down *before* running the next cell):
# at equal KL, which is better on the proxy: best-of-n or the optimum $\pi^*_\beta$? How close is the
# exact best-of-n KL to $\log n - (n-1)/n$?
#
# *My prediction:* 

# %% nbgrader={"grade": false, "grade_id": "experiment_contrasts", "locked": true, "schema_version": 3, "solution": false, "task": false}
print("group advantages of one group:", np.round(np.asarray(group_advantages(jnp.array([[1.0, 2.0, 4.0, 1.0]]))), 3))
print("DPO loss at the reference (log 2):", float(dpo_loss(jnp.zeros(3), jnp.zeros(3), jnp.zeros(3), jnp.zeros(3), 0.1)))
ns = [1, 2, 4, 8, 16, 32, 64]
bon = [best_of_n_summary(task, n) for n in ns]
fig, ax = plt.subplots(figsize=(6.5, 3.8))
ax.plot(np.sqrt(opt_kl), opt_proxy, "o-", label="proxy, pi*_beta")
ax.plot(np.sqrt([r["kl"] for r in bon]), [r["proxy"] for r in bon], "^-", label="proxy, best-of-n")
ax.plot(np.sqrt(opt_kl), opt_gold, "o--", label="gold, pi*_beta")
ax.plot(np.sqrt([r["kl"] for r in bon]), [r["gold"] for r in bon], "^--", label="gold, best-of-n")
ax.set_xlabel("d = sqrt(KL(pi || pi_ref)) (sqrt nats)")
ax.set_ylabel("exact expected reward (reward units)")
ax.set_title("Best-of-n (n = 1 ... 64) against the KL-regularised optimum")
ax.legend(fontsize="small")
plt.show()
for r in bon:
    print(f"n = {r['n']:2d}: exact KL {r['kl']:.3f} nats, formula log n - (n-1)/n = {r['kl_formula']:.3f}")

# %% nbgrader={"grade": true, "grade_id": "test_seq_group_advantages", "locked": true, "points": 2, "schema_version": 3, "solution": false, "task": false}
# test_seq_group_advantages: GRPO advantages normalised within each group on fresh scores (a constant group gives 0; near-constant groups, groups of one)
### BEGIN HIDDEN TESTS
grading.judge("test_seq_group_advantages")
### END HIDDEN TESTS
_ga = np.asarray(group_advantages(jnp.array([[1.0, 2.0, 4.0, 1.0], [3.0, 3.0, 3.0, 3.0]])))
assert np.allclose(_ga.mean(axis=1), 0.0, atol=1e-5) and np.allclose(_ga[1], 0.0), (
    "each group's advantages have mean 0, and a group of equal scores gets 0")

# %% nbgrader={"grade": true, "grade_id": "test_seq_dpo_loss", "locked": true, "points": 2, "schema_version": 3, "solution": false, "task": false}
# test_seq_dpo_loss: value and gradient of the DPO loss on fresh sequence log-probs, a tie and a pair at beta * margin = -120
### BEGIN HIDDEN TESTS
grading.judge("test_seq_dpo_loss")
### END HIDDEN TESTS
assert abs(float(dpo_loss(jnp.zeros(3), jnp.zeros(3), jnp.zeros(3), jnp.zeros(3), 0.1)) - np.log(2.0)) < 1e-6, (
    "at the reference every margin is 0 and the DPO loss is log 2")

# %% [markdown] nbgrader={"grade": false, "grade_id": "runs_intro", "locked": true, "schema_version": 3, "solution": false, "task": false}
# The next cell trains GRPO and DPO with the library on this task and puts their exact gold, proxy
# and KL beside the optimum. It takes a while to compile, so it is skipped during autograding; run
# it yourself before you answer the questions below.

# %% nbgrader={"grade": false, "grade_id": "contrast_runs", "locked": true, "schema_version": 3, "solution": false, "task": false}
import os

if os.environ.get("NBGRADER_EXECUTION"):
    print("GRPO and DPO runs are skipped while autograding.")
else:
    grpo = sq.train_grpo(task, sq.GRPOConfig(iterations=60))
    dpo = sq.train_dpo(task, beta=0.1, steps=200, eval_every=20)
    for name, res in (("GRPO", grpo), ("DPO", dpo)):
        print(f"{name}: final gold {float(res.gold[-1]):.3f}, proxy {float(res.proxy[-1]):.3f}, "
              f"KL {float(res.kl[-1]):.3f} nats")

# %% [markdown] nbgrader={"grade": false, "grade_id": "analysis_seq", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ## 7. Analysis (graded by hand)

# %% [markdown] nbgrader={"grade": false, "grade_id": "seq_analysis_q1", "locked": true, "schema_version": 3, "solution": false, "task": false}
# **Q1.** Use your over-optimisation plot. Where does the gold reward of $\pi^*_\beta$ peak, what does
# the fitted curve say about it, and why does the proxy keep rising past that point on this task
# (say what the proxy can and cannot see)? Name one way to stop training near the peak without
# access to the gold reward. (3 points)

# %% [markdown] nbgrader={"grade": true, "grade_id": "seq_analysis_a1", "locked": false, "points": 3, "schema_version": 3, "solution": true, "task": false}
# ### BEGIN SOLUTION
# **Model answer.** The gold reward of the optimum rises from the reference's value, peaks at a
# moderate distance (around d = sqrt(KL) of 1 to 1.5 here, beta near 0.3) and then falls while the
# proxy rises monotonically. The fit gain = alpha d - b d^2 has its maximum at d = alpha / (2 b),
# close to the observed peak. The proxy is linear in token counts, length and has-EOS: it cannot
# see token order (the forbidden bigram) and keeps paying for extra copies of the target token
# that the gold reward first rewards with diminishing returns and then penalises, so pushing
# the proxy harder buys gold-reward losses. Stopping near the peak: a larger beta or an adaptive
# KL controller with a KL target, early stopping on a held-out set of human (gold) labels, or an
# ensemble/uncertainty-aware reward model.
#
# **Rubric (3 points).**
# - 1 point: gold rises then falls while the proxy keeps rising, with a peak location read from
#   the plot or from alpha / (2 b).
# - 1 point: the reason names what the proxy misses (order/bigram, curvature in the counts or
#   length), not just "the proxy is imperfect".
# - 1 point: a concrete way to stop near the peak (KL budget/target or larger beta, held-out
#   human evaluation, early stopping, reward-model ensembles).
# ### END SOLUTION

# %% [markdown] nbgrader={"grade": false, "grade_id": "seq_analysis_q2", "locked": true, "schema_version": 3, "solution": false, "task": false}
# **Q2.** A classmate's sequence PPO shows (a) the EOS probability falling to 0 during SFT and many
# truncated responses afterwards, (b) a KL to the reference that grows without bound although beta
# is large, (c) ratios of exactly 1 in every epoch. For each, name the bug you suspect in the
# pieces of notebooks 1 and 2 (or the loop) and one check that would confirm it. (3 points)

# %% [markdown] nbgrader={"grade": true, "grade_id": "seq_analysis_a2", "locked": false, "points": 3, "schema_version": 3, "solution": true, "task": false}
# ### BEGIN SOLUTION
# **Model answer.** (a) EOS is masked: padding written with the EOS id or a mask built as
# `tokens != eos`, so the EOS token's log-prob never enters the SFT loss and the score lands on a
# masked slot; check that `mask.sum(axis=1)` counts the EOS (a response "b <eos>" has 2 real tokens)
# and that PAD and EOS have different ids. (b) The KL penalty has the wrong sign, or is measured
# against the old (sampling) policy instead of the frozen reference, so it is 0 or pushes away
# from the reference; check that at iteration 0 (policy = reference) the KL part is exactly 0 and
# that afterwards the summed per-token KL term equals -beta (log pi(y) - log pi_ref(y)) computed with the
# reference network. (c) The old log-probs are recomputed from the current parameters at each
# epoch, so the ratio is always 1 and clipping never acts; check that `old_logp` is computed once
# per batch and that the clip fraction after the first epoch is above 0.
#
# **Rubric (3 points).** One point per case: the bug named (EOS masked / KL sign or against the
# old policy / old log-probs recomputed) together with a concrete check that would confirm it.
# ### END SOLUTION

# %% [markdown] nbgrader={"grade": false, "grade_id": "explorer_intro_seq", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ## 8. Explorer (not graded)
#
# Move the beta and epsilon sliders: each move re-runs the compiled PPO run of `train` (no new
# compile) and redraws the exact gold reward, proxy reward and KL over training, beside the KL of
# $\pi^*_\beta$, and the most likely responses of the trained policy with their probabilities.
# Skipped during autograding.

# %% nbgrader={"grade": false, "grade_id": "explorer_seq", "locked": true, "schema_version": 3, "solution": false, "task": false}
import os

if os.environ.get("NBGRADER_EXECUTION"):
    print("The explorer is skipped while autograding.")
else:
    try:
        import rlhf_lab.sequences.explorer as seq_explorer
    except ImportError as err:
        print(f"The explorer is not available in this installation: {err}")
    else:
        try:
            seq_explorer.SequenceExplorer(task, config).show()
        except Exception as err:  # the explorer is optional: never break the notebook
            print(f"The explorer could not start: {type(err).__name__}: {err}")
