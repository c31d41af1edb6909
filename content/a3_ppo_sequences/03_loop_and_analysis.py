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
# **Points.** This notebook: **23 points**. The whole assignment `a3_ppo_sequences` (three notebooks) is worth **45 points**: 39 autograded and 6 graded by hand.
#
# | graded cell | points | how |
# |---|---|---|
# | `test_seq_batch_rewards` | 2 | autograded |
# | `test_seq_ppo_epochs` | 3 | autograded |
# | `test_seq_kl_estimators` | 2 | autograded |
# | `test_seq_overopt_fit` | 2 | autograded |
# | `test_seq_group_advantages` | 2 | autograded |
# | `test_seq_dpo_loss` | 2 | autograded |
# | `test_seq_rloo_advantages` | 2 | autograded |
# | `test_seq_length_normalised_score` | 2 | autograded |
# | `seq_analysis_a1` | 3 | graded by hand |
# | `seq_analysis_a2` | 3 | graded by hand |
#
# Run the notebook top to bottom after restarting the kernel. Visible tests help you; hidden tests on fresh random inputs decide the grade. Validate's "Success! Your notebook passes all the tests." means the visible tests passed, not that you have full marks. Keep the first code cell as it is.

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
# `policy_params` and `ref_params` are dicts of float32 arrays (NumPy or JAX); `prompts` `[B]` and
# `tokens` `[B, T]` are JAX int32 arrays, `score` a JAX float32 array `[B]`, `beta` a Python float.

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
    print(f"{decode(LANG, row):28s}", np.round(r, 3) + 0.0)          # + 0.0 prints -0.0 as 0.0

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
# `params` is a dict of float32 arrays (NumPy or JAX); `prompts`, `tokens` (int32), `old_logp` and
# `advantages` (float32) are JAX arrays; the other arguments are Python numbers.

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
    moved = ppo_epochs(ref_params, prompts, tokens, frozen_old, toy_adv, 0.2, 0.5, n)
    ratio = np.exp(np.asarray(token_logp(moved, feats, tokens) * batch_mask - frozen_old))
    clip_fraction.append(float(np.sum((np.abs(ratio - 1) > 0.2) * np.asarray(batch_mask)) / np.sum(batch_mask)))
print("fraction of real tokens outside the band after 1..5 epochs:", np.round(clip_fraction, 3))

# %% nbgrader={"grade": true, "grade_id": "test_seq_ppo_epochs", "locked": true, "points": 3, "schema_version": 3, "solution": false, "task": false}
# test_seq_ppo_epochs: epochs of gradient steps on a fresh batch with the old log-probs frozen at collection, tokens after EOS ignored, zero advantages
### BEGIN HIDDEN TESTS
grading.judge("test_seq_ppo_epochs")
### END HIDDEN TESTS
assert sorted(moved) == sorted(ref_params), "ppo_epochs must return a dict with the same keys as params"

# %% [markdown] nbgrader={"grade": false, "grade_id": "recompute_intro", "locked": true, "schema_version": 3, "solution": false, "task": false}
# **Old log-probs recomputed.** If `old_logp` were recomputed from the current parameters at the
# start of every epoch, every epoch's gradient would be taken at $\rho = 1$ exactly: the fraction
# of ratios outside the band, measured against those recomputed log-probs, is 0 at every epoch, and
# the clip never acts. The next cell does that with your `ppo_epochs` (one epoch at a time, `old_logp`
# recomputed before each) and measures the ratios against the policy that sampled the batch, beside
# the frozen version above.

# %% nbgrader={"grade": false, "grade_id": "recompute_old_logp", "locked": true, "schema_version": 3, "solution": false, "task": false}
recomputed, recomputed_fraction = ref_params, []
for n in range(1, 6):
    fresh_old = token_logp(recomputed, feats, tokens) * batch_mask            # recomputed: rho = 1 again
    recomputed = ppo_epochs(recomputed, prompts, tokens, fresh_old, toy_adv, 0.2, 0.5, 1)
    ratio = np.exp(np.asarray(token_logp(recomputed, feats, tokens) * batch_mask - frozen_old))
    recomputed_fraction.append(float(np.sum((np.abs(ratio - 1) > 0.2) * np.asarray(batch_mask)) / np.sum(batch_mask)))
drift = {name: float(np.max(np.abs(np.asarray(token_logp(p, feats, tokens) * batch_mask - frozen_old))))
         for name, p in (("frozen", moved), ("recomputed", recomputed))}
print("outside the band after 1..5 epochs, old_logp frozen    :", np.round(clip_fraction, 3))
print("outside the band after 1..5 epochs, old_logp recomputed:", np.round(recomputed_fraction, 3))
print("largest |log pi - log pi_sampling| after 5 epochs (nats):", {k: round(v, 2) for k, v in drift.items()})

# %% [markdown] nbgrader={"grade": false, "grade_id": "loop_intro", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ## 3. The whole loop, compiled
#
# The library's `train` runs the full algorithm you built: sampling, `old_logp` and `ref_logp`
# frozen per batch, the library's per-token rewards (the formula you wrote in notebook 2), GAE,
# whitening over real tokens, epochs of minibatches
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
fig, (ax_r, ax_kl) = plt.subplots(1, 2, figsize=(9, 3.5))
ax_r.plot(run.eval_iteration, run.proxy, marker="o", label="proxy (training reward)")
ax_r.plot(run.eval_iteration, run.gold, marker="o", label="gold (hidden)")
ax_r.set_xlabel("PPO iteration (batches of 64 responses)")
ax_r.set_ylabel("exact expected reward (reward units)")
ax_r.set_title("One PPO run, beta = 0.05")
ax_r.legend(fontsize="small")
ax_kl.plot(run.eval_iteration, run.kl, marker="o", color="tab:green")
ax_kl.set_xlabel("PPO iteration (batches of 64 responses)")
ax_kl.set_ylabel("exact KL(pi || pi_ref) (nats)")
ax_kl.set_title("Distance from the reference")
plt.show()

# %% [markdown] nbgrader={"grade": false, "grade_id": "kl_intro_seq", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ## 4. KL estimators
#
# With one sampled token, $k_1 = \log\pi - \log\pi_{\text{ref}}$, $k_2 = \tfrac12(\log\pi - \log\pi_{\text{ref}})^2$ and,
# with $r = \log\pi_{\text{ref}} - \log\pi$, $k_3 = (e^{r} - 1) - r$. Write
# `kl_estimators(logp, ref_logp)` returning a dict `{"k1", "k2", "k3"}` of arrays shaped like `logp`
# (elementwise; `logp` and `ref_logp` are JAX float32 arrays of any shape, `[n]` or `[B, T]`).

# %% nbgrader={"grade": false, "grade_id": "kl_estimators_answer", "locked": false, "schema_version": 3, "solution": true, "task": false}
def kl_estimators(logp, ref_logp):
    """{"k1": ..., "k2": ..., "k3": ...} for the sampled tokens' log-probs (elementwise; JAX float32 arrays)."""
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

# %% [markdown]
# **Predict** (not graded, but write it down *before* running the next cell):
# the next cell samples 4,096 whole responses and sums each estimator over a response's tokens, once
# from a policy close to the reference and once from the trained policy of section 3 (KL near 10
# nats); it is skipped during autograding. Both means estimate the same KL. Which of $k_1$ and $k_3$
# has the smaller standard deviation per response near the reference, and which far from it?
#
# *My prediction:* 

# %% nbgrader={"grade": false, "grade_id": "kl_near_far", "locked": true, "schema_version": 3, "solution": false, "task": false}
import os

if os.environ.get("NBGRADER_EXECUTION"):
    print("The Monte Carlo estimates are skipped while autograding.")
else:
    trained = run.policy_params                                                     # the PPO run of section 3
    near = jax.tree_util.tree_map(lambda r, t: r + 0.1 * (t - r), ref_params, trained)   # a tenth of the way there
    mc_prompts = jnp.arange(4096, dtype=jnp.int32) % LANG.n_prompts
    for name, params in (("near the reference", near), ("the trained policy", trained)):
        mc_tokens, mc_mask = sample_responses(jax.random.key(2), params, LANG, mc_prompts)
        mc_feats = context_features(LANG, mc_prompts, mc_tokens)
        est = kl_estimators(token_logp(params, mc_feats, mc_tokens), token_logp(ref_params, mc_feats, mc_tokens))
        k1_seq, k3_seq = (np.asarray(jnp.sum(jnp.where(mc_mask > 0, est[k], 0.0), axis=1), np.float64) for k in ("k1", "k3"))
        print(f"{name}: exact KL {sq.evaluate_policy(task, params, 0.05)['kl']:.2f} nats; mean k1 {k1_seq.mean():.2f}, "
              f"k3 {k3_seq.mean():.2f}; std per response k1 {k1_seq.std():.2f}, k3 {k3_seq.std():.2f} "
              f"({k3_seq.std() / k1_seq.std():.1f} x); largest k3 {k3_seq.max():.0f}")


# %% nbgrader={"grade": false, "grade_id": "kl_exact_spread", "locked": true, "schema_version": 3, "solution": false, "task": false}
import os

if os.environ.get("NBGRADER_EXECUTION"):
    print("The exact spreads are skipped while autograding.")
else:
    # the same two policies, every response of every prompt weighted by its exact probability (no sampling)
    tree = sq.prefix_tree(LANG)
    real = tree.response_mask > 0
    at, took = np.where(real, tree.response_prefix, 0), np.where(real, tree.response_action, 0)
    ref_node, _ = sq.exact.policy_tables(ref_params, task.arrays.prefix_features, LANG)
    spread_policies = {"near the reference": jax.tree_util.tree_map(lambda r, t: r + 0.1 * (t - r), ref_params,
                                                                    run.policy_params),
                       "the trained policy": run.policy_params}
    exact_spread = {}   # name -> (std of k1, std of k3) per response, summed over its tokens
    for name, params in spread_policies.items():
        node, resp = sq.exact.policy_tables(params, task.arrays.prefix_features, LANG)
        log_r = np.asarray(ref_node, np.float64)[:, at, took] - np.asarray(node, np.float64)[:, at, took]
        weight = np.exp(np.asarray(resp, np.float64)) / LANG.n_prompts          # prompts drawn uniformly
        stds = []
        for per_token in (-log_r, np.expm1(log_r) - log_r):                     # k1 and k3 of every token
            k = np.sum(np.where(real, per_token, 0.0), axis=-1)
            stds.append(float(np.sqrt(np.sum(weight * k**2) - np.sum(weight * k) ** 2)))
        exact_spread[name] = tuple(stds)
        print(f"{name}: exact std per response k1 {stds[0]:.2f}, k3 {stds[1]:.2f} ({stds[1] / stds[0]:.1f} x)")


# %% [markdown] nbgrader={"grade": false, "grade_id": "kl_near_far_reveal", "locked": true, "schema_version": 3, "solution": false, "task": false}
# Near the reference the ratio $r = \pi_{\text{ref}}/\pi$ of a sampled token stays close to 1, where
# $k_3 = (r - 1) - \log r \approx \tfrac12 (\log r)^2$ is small and smooth: its spread is a fraction of
# $k_1$'s, which is why $k_3$ is called low-variance. Far from the reference the trained policy now and
# then samples a token the reference likes much more than it does ($r \gg 1$): there $k_3 \approx r$
# explodes while $k_1 = -\log r$ grows only like a logarithm. Both stay unbiased, but $k_3$'s spread
# becomes many times $k_1$'s, and a sample of a few thousand responses underestimates it because the
# tail is rare (the last cell weighs every response by its exact probability, without sampling: there
# the ratio is 8.6 for the trained policy and 0.2 near the reference). Low variance is a property of
# $k_3$ near the reference, not everywhere.

# %% [markdown] nbgrader={"grade": false, "grade_id": "overopt_intro", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ## 5. Over-optimisation, on exact numbers
#
# For each beta the best possible policy is $\pi^*_\beta \propto \pi_{\text{ref}}\,e^{s/\beta}$ (over all
# responses). `optimum_summary(task, beta)` gives its exact gold and proxy reward and KL. Gao et al.
# (2022) describe the gold gain over the reference, with $d = \sqrt{\mathrm{KL}}$, by two forms: for
# best-of-n sampling $\text{gain}(d) = \alpha d - b d^2$, for RL $\text{gain}(d) = d(\alpha - b \log d)$.
# Write `fit_overoptimisation(kl, gain)` returning the least-squares `np.array([alpha, b])` of the
# best-of-n form (no intercept; `np.linalg.lstsq` helps); `kl` and `gain` are NumPy float64 arrays
# `[n]`. The experiment fits it to best-of-n, and
# fits the RL form to $\pi^*_\beta$.

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
bon_curve = [best_of_n_summary(task, 2**k) for k in range(11)]          # n = 1, 2, 4, ..., 1024
bon_kl = np.array([r["kl"] for r in bon_curve])
bon_gold = np.array([r["gold"] for r in bon_curve])
alpha, b = fit_overoptimisation(bon_kl, bon_gold - reference["gold"])   # the best-of-n form, on best-of-n
d_opt = np.sqrt(opt_kl)
alpha_rl, b_rl = np.linalg.lstsq(np.stack([d_opt, -d_opt * np.log(d_opt)], axis=1),
                                 opt_gold - reference["gold"], rcond=None)[0]   # the RL form, on pi*_beta
print(f"best-of-n, form alpha d - b d^2    : alpha {alpha:.2f}, b {b:.2f}; peak of the fit at d = {alpha / (2 * b):.2f}, "
      f"observed at d = {np.sqrt(bon_kl)[np.argmax(bon_gold)]:.2f}")
print(f"pi*_beta,  form d (alpha - b log d): alpha {alpha_rl:.2f}, b {b_rl:.2f}; peak of the fit at d = "
      f"{np.exp(alpha_rl / b_rl - 1):.2f}, observed at d = {d_opt[np.argmax(opt_gold)]:.2f}")
alpha_q, b_q = fit_overoptimisation(opt_kl, opt_gold - reference["gold"])   # the best-of-n form, on pi*_beta
print(f"pi*_beta,  form alpha d - b d^2    : alpha {alpha_q:.2f}, b {b_q:.2f}; peak of the fit at d = {alpha_q / (2 * b_q):.2f}")

# %% nbgrader={"grade": false, "grade_id": "overopt_plot", "locked": true, "schema_version": 3, "solution": false, "task": false}
d_grid = np.linspace(1e-3, d_opt.max(), 200)
d_bon = np.linspace(0.0, np.sqrt(bon_kl.max()), 100)
fig, ax = plt.subplots(figsize=(10, 4.2))
ax.plot(d_opt, opt_proxy, "o-", label="proxy of pi*_beta")
ax.plot(d_opt, opt_gold, "o-", label="gold of pi*_beta")
ax.plot(d_grid, reference["gold"] + d_grid * (alpha_rl - b_rl * np.log(d_grid)), "k--",
        label=f"RL form on pi*_beta: d ({alpha_rl:.2f} - {b_rl:.2f} log d)")
ax.plot(np.sqrt(bon_kl), bon_gold, "^-", label="gold of best-of-n (n = 1 ... 1024)")
ax.plot(d_bon, reference["gold"] + alpha * d_bon - b * d_bon**2, "k:",
        label=f"best-of-n form on best-of-n: {alpha:.2f} d - {b:.2f} d^2")
ax.plot(np.sqrt(np.asarray(run.kl)), run.gold, "s:", label="gold of the PPO run above")
ax.set_xlabel("d = sqrt(KL(pi || pi_ref)) (sqrt nats)")
ax.set_ylabel("exact expected reward (reward units)")
ax.set_title("Optimising the proxy harder eventually lowers the gold reward")
ax.legend(fontsize="small", loc="upper left", bbox_to_anchor=(1.02, 1.0))
fig.tight_layout()
plt.show()

# %% nbgrader={"grade": false, "grade_id": "overopt_fit_errors", "locked": true, "schema_version": 3, "solution": false, "task": false}
forms = {"alpha d - b d^2": lambda d: np.stack([d, -d**2], axis=1),
         "d (alpha - b log d)": lambda d: np.stack([d, -d * np.log(np.where(d > 0, d, 1.0))], axis=1)}
curves = {"pi*_beta": (opt_kl, opt_gold), "best-of-n": (bon_kl, bon_gold),
          "PPO run": (np.asarray(run.kl, np.float64), np.asarray(run.gold, np.float64))}
print("root-mean-square error of each least-squares fit (reward units)")
print(f"{'form':22s}" + "".join(f"{name:>11s}" for name in curves))
for form, design in forms.items():
    errors = []
    for kl, gold in curves.values():
        X, gain = design(np.sqrt(np.maximum(kl, 0.0))), gold - reference["gold"]
        errors.append(np.sqrt(np.mean((gain - X @ np.linalg.lstsq(X, gain, rcond=None)[0]) ** 2)))
    print(f"{form:22s}" + "".join(f"{e:11.3f}" for e in errors))

# %% [markdown] nbgrader={"grade": false, "grade_id": "overopt_reading", "locked": true, "schema_version": 3, "solution": false, "task": false}
# Each form fits its own curve better than the other form does, and a fitted peak is only as good as
# its form. On this machine: best-of-n's gold peaks at d = 1.58 (n = 32) and the quadratic puts its
# peak at 1.61; the gold of $\pi^*_\beta$ peaks at d = 1.25 (beta = 0.30; the grid's neighbours are at
# 1.08 and 1.53) and the RL form puts its peak at 1.18. The quadratic fitted to $\pi^*_\beta$ instead
# would say 1.64, which is not close to 1.25. Neither form fits $\pi^*_\beta$ closely (errors of 0.161
# and 0.195), and on the seven points of the PPO run the quadratic happens to do better than the RL
# form (0.079 against 0.143): these are empirical forms, not laws.

# %% [markdown] nbgrader={"grade": false, "grade_id": "gold_terms_intro", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ### Which part of the gold reward moves?
#
# The gold reward is a sum of four terms (`sq.gold_terms`, the hidden reward's own pieces): the
# target count with diminishing returns (best at 2 copies), the forbidden bigram, the distance from the
# preferred length and the missing-EOS penalty. The next cell gives the exact expected value of each
# term under the reference and under $\pi^*_\beta$ for each beta of the plot (skipped during
# autograding, like the runs below). Use it for Q1.

# %% nbgrader={"grade": false, "grade_id": "gold_decomposition", "locked": true, "schema_version": 3, "solution": false, "task": false}
import os

if os.environ.get("NBGRADER_EXECUTION"):
    print("The table of gold terms is skipped while autograding.")
else:
    tree = sq.prefix_tree(LANG)
    n_p, n_r = LANG.n_prompts, LANG.n_responses
    terms = sq.gold_terms(task.gold, LANG, np.repeat(np.arange(n_p), n_r), np.tile(tree.response_tokens, (n_p, 1)),
                          np.tile(tree.response_mask, (n_p, 1)))
    terms = {k: np.asarray(v, np.float64).reshape(n_p, n_r) for k, v in terms.items()}
    policies = [("reference", 0.0, task.arrays.ref_resp_logp)] + [
        (f"beta {beta:.3f}", d, sq.exact.optimal_logp(task.arrays.ref_resp_logp, task.arrays.score, float(beta)))
        for beta, d in zip(betas, d_opt)]
    print(f"{'exact E[term]':14s}{'d':>6s}" + "".join(f"{k:>13s}" for k in terms) + f"{'gold':>8s}{'proxy':>8s}")
    for (name, d, logp), proxy in zip(policies, [reference["proxy"]] + list(opt_proxy)):
        probs = np.exp(np.asarray(logp, np.float64))
        expected = [float(np.mean(np.sum(probs * v, axis=1))) for v in terms.values()]
        shown = [round(e, 3) + 0.0 for e in expected + [sum(expected), float(proxy)]]   # + 0.0: no "-0.000"
        print(f"{name:14s}{d:6.2f}" + "".join(f"{e:13.3f}" for e in shown[:-2]) + f"{shown[-2]:8.3f}{shown[-1]:8.3f}")

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
# score as the advantage of every token, $A_{ij} = (s_{ij} - \bar s_i)/(\operatorname{std}_i s + 10^{-6})$,
# with the **population** std (divide by the group size $K$; TRL's `GRPOTrainer` uses torch's
# Bessel-corrected std, divide by $K - 1$, which for $K = 8$ makes the std $\sqrt{8/7} \approx 1.07$
# times larger and the advantages that much smaller). A group whose scores are all equal carries no signal: its advantages are 0
# (the library's `group_advantages` also treats a group whose std is at most $10^{-4}$ of its largest
# $|s|$ as constant, so float32 rounding of the mean cannot turn into a large advantage; the hidden
# test accepts the formula with or without that rule). The library's GRPO loss averages the clipped
# per-token terms, plus $\beta k_3$ in the loss, over **all real tokens of a minibatch** (a token mean,
# as DAPO does), not first over each response's tokens and then over responses (the per-response mean
# of DeepSeekMath's GRPO, which gives the tokens of short responses more weight). *DPO* skips the reward model: on the preference pairs it minimises
# $\operatorname{mean}\operatorname{softplus}\big(-\beta[(\log\pi(y^c) - \log\pi_{\text{ref}}(y^c)) - (\log\pi(y^r) - \log\pi_{\text{ref}}(y^r))]\big)$
# over sequence log-probs. Write `group_advantages(scores)` (`scores` a JAX float32 array
# `[n_groups, group_size]`) and `dpo_loss(logp_chosen, logp_rejected, ref_logp_chosen, ref_logp_rejected, beta)`
# (JAX float32 arrays `[n]`, differentiated with `jax.grad`).

# %% nbgrader={"grade": false, "grade_id": "group_advantages_answer", "locked": false, "schema_version": 3, "solution": true, "task": false}
def group_advantages(scores):
    """GRPO advantages: scores (JAX float32 [n_groups, group_size]) normalised within each row; same shape."""
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
# The next cells train GRPO (60 iterations, beta 0.05) and DPO (1,000 steps, beta 0.1) with the library
# on this task and print their exact gold, proxy and KL beside the PPO run of section 3 and the optimum
# $\pi^*_\beta$ of the same beta. They take a while to compile, so they are skipped during
# autograding; run them yourself before you answer the questions below.

# %% nbgrader={"grade": false, "grade_id": "contrast_runs", "locked": true, "schema_version": 3, "solution": false, "task": false}
import os

if os.environ.get("NBGRADER_EXECUTION"):
    print("GRPO and DPO runs are skipped while autograding.")
else:
    grpo = sq.train_grpo(task, sq.GRPOConfig(iterations=60))
    dpo = sq.train_dpo(task, beta=0.1, steps=1000, eval_every=50)
    at_200 = list(np.asarray(dpo.eval_step)).index(200)
    best = int(np.argmax(opt_gold))
    rows = [("PPO (section 3), beta 0.05", run.gold[-1], run.proxy[-1], run.kl[-1], run.regret[-1]),
            ("GRPO, beta 0.05, 60 iterations", grpo.gold[-1], grpo.proxy[-1], grpo.kl[-1], grpo.regret[-1]),
            ("pi*_beta, beta 0.05", *[optimum_summary(task, 0.05)[k] for k in ("gold", "proxy", "kl")], 0.0),
            ("DPO, beta 0.1, 200 steps", dpo.gold[at_200], dpo.proxy[at_200], dpo.kl[at_200], dpo.regret[at_200]),
            ("DPO, beta 0.1, 1000 steps", dpo.gold[-1], dpo.proxy[-1], dpo.kl[-1], dpo.regret[-1]),
            ("pi*_beta, beta 0.1", *[optimum_summary(task, 0.1)[k] for k in ("gold", "proxy", "kl")], 0.0),
            (f"pi*_beta, beta {betas[best]:.2f} (best gold)", opt_gold[best], opt_proxy[best], opt_kl[best], None)]
    print(f"{'':38s}{'gold':>8s}{'proxy':>8s}{'KL (nats)':>11s}{'regret':>8s}")
    for name, gold, proxy, kl, regret in rows:
        shown = "-" if regret is None else f"{round(float(regret), 3) + 0.0:.3f}"
        print(f"{name:38s}{round(float(gold), 3) + 0.0:8.3f}{round(float(proxy), 3) + 0.0:8.3f}{float(kl):11.2f}{shown:>8s}")

# %% nbgrader={"grade": false, "grade_id": "dpo_long_curve", "locked": true, "schema_version": 3, "solution": false, "task": false}
import os

if os.environ.get("NBGRADER_EXECUTION"):
    print("The DPO curve is skipped while autograding.")
else:
    fig, (ax_r, ax_kl) = plt.subplots(1, 2, figsize=(9, 3.5))
    ax_r.plot(dpo.eval_step, dpo.gold, "o-", label="gold of DPO")
    ax_r.plot(dpo.eval_step, dpo.proxy, "^-", label="proxy of DPO")
    ax_r.axhline(opt_gold.max(), color="k", linestyle="--", label="best gold of pi*_beta (beta grid)")
    ax_r.set_xlabel("DPO step (full-batch Adam steps)")
    ax_r.set_ylabel("exact expected reward (reward units)")
    ax_r.set_title("DPO, beta = 0.1, run longer")
    ax_r.legend(fontsize="small")
    ax_kl.plot(dpo.eval_step, dpo.kl, "o-", color="tab:green")
    ax_kl.set_xlabel("DPO step (full-batch Adam steps)")
    ax_kl.set_ylabel("exact KL(pi || pi_ref) (nats)")
    ax_kl.set_title("Distance from the reference")
    plt.show()

# %% nbgrader={"grade": false, "grade_id": "dpo_gold_terms", "locked": true, "schema_version": 3, "solution": false, "task": false}
import os

if os.environ.get("NBGRADER_EXECUTION"):
    print("The gold terms of DPO are skipped while autograding.")
else:
    _, dpo_logp = sq.exact.policy_tables(dpo.policy_params, task.arrays.prefix_features, LANG)
    near_kl = int(np.argmin(np.abs(opt_kl - float(dpo.kl[-1]))))        # the pi*_beta of the grid closest in KL
    print(f"{'exact E[term]':34s}{'KL':>6s}" + "".join(f"{k:>13s}" for k in terms))
    for name, logp, kl in (("DPO after 1000 steps", dpo_logp, float(dpo.kl[-1])),
                           (f"pi*_beta, beta {betas[near_kl]:.3f}",
                            sq.exact.optimal_logp(task.arrays.ref_resp_logp, task.arrays.score, float(betas[near_kl])),
                            opt_kl[near_kl])):
        probs = np.exp(np.asarray(logp, np.float64))
        print(f"{name:34s}{kl:6.2f}" + "".join(f"{round(float(np.mean(np.sum(probs * v, axis=1))), 3) + 0.0:13.3f}"
                                               for v in terms.values()))

# %% [markdown] nbgrader={"grade": false, "grade_id": "dpo_reading", "locked": true, "schema_version": 3, "solution": false, "task": false}
# **Does DPO avoid over-optimisation?** After 200 steps DPO's gold reward is above that of every
# $\pi^*_\beta$ of the grid, but this does not show that DPO avoids over-optimisation. $\pi^*_\beta$ is
# the best policy for the *proxy*, a reward model linear in token counts, length and EOS. DPO never
# uses that proxy: its implicit reward $\beta \log(\pi/\pi_{\text{ref}})$ lives in the policy network's
# features (the previous token and the counts so far, through a tanh layer), so it can represent what
# the linear proxy cannot. The table above shows which part matters here: at about the same KL, DPO's
# policy keeps the target term at 0.65 and the length term at -0.44, where $\pi^*_\beta$ has the
# values -0.51 and -0.63; the bigram term is 0 for both (numbers from this machine). DPO's reward sees the curvature
# in the target count and the length that the proxy misses: the comparison is between two reward
# models, not two optimisers. And run longer, DPO over-optimises too: its gold reward peaks near step
# 200 and then falls while its KL keeps growing (from 0.595 at 3.68 nats to 0.210 at 9.49 nats after
# 1,000 steps).

# %% [markdown] nbgrader={"grade": false, "grade_id": "grpo_question", "locked": true, "schema_version": 3, "solution": false, "task": false}
# **Think** (not graded). GRPO optimises the same score as PPO with the same beta, yet it ends
# *beyond* $\pi^*_{0.05}$: more proxy, more KL and less gold than the optimum, with a regret several
# times PPO's (in 200-iteration runs with the library's defaults, 0.110 against 0.0044: 25 times).
# Why? Compare, in the next cell, the spread of the scores within a group under the reference and
# under the final GRPO policy, and ask what the KL term $\beta k_3$ is weighed against once every
# group's advantages are divided by that spread.

# %% nbgrader={"grade": false, "grade_id": "grpo_group_spread", "locked": true, "schema_version": 3, "solution": false, "task": false}
import os

if os.environ.get("NBGRADER_EXECUTION"):
    print("The GRPO group statistics are skipped while autograding.")
else:
    group_prompts = (jnp.arange(1024) // 8 % LANG.n_prompts).astype(jnp.int32)   # 128 groups of 8, as GRPO samples
    for name, params in (("reference", ref_params), ("final GRPO policy", grpo.policy_params)):
        g_tokens, g_mask = sample_responses(jax.random.key(3), params, LANG, group_prompts)
        g_score = np.asarray(sq.ppo.response_score(task.arrays, LANG, group_prompts, g_tokens, g_mask), np.float64)
        spread = np.std(g_score.reshape(-1, 8), axis=1)
        print(f"{name:18s}: median std of the score within a group {np.median(spread):.3f}; "
              f"groups whose 8 scores are all equal: {np.mean(spread == 0):.0%}")

# %% [markdown] nbgrader={"grade": false, "grade_id": "grpo_answer", "locked": true, "schema_version": 3, "solution": false, "task": false}
# Dividing by the group's std gives every group's advantages a spread of 1, whatever the spread of
# its scores. As the policy concentrates, the scores within a group differ less and less (the median
# std above falls by an order of magnitude), so small score differences are blown up to the size the
# large ones had at the start, while the KL term $\beta k_3$ keeps its weight. Measured against the
# score, the KL penalty becomes an order of magnitude weaker, and GRPO keeps going where
# $\pi^*_{0.05}$ stops (Dr. GRPO drops the division and keeps advantages $s - \bar s$; section 7's RLOO,
# which drops it and also moves the KL into the reward, ends at $\pi^*_{0.05}$). The rest of its regret is a different objective:
# $k_3$ in the loss follows the gradient of $\mathrm{KL}(\pi_{\text{ref}}\Vert\pi)$ per token (section 4),
# not of the sequence KL that defines $\pi^*_\beta$.

# %% [markdown] nbgrader={"grade": false, "grade_id": "rloo_intro", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ## 7. RLOO: the other responses of the group as the baseline
#
# RLOO (REINFORCE leave-one-out; Ahmadian et al. 2024, TRL's `RLOOTrainer`) keeps GRPO's groups
# and has no critic either, but changes the two things section 6 blamed:
#
# * **no std.** Each response is compared with the mean of the *other* $K-1$ responses of its
#   group: $A_{ij} = r_{ij} - \frac{1}{K-1}\sum_{k \ne j} r_{ik}$. The baseline never uses the
#   response it scores, so the advantage is an unbiased REINFORCE weight;
# * **the KL in the reward**, per response, as PPO does: $r_{ij} = s_{ij} - \beta \sum_t
#   (\log\pi_{\text{old}} - \log\pi_{\text{ref}})$ over its real tokens, the sampled sequence KL.
#   Its gradient is the one of $E_\pi[s] - \beta\,\mathrm{KL}(\pi \Vert \pi_{\text{ref}})$, the
#   objective whose maximiser is $\pi^*_\beta$.
#
# Everything else of `sq.train_rloo` is `sq.train_grpo`'s: the same clipped loss (a token mean),
# 128 responses per iteration in groups of 8, 2 epochs of 4 minibatches, the same learning rate and
# beta. Write `rloo_advantages(rewards)` for `rewards` of shape `[n_groups, group_size]`
# (`group_size` at least 2; a JAX float32 array, or a NumPy float64 one).

# %% nbgrader={"grade": false, "grade_id": "rloo_advantages_answer", "locked": false, "schema_version": 3, "solution": true, "task": false}
def rloo_advantages(rewards):
    """RLOO advantages: each reward minus the mean of the other rewards of its row; same shape."""
    ### BEGIN SOLUTION
    rewards = jnp.asarray(rewards)
    k = rewards.shape[-1]
    return rewards - (jnp.sum(rewards, axis=-1, keepdims=True) - rewards) / (k - 1)
    ### END SOLUTION


# %% nbgrader={"grade": true, "grade_id": "test_seq_rloo_advantages", "locked": true, "points": 2, "schema_version": 3, "solution": false, "task": false}
# test_seq_rloo_advantages: leave-one-out advantages on fresh groups (equal rewards give 0; groups of two, float64, a common offset)
### BEGIN HIDDEN TESTS
grading.judge("test_seq_rloo_advantages")
### END HIDDEN TESTS
_ra = np.asarray(rloo_advantages(jnp.array([[1.0, 2.0, 3.0], [2.0, 2.0, 2.0]])))
assert np.allclose(_ra[0], [-1.5, 0.0, 1.5], atol=1e-6), (
    f"rewards 1, 2, 3: the baselines are the means of the other two (2.5, 2, 1.5), got {_ra[0]}")
assert np.allclose(_ra[1], 0.0, atol=1e-6), "a group of equal rewards gets advantage 0"

# %% [markdown] nbgrader={"grade": false, "grade_id": "rloo_predict", "locked": true, "schema_version": 3, "solution": false, "task": false}
# **Predict** (not graded, but write it down *before* running the next cell): PPO, GRPO and RLOO
# each run 200 iterations of 128 responses at beta 0.05 on this task. GRPO ends beyond
# $\pi^*_{0.05}$ (KL 10.2 nats). Where does RLOO end: beyond it, at it, or short of it? Which of
# the three has the smallest regret?
#
# *My prediction:* 

# %% nbgrader={"grade": false, "grade_id": "rloo_runs", "locked": true, "schema_version": 3, "solution": false, "task": false}
import os

if os.environ.get("NBGRADER_EXECUTION"):
    print("The PPO, GRPO and RLOO runs are skipped while autograding.")
else:
    same_budget = {"PPO": sq.train(task, SeqPPOConfig(iterations=200, beta=0.05)),
                   "GRPO": sq.train_grpo(task, sq.GRPOConfig(iterations=200, beta=0.05)),
                   "RLOO": sq.train_rloo(task, sq.GRPOConfig(iterations=200, beta=0.05))}
    star = optimum_summary(task, 0.05)
    print(f"{'200 iterations, beta 0.05':28s}{'gold':>8s}{'proxy':>8s}{'KL (nats)':>11s}{'regret':>9s}")
    for name, r in same_budget.items():
        print(f"{name:28s}{float(r.gold[-1]):8.3f}{float(r.proxy[-1]):8.3f}{float(r.kl[-1]):11.2f}{float(r.regret[-1]):9.4f}")
    print(f"{'pi*_0.05':28s}{star['gold']:8.3f}{star['proxy']:8.3f}{star['kl']:11.2f}{0.0:9.4f}")
    fig, (ax_kl, ax_reg) = plt.subplots(1, 2, figsize=(9, 3.5))
    for name, r in same_budget.items():
        steps = r.eval_iteration if name == "PPO" else r.eval_step
        ax_kl.plot(steps, r.kl, marker="o", markersize=3, label=name)
        ax_reg.semilogy(steps, r.regret, marker="o", markersize=3, label=name)
    ax_kl.axhline(star["kl"], color="k", linestyle="--", label="KL of pi*_0.05")
    ax_kl.set_xlabel("iteration (batches of 128 responses)")
    ax_kl.set_ylabel("exact KL(pi || pi_ref) (nats)")
    ax_kl.set_title("Distance from the reference")
    ax_kl.legend(fontsize="small")
    ax_reg.set_xlabel("iteration (batches of 128 responses)")
    ax_reg.set_ylabel("exact regret (reward units, log scale)")
    ax_reg.set_title("Objective of pi*_0.05 minus the run's")
    ax_reg.legend(fontsize="small")
    plt.show()

# %% [markdown] nbgrader={"grade": false, "grade_id": "rloo_reveal", "locked": true, "schema_version": 3, "solution": false, "task": false}
# **Reveal.** RLOO ends at $\pi^*_{0.05}$, not beyond it: on this machine after 200 iterations its
# KL is 10.44 nats against the optimum's 10.16 and its regret 0.0072, where GRPO is at 13.23 nats
# with a regret of 0.110 and PPO at 10.23 nats with 0.0044. With the same sampling, groups, clipped
# loss and beta, the two changes of RLOO are enough for it to follow the objective that defines
# $\pi^*_\beta$. PPO, whose critic and GAE give each token its own advantage, still has the
# smallest regret, and RLOO gets there more slowly: after 60 iterations (the GRPO run of section 6)
# RLOO is still short of the optimum (KL 8.52 nats, regret 0.086).

# %% [markdown] nbgrader={"grade": false, "grade_id": "length_intro", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ## 8. A reward model that pays for length
#
# Reward models fitted to human preferences often learn that longer answers win, and a policy
# trained on them writes longer answers whether or not they are better. Here the bias is exact:
# `sq.length_bias.with_length_bonus(task, 1.0)` is the task whose proxy pays 1 reward unit per
# content token on top of what it paid before (the proxy's std under the reference is 1; EOS is
# not counted). The gold reward does not change: it measures what the bias costs.
#
# One remedy is to remove what the length explains: the **length-normalised score**
# $s'_{pr} = s_{pr} - c\,(L_r - \bar L_p)$, where $\bar L_p = E_{\pi_{\text{ref}}}[L \mid p]$ and $c$
# is the least-squares slope of the score on the length under the reference, one slope for the
# whole task (a reward model has one length weight), each prompt centred on its own means
# $\bar s_p = E_{\pi_{\text{ref}}}[s \mid p]$ and $\bar L_p$:
#
# $$c = \frac{\sum_p \sum_r \pi_{\text{ref}}(r \mid p)\,(s_{pr} - \bar s_p)(L_r - \bar L_p)}
#            {\sum_p \sum_r \pi_{\text{ref}}(r \mid p)\,(L_r - \bar L_p)^2}.$$
#
# Write `length_normalised_score(score, length, ref_logp)`: `score` is `[P, R]` (every response of
# every prompt), `length` is `[R]` (content tokens of each response, the same for every prompt),
# `ref_logp` is `[P, R]` (reference log-probabilities, each row sums to 1 in probability). Return
# `[P, R]`. The lengths of the responses vary, so the denominator is positive. The three arrays are
# JAX float32 arrays or NumPy float64 arrays.

# %% nbgrader={"grade": false, "grade_id": "length_normalised_answer", "locked": false, "schema_version": 3, "solution": true, "task": false}
def length_normalised_score(score, length, ref_logp):
    """The score minus c (L - E_ref[L | p]), c the pooled within-prompt slope of score on length; [P, R]."""
    ### BEGIN SOLUTION
    score = jnp.asarray(score, jnp.float32)
    length = jnp.broadcast_to(jnp.asarray(length, jnp.float32), score.shape)
    probs = jnp.exp(jnp.asarray(ref_logp, jnp.float32))
    d_score = score - jnp.sum(probs * score, axis=1, keepdims=True)
    d_length = length - jnp.sum(probs * length, axis=1, keepdims=True)
    c = jnp.sum(probs * d_score * d_length) / jnp.sum(probs * d_length ** 2)
    return score - c * d_length
    ### END SOLUTION


# %% nbgrader={"grade": true, "grade_id": "test_seq_length_normalised_score", "locked": true, "points": 2, "schema_version": 3, "solution": false, "task": false}
# test_seq_length_normalised_score: the score with its reference length slope removed, on fresh tables (a length that never varies, one prompt, float64, a score linear in length)
### BEGIN HIDDEN TESTS
grading.judge("test_seq_length_normalised_score")
### END HIDDEN TESTS
_lengths = sq.length_bias.response_lengths(task)
_normalised = np.asarray(length_normalised_score(task.arrays.score, _lengths, task.arrays.ref_resp_logp), np.float64)
_probs = np.exp(np.asarray(task.arrays.ref_resp_logp, np.float64))
_dl = _lengths - np.sum(_probs * _lengths, axis=1, keepdims=True)
assert abs(np.sum(_probs * _normalised * _dl)) < 1e-3 * np.sum(_probs * _dl ** 2), (
    "under the reference the normalised score must not covary with the length")
assert np.allclose(np.sum(_probs * _normalised, axis=1), np.sum(_probs * np.asarray(task.arrays.score), axis=1),
                   atol=1e-4), "each prompt keeps its mean score under the reference"

# %% [markdown] nbgrader={"grade": false, "grade_id": "length_predict", "locked": true, "schema_version": 3, "solution": false, "task": false}
# **Predict** (not graded, but write it down *before* running the next cell). The next cell computes
# the exact optimum $\pi^*_\beta$ of three scores, for beta from 2 down to 0.05: the proxy score,
# the proxy plus 1 per content token, and the length-normalised score of that biased proxy.
# (a) At beta 0.5, how much longer are the responses of the biased optimum than those of the
# unbiased one (the reference's mean is 4.64 content tokens), and does its gold go up or down?
# (b) Does a larger beta undo the bias, or only limit it? (c) Does the length-normalised score get
# back the gold of the unbiased proxy?
#
# *My prediction:* 

# %% nbgrader={"grade": false, "grade_id": "experiment_length", "locked": true, "schema_version": 3, "solution": false, "task": false}
lengths = sq.length_bias.response_lengths(task)
biased = sq.length_bias.with_length_bonus(task, 1.0)
scores = {"proxy": task.arrays.score,
          "proxy + 1 per token": biased.arrays.score,
          "length-normalised": length_normalised_score(biased.arrays.score, lengths, task.arrays.ref_resp_logp)}
length_betas = np.array([2.0, 1.0, 0.5, 0.2, 0.1, 0.05])
length_rows = {name: [sq.length_bias.length_summary(
    task, sq.exact.optimal_logp(task.arrays.ref_resp_logp, jnp.asarray(s, jnp.float32), float(b)))
    for b in length_betas] for name, s in scores.items()}
print("reference:", {k: round(v, 3) for k, v in sq.length_bias.length_summary(task, task.arrays.ref_resp_logp).items()})
print(f"{'optimum of':22s}{'beta':>6s}{'length':>8s}{'gold':>8s}{'KL (nats)':>11s}")
for name, rows in length_rows.items():
    for b, r in zip(length_betas, rows):
        print(f"{name:22s}{b:6.2f}{r['length']:8.2f}{r['gold']:8.3f}{r['kl']:11.2f}")

# %% nbgrader={"grade": false, "grade_id": "length_plot", "locked": true, "schema_version": 3, "solution": false, "task": false}
fig, (ax_len, ax_gold) = plt.subplots(1, 2, figsize=(9, 3.5))
for name, rows in length_rows.items():
    ax_len.semilogx(length_betas, [r["length"] for r in rows], "o-", label=name)
    ax_gold.semilogx(length_betas, [r["gold"] for r in rows], "o-", label=name)
ax_len.axhline(sq.length_bias.length_summary(task, task.arrays.ref_resp_logp)["length"], color="k",
               linestyle="--", label="reference")
ax_len.set_xlabel("beta (reward units per nat, log scale)")
ax_len.set_ylabel("exact mean length (content tokens)")
ax_len.set_title("How long the optimum's responses are")
ax_len.legend(fontsize="small")
ax_gold.set_xlabel("beta (reward units per nat, log scale)")
ax_gold.set_ylabel("exact expected gold (reward units)")
ax_gold.set_title("What the optimum is worth")
plt.show()

# %% [markdown] nbgrader={"grade": false, "grade_id": "length_reveal", "locked": true, "schema_version": 3, "solution": false, "task": false}
# **Reveal** (exact numbers from the table). (a) At beta 0.5 the biased optimum's responses are
# 5.16 content tokens long, against 3.25 for the unbiased one, and its gold falls from 0.073 to
# -0.518: the policy is paid for length and takes it, although the gold reward prefers shorter
# responses here. (b) A larger beta limits how far the policy moves, not which way: at beta 2 (KL
# 0.13 nats) the biased optimum is still longer than the reference (5.10 tokens) and 1.26 tokens
# longer than the unbiased optimum, with gold -1.100 against -0.584. (c) No. The length-normalised
# score removes the bonus whatever its size (its rows are the same for any bonus: try
# `with_length_bonus(task, 0.25)`), but it also removes the proxy's own preference for shorter
# responses, which was right: under the reference the score falls by 0.56 per content token (the
# gold by 0.39). At beta 0.5 its optimum's gold is -0.217: better than the biased proxy's -0.518,
# worse than the unbiased proxy's 0.073. With a bonus of 0.25 per token the normalised score is
# worse than leaving the bias alone (-0.217 against -0.028): length control pays only when the bias
# is larger than the length preference the reward model got right.

# %% [markdown] nbgrader={"grade": false, "grade_id": "length_ppo_intro", "locked": true, "schema_version": 3, "solution": false, "task": false}
# **Watch PPO exploit it.** The next cell trains PPO (200 iterations, beta 0.2) on the three reward
# models, the normalised one as `sq.length_bias.with_length_control(biased)` (the biased proxy with
# its length weight lowered by $c$), and evaluates each final policy exactly on the gold reward.
# It is skipped during autograding.

# %% nbgrader={"grade": false, "grade_id": "length_ppo_runs", "locked": true, "schema_version": 3, "solution": false, "task": false}
import os

if os.environ.get("NBGRADER_EXECUTION"):
    print("The length-bias PPO runs are skipped while autograding.")
else:
    length_tasks = {"proxy": task, "proxy + 1 per token": biased,
                    "length-normalised": sq.length_bias.with_length_control(biased)}
    print(f"{'PPO, beta 0.2, trained on':28s}{'length':>8s}{'gold':>8s}{'KL (nats)':>11s}")
    for name, t in length_tasks.items():
        final = sq.evaluate_policy(task, sq.train(t, SeqPPOConfig(beta=0.2)).policy_params, 0.2)
        print(f"{name:28s}{final['mean_length']:8.2f}{final['gold']:8.3f}{final['kl']:11.2f}")

# %% [markdown] nbgrader={"grade": false, "grade_id": "length_ppo_reveal", "locked": true, "schema_version": 3, "solution": false, "task": false}
# PPO follows its optimum (numbers from this machine). Trained on the biased proxy its responses
# grow from 3.90 to 5.00 content tokens and its gold falls from 0.087 to -0.195; trained on the
# length-normalised reward model it ends at 4.96 tokens and gold -0.202. At beta 0.2 the two are
# within 0.03 of each other, as their exact optima are (-0.170 and -0.142 in the table): at this
# beta the normalisation buys nothing back.

# %% [markdown] nbgrader={"grade": false, "grade_id": "analysis_seq", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ## 9. Analysis (graded by hand)

# %% [markdown] nbgrader={"grade": false, "grade_id": "seq_analysis_q1", "locked": true, "schema_version": 3, "solution": false, "task": false}
# **Q1.** Use your over-optimisation plot, the fits and the table of gold terms. Where does the gold
# reward of $\pi^*_\beta$ peak, and what do the two fitted forms say about that peak? Which terms of the
# gold reward make it rise up to the peak, and which make it fall past it while the proxy keeps rising
# (say what the proxy can and cannot see)? Name one way to stop training near the peak without access
# to the gold reward. (3 points)

# %% [markdown] nbgrader={"grade": true, "grade_id": "seq_analysis_a1", "locked": false, "points": 3, "schema_version": 3, "solution": true, "task": false}
# ### BEGIN SOLUTION
# **Model answer.** The gold reward of the optimum rises from -1.14 (the reference) to a peak of 0.16
# at d = sqrt(KL) of about 1.25 (beta near 0.3) and then falls, to -1.61 at d = 3.8 (beta 0.02), while
# the proxy rises monotonically (from 0 to 2.40). The RL form d (alpha - b log d), fitted to this
# curve, puts its peak at d = 1.18, close to the observed 1.25 on a coarse grid of betas; the
# best-of-n form alpha d - b d^2 belongs to best-of-n (there it puts the peak at 1.61 against an
# observed 1.58), and fitted to pi*_beta it would say 1.64, which is not close. The gold terms say why.
# Up to the peak the gold reward gains 1.30, of which 0.57 is the missing-EOS term (the optimum learns
# to end its responses: the truncated share falls from 0.58 to 0.001), 0.35 the length term, 0.25 the
# bigram and 0.12 the target. Past the peak the bigram term keeps improving (from -0.09 to 0), so the
# bigram is not what lowers the gold reward; the target term falls by 1.55 (about 4 copies of the
# target instead of 1.5, where the gold's diminishing returns turn into penalties) and the length term
# by 0.32 (responses grow to 5 content tokens against preferred lengths of 2 to 4). The proxy is linear
# in token counts, length and has-EOS: it sees EOS, so the early gain is real, but it pays for every
# further copy of the target and for length at a constant rate and cannot see the curvature the gold
# reward puts on both (it cannot see token order either, but the bigram disappears by itself as the
# responses fill up with the target). Stopping near the peak: a larger beta or an adaptive KL
# controller with a KL budget, early stopping on a held-out set of human (gold) labels, or an
# ensemble/uncertainty-aware reward model.
#
# **Rubric (3 points).**
# - 1 point: gold rises then falls while the proxy keeps rising, with the peak read from the plot
#   (d about 1.25) or from the RL form's fit (about 1.2); calling the best-of-n form's 1.64 on pi*_beta
#   close to it does not earn the point.
# - 1 point: the cause of the fall taken from the gold terms: the target-count curvature (copies
#   beyond two) and length, which the linear proxy keeps paying for; the largest part of the rise up
#   to the peak is ending with EOS. Naming the forbidden bigram as the cause of the fall does not earn the point: its
#   term improves monotonically as beta falls.
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
# ## 10. Explorer (not graded)
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
