# ---
# jupyter:
#   kernelspec:
#     display_name: Python 3 (ipykernel)
#     language: python
#     name: python3
# ---

# %% [markdown] nbgrader={"grade": false, "grade_id": "intro_04", "locked": true, "schema_version": 3, "solution": false, "task": false}
# # a2 · Build step 4: make it yours
#
# Short experiments that probe the pieces you built: both clipping directions, why a
# baseline does not bias the gradient, KL at the reference, detaching behaviour
# information in a new setting, the analytic optimum of the regularised objective, how much a run
# moves when only its seed changes, and where PPO runs land against the exact reward-KL frontier.
# The trained run comes from the course library (`seed_style_train`, the lesson's loop),
# so this notebook does not depend on your earlier answers. The signed clip and the exact
# KL, graded twice already, are given here as the library's `clipped_surrogate(ratio,
# advantage, epsilon)` and `categorical_kl(logp, ref_logp)` (log-probabilities, the policy
# first).
#
# * **You will be able to** show by enumeration that a baseline changes the variance and not the
#   mean, batch the PPO loss over several prompts, compute the KL-regularised optimum in log space
#   and explain what it bounds, put a 95% interval over seeds on a run's numbers before comparing
#   settings, place PPO runs against the exact reward-KL frontier, and diagnose a broken run from
#   its symptoms.
# * **Prerequisites:** notebooks 1 to 3.
# * **Expected time:** about 95 minutes.

# %% [markdown] nbgrader={"grade": false, "grade_id": "points_04", "locked": true, "schema_version": 3, "solution": false, "task": false}
# **Points.** This notebook: **22 points**. The whole assignment `a2_ppo_rlhf` (four notebooks) is worth **56 points**: 48 autograded and 8 graded by hand.
#
# | graded cell | points | how |
# |---|---|---|
# | **Task 4.1: `score_terms`** (2 points) | | |
# | `test_score_terms` | 2 | autograded |
# | **Task 4.2: `multi_prompt_ppo_loss`** (4 points) | | |
# | `test_transfer_value` | 2 | autograded |
# | `test_transfer_detached` | 2 | autograded |
# | **Task 4.3: `analytic_optimum`** (2 points) | | |
# | `test_optimum_log_space` | 2 | autograded |
# | **Task 4.4: `regularised_objective`** (2 points) | | |
# | `test_optimum_bound` | 2 | autograded |
# | **Task 4.5: `seed_interval`** (2 points) | | |
# | `test_seed_interval` | 2 | autograded |
# | **Task 4.6: `optimum_frontier`** (2 points) | | |
# | `test_optimum_frontier` | 2 | autograded |
# | **Task 4.7: runs against the frontier** (2 points) | | |
# | `frontier_answer` | 2 | graded by hand |
# | **Task 4.8: diagnose the result** (2 points) | | |
# | `diagnose_answer` | 2 | graded by hand |
# | **Task 4.9: the four lifetimes** (2 points) | | |
# | `understanding_a1` | 2 | graded by hand |
# | **Task 4.10: the signed minimum and the optimum** (2 points) | | |
# | `understanding_a2` | 2 | graded by hand |
#
# Run the notebook top to bottom after restarting the kernel. Visible tests help you; hidden tests on fresh random inputs decide the grade. Validate's "Success! Your notebook passes all the tests." means the visible tests passed, not that you have full marks. Keep the first code cell as it is, and do not delete, move or edit the locked cells (the grader restores them); your own extra cells are fine anywhere, and a harmless line above the first cell (a `%matplotlib` magic, say) is only listed for the instructor, it costs nothing.

# %% nbgrader={"grade": false, "grade_id": "grading_start", "locked": true, "schema_version": 3, "solution": false, "task": false}
from rlhf_lab import grading
grading.start()

# %% nbgrader={"grade": false, "grade_id": "imports_04", "locked": true, "schema_version": 3, "solution": false, "task": false}
import jax
import jax.numpy as jnp
import numpy as np
import matplotlib.pyplot as plt
from scipy import stats
from rlhf_lab import PPOConfig, categorical_kl, clipped_surrogate, lesson_rewards, sweep_grid, sweep_seeds
from rlhf_lab.lesson import seed_style_train

rewards = lesson_rewards()                                      # frozen rewards, [3]
lesson_run = seed_style_train()                                 # the library's run of the lesson loop
ref_logp = jax.nn.log_softmax(jnp.array([0.2, 0.0, -0.2]))      # fixed reference, [3]
final_logp = jax.nn.log_softmax(lesson_run["final_logits"])     # trained policy, [3]

# %% [markdown] nbgrader={"grade": false, "grade_id": "clip_04", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ## 1. Both clipping directions (not graded)
#
# The library's `clipped_surrogate(ratios, advantages, epsilon)` returns the per-sample terms
# $\min(\rho A, \operatorname{clip}(\rho, 1-\epsilon, 1+\epsilon)A)$ you wrote in notebook 1.

# %% [markdown]
# **Prediction** (not graded, but write it down *before* running the next cell):
# for $(\rho, A) = (1.5, 2)$ the unclipped product is 3. For $(0.5, -2)$ it is $-1$. What
# will the two clipped terms be, and why does the *negative* advantage pick the more
# negative product?
#
# *My prediction:* 

# %% nbgrader={"grade": false, "grade_id": "experiment_clip_04", "locked": true, "schema_version": 3, "solution": false, "task": false}
terms = clipped_surrogate(np.array([1.5, 0.5]), np.array([2.0, -2.0]), 0.2)
print("Clipped surrogate terms for (1.5, 2) and (0.5, -2):", np.asarray(terms))


# %% [markdown] nbgrader={"grade": false, "grade_id": "baseline_04", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ## 2. The baseline cancels, exactly
#
# The score-function gradient of the expected reward can use any constant baseline $c$:
#
# $$\nabla_\theta \sum_a \pi(a) r(a) = \sum_a \pi(a)\,\nabla_\theta\log\pi(a)\,\big(r(a) - c\big),$$
#
# because $\sum_a \pi(a)\nabla_\theta\log\pi(a) = \nabla_\theta \sum_a \pi(a) = 0$. With three actions
# we can enumerate the sum instead of trusting a noisy sample.
#
# Write `score_terms(logits, rewards, baseline)` returning the `[n_actions, n_params]`
# matrix whose row $a$ is $\pi(a)\,(r(a) - c)\,\nabla_\theta\log\pi(a)$ (hint:
# `jax.jacrev(jax.nn.log_softmax)(logits)` has row $a$ equal to $\nabla_\theta\log\pi(a)$).
# The enumerated gradient is the sum of the rows.
#
# ### Task 4.1: `score_terms` (2 points)

# %% [markdown]
# **Prediction** (not graded, but write it down *before* running the next cell):
# as the baseline c moves from -3 to 3, will the enumerated gradient (sum of rows) change?
# Will the variance of a one-sample estimate change?
#
# *My prediction:* 

# %% nbgrader={"grade": false, "grade_id": "score_terms_answer", "locked": false, "schema_version": 3, "solution": true, "task": false}
def score_terms(logits, rewards, baseline):
    """Rows pi(a) (r(a) - c) grad_theta log pi(a) for every action a: shape [n_actions, n_params]."""
    ### BEGIN SOLUTION
    probs = jax.nn.softmax(logits)
    score = jax.jacrev(jax.nn.log_softmax)(logits)
    return probs[:, None] * (rewards - baseline)[:, None] * score
    ### END SOLUTION


# %% nbgrader={"grade": false, "grade_id": "experiment_baseline", "locked": true, "schema_version": 3, "solution": false, "task": false}
probe = jnp.array([0.3, -0.2, 0.1])
probe_probs = np.asarray(jax.nn.softmax(probe))
exact = np.asarray(jax.grad(lambda z: jnp.sum(jax.nn.softmax(z) * rewards))(probe))
baselines = np.linspace(-3.0, 3.0, 13)
rows = [np.asarray(score_terms(probe, rewards, c)) for c in baselines]
enumerated = np.array([r.sum(axis=0) for r in rows])
# variance of the one-sample estimate g(a) = grad log pi(a) (r(a) - c), a ~ pi, summed over components
variance = np.array([np.sum(r**2 / probe_probs[:, None]) - np.sum(r.sum(axis=0) ** 2) for r in rows])
print("largest |enumerated - exact| over all baselines:", np.abs(enumerated - exact).max())

fig, (ax_g, ax_v) = plt.subplots(1, 2, figsize=(11, 3.5))
for j in range(3):
    ax_g.plot(baselines, enumerated[:, j], label=f"enumerated, logit {j}")
    ax_g.axhline(exact[j], color="black", linestyle=":", linewidth=0.8)
ax_g.set_xlabel("baseline c (reward-model score units)")
ax_g.set_ylabel("gradient component (score units per logit unit)")
ax_g.set_title("Enumerated gradient vs c (dotted: exact)")
ax_g.legend(fontsize="small")
ax_v.plot(baselines, variance, color="#d62728")
ax_v.axvline(float(jnp.sum(jax.nn.softmax(probe) * rewards)), color="grey", linestyle="--",
             label="c = expected reward")
ax_v.set_xlabel("baseline c (reward-model score units)")
ax_v.set_ylabel("variance of one-sample estimate (score units per logit unit)²")
ax_v.set_title("The baseline changes the variance, not the mean")
ax_v.legend(fontsize="small")
plt.show()

# %% nbgrader={"grade": true, "grade_id": "test_score_terms", "locked": true, "points": 2, "schema_version": 3, "solution": false, "task": false}
# test_score_terms: for fresh logits, rewards and several baselines the rows equal pi(a)(r(a)-c)(e_a - pi) and sum to the exact reward gradient
### BEGIN HIDDEN TESTS
grading.judge("test_score_terms")
### END HIDDEN TESTS
np.testing.assert_allclose(enumerated, np.tile(exact, (len(baselines), 1)), atol=1e-6,
                           err_msg="for every baseline c the summed score terms must equal the exact "
                                   "reward gradient (a baseline changes the variance, not the mean)")

# %% [markdown] nbgrader={"grade": false, "grade_id": "batch_baseline_intro_04", "locked": true, "schema_version": 3, "solution": false, "task": false}
# A constant $c$, $c = 0$ (no baseline) included, leaves the mean exactly where it is. A baseline
# computed from the batch is not a constant: with $B$ samples and $b_i$ the batch's mean reward, each
# sample's own reward is part of its baseline. The next cell enumerates every batch of $B$ actions
# drawn from the probe policy, weighted by its probability (no sampling), and compares the expected
# batch gradient $\frac1B\sum_i \nabla\log\pi(a_i)\,(r(a_i) - b_i)$ with the exact gradient, for the
# batch mean with and without the sample itself.

# %% nbgrader={"grade": false, "grade_id": "batch_baseline_04", "locked": true, "schema_version": 3, "solution": false, "task": false}
import itertools


@jax.jit
def batch_gradient(actions, baseline):
    """(1/B) sum_i grad log pi(a_i) (r(a_i) - baseline_i) at the probe logits, the baseline held fixed."""
    advantage = rewards[actions] - baseline
    return jax.grad(lambda z: jnp.mean(jax.nn.log_softmax(z)[actions] * advantage))(probe)


print("batch size B | E[batch gradient] / exact gradient, per logit   | 1 - 1/B")
for B in (2, 3, 4):
    batches = np.array(list(itertools.product(range(3), repeat=B)))        # all 3**B batches
    weights = np.prod(probe_probs[batches], axis=1)                           # their probabilities
    r_batch = np.asarray(rewards)[batches]
    with_self = np.repeat(r_batch.mean(axis=1, keepdims=True), B, axis=1)
    leave_out = (r_batch.sum(axis=1, keepdims=True) - r_batch) / (B - 1)
    for name, baseline in (("mean with itself", with_self), ("mean of the others", leave_out)):
        mean_grad = sum(w * np.asarray(batch_gradient(a, b)) for w, a, b in zip(weights, batches, baseline))
        print(f"{B:12d} | {name:18s}: {' '.join(f'{x:.4f}' for x in mean_grad / exact)}  | {1 - 1 / B:.4f}")

# %% [markdown] nbgrader={"grade": false, "grade_id": "batch_baseline_read_04", "locked": true, "schema_version": 3, "solution": false, "task": false}
# **Reading the table.** With the sample in its own baseline the expected gradient is the exact one
# times $1 - 1/B$ (0.5000, 0.6667, 0.7500 for $B$ = 2, 3, 4): the direction is right, the step too short,
# a bias that fades as the batch grows. The reason: $b_i$ contains $r(a_i)/B$, and
# $\mathbb E[\nabla\log\pi(a_i)\,r(a_i)]/B$ is $1/B$ of the gradient. The mean of the other samples
# (RLOO's baseline) does not depend on $a_i$, so it is unbiased (1.0000), like a constant $c$ or no
# baseline at all; those differ only in variance.

# %% [markdown] nbgrader={"grade": false, "grade_id": "kl_04", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ## 3. KL at the reference (not graded)
#
# The library's `categorical_kl(logp, ref_logp)` is the exact $\sum_a \pi(a)(\log\pi(a) - \log\pi_{\text{ref}}(a))$
# from log-probabilities, in nats.

# %% [markdown]
# **Prediction** (not graded, but write it down *before* running the next cell):
# is `zero_kl` exactly 0.0, or only approximately? Is `final_kl` larger, and roughly how
# large (the lesson printed the final KL earlier)?
#
# *My prediction:* 

# %% nbgrader={"grade": false, "grade_id": "kl_values_04", "locked": true, "schema_version": 3, "solution": false, "task": false}
zero_kl = float(categorical_kl(ref_logp, ref_logp))      # the reference against itself
final_kl = float(categorical_kl(final_logp, ref_logp))    # the trained policy against the reference
print("Reference/final KL (nats):", zero_kl, final_kl)
print("exactly zero at the reference:", zero_kl == 0.0)

# %% [markdown] nbgrader={"grade": false, "grade_id": "transfer_04", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ## 4. Transfer: several prompts, detached behaviour information
#
# Real RLHF batches hold many prompts. Write `multi_prompt_ppo_loss(logits, old_logp,
# actions, advantages, ref_logp, beta, epsilon)` for `P` prompts at once: `logits` and
# `ref_logp` are `[P, n]`, `old_logp`, `actions` and `advantages` are `[P, B]` (action
# `actions[p, i]` was sampled for prompt `p`). The loss is minus the signed clipped
# surrogate averaged over all `P * B` samples, plus `beta` times the exact KL averaged over
# prompts. You may use `clipped_surrogate` and `categorical_kl` (not the library's `ppo_loss`):
# what this task asks for is the gathering per prompt, the averaging, and keeping `old_logp` and
# `advantages` constants. The cell after your answer takes the gradients of *your* loss with
# respect to them on the given batch (the hidden test does the same on fresh prompts).
#
# ### Task 4.2: `multi_prompt_ppo_loss` (4 points)

# %% nbgrader={"grade": false, "grade_id": "transfer_batch", "locked": true, "schema_version": 3, "solution": false, "task": false}
# P = 4 prompts that share the lesson's three actions; B = 8 sampled actions per prompt
_rng = np.random.default_rng(5)
P, B = 4, 8
batch_ref = np.tile(np.asarray(ref_logp), (P, 1))                                      # [P, 3]
batch_logits = np.asarray(lesson_run["final_logits"]) + 0.1 * _rng.normal(size=(P, 3))  # [P, 3]
batch_actions = np.stack([_rng.choice(3, size=B, p=np.exp(row)) for row in batch_ref])  # [P, B]
batch_old = np.take_along_axis(batch_ref, batch_actions, axis=1)                       # [P, B]
batch_adv = np.asarray(rewards)[batch_actions] - np.exp(batch_ref) @ np.asarray(rewards)[:, None]


# %% nbgrader={"grade": false, "grade_id": "multi_prompt_loss_answer", "locked": false, "schema_version": 3, "solution": true, "task": false}
def multi_prompt_ppo_loss(logits, old_logp, actions, advantages, ref_logp, beta, epsilon):
    """PPO loss for P prompts: -mean over P*B samples of the signed clipped term + beta * mean_p KL_p.

    logits, ref_logp: [P, n]; old_logp, actions, advantages: [P, B]. Returns a scalar.
    """
    ### BEGIN SOLUTION
    logp = jax.nn.log_softmax(logits, axis=-1)
    old_logp = jax.lax.stop_gradient(old_logp)
    advantages = jax.lax.stop_gradient(advantages)
    ref_logp = jax.lax.stop_gradient(ref_logp)
    ratio = jnp.exp(jnp.take_along_axis(logp, actions, axis=1) - old_logp)
    clipped = jnp.clip(ratio, 1.0 - epsilon, 1.0 + epsilon)
    surrogate = jnp.mean(jnp.minimum(ratio * advantages, clipped * advantages))
    kl = jnp.mean(jnp.sum(jnp.exp(logp) * (logp - ref_logp), axis=-1))
    return -surrogate + beta * kl
    ### END SOLUTION


# %% nbgrader={"grade": false, "grade_id": "behaviour_grads", "locked": true, "schema_version": 3, "solution": false, "task": false}
# given: the gradients of YOUR loss w.r.t. old_logp and advantages on the batch above
# (beta = epsilon = 0.2); both must be exactly zero
old_grad, adv_grad = jax.grad(multi_prompt_ppo_loss, argnums=(1, 3))(
    batch_logits, batch_old, batch_actions, batch_adv, batch_ref, 0.2, 0.2)
print("Behaviour log probs and advantages detached:", not np.any(old_grad), not np.any(adv_grad))

# %% nbgrader={"grade": true, "grade_id": "test_transfer_value", "locked": true, "points": 2, "schema_version": 3, "solution": false, "task": false}
# test_transfer_value: on fresh prompts the loss and its gradient w.r.t. logits equal the single-prompt reference loss averaged over prompts
### BEGIN HIDDEN TESTS
grading.judge("test_transfer_value")
### END HIDDEN TESTS
assert np.shape(multi_prompt_ppo_loss(batch_logits, batch_old, batch_actions, batch_adv, batch_ref,
                                      0.2, 0.2)) == (), "the loss must be one number (a scalar)"

# %% nbgrader={"grade": true, "grade_id": "test_transfer_detached", "locked": true, "points": 2, "schema_version": 3, "solution": false, "task": false}
# test_transfer_detached: gradients of your several-prompt loss w.r.t. old_logp and advantages are exactly zero on fresh inputs
### BEGIN HIDDEN TESTS
grading.judge("test_transfer_detached")
### END HIDDEN TESTS
assert not np.any(adv_grad), "gradient flows into advantages: wrap them in stop_gradient"
assert not np.any(old_grad), "gradient flows into old_logp: wrap the behaviour log probs in stop_gradient"


# %% [markdown] nbgrader={"grade": false, "grade_id": "optimum_04", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ## 5. Challenge: the analytic optimum bounds the regularised objective
#
# For a finite action set, the policy maximising $J(\pi) = \mathbb E_\pi[r] - \beta\,\mathrm{KL}(\pi\Vert\pi_{\text{ref}})$
# is $\pi^*(a) \propto \pi_{\text{ref}}(a)\,e^{r(a)/\beta}$. Computing $e^{r/\beta}$ directly overflows
# for small $\beta$ (try $\beta = 10^{-3}$). Work in log space instead: $\log\pi^*(a)$ differs from
# $\log\pi_{\text{ref}}(a) + r(a)/\beta$ only by a constant that makes the probabilities sum to one.
#
# Write `analytic_optimum(ref_logp, rewards, beta)` (log-probabilities, computed in log space)
# and `regularised_objective(logp, rewards, ref_logp, beta)`, then evaluate $J$ for the
# reference, the trained policy and the optimum at $\beta = 0.2$.
#
# ### Task 4.3: `analytic_optimum` (2 points)
#
# ### Task 4.4: `regularised_objective` and the three values (2 points)

# %% [markdown]
# **Prediction** (not graded, but write it down *before* running the next cell):
# order the three objective values (reference, trained, optimum). Should forty sampled PPO
# rollouts reach the optimum exactly? Why or why not?
#
# *My prediction:* 

# %% nbgrader={"grade": false, "grade_id": "analytic_optimum_answer", "locked": false, "schema_version": 3, "solution": true, "task": false}
def analytic_optimum(ref_logp, rewards, beta):
    """log pi*(a) = log_softmax(ref_logp + rewards / beta), computed in log space. Shapes [n]."""
    ### BEGIN SOLUTION
    return jax.nn.log_softmax(jnp.asarray(ref_logp) + jnp.asarray(rewards) / beta)
    ### END SOLUTION


# %% nbgrader={"grade": false, "grade_id": "regularised_objective_answer", "locked": false, "schema_version": 3, "solution": true, "task": false}
def regularised_objective(logp, rewards, ref_logp, beta):
    """J(pi) = sum_a pi(a) r(a) - beta * KL(pi || pi_ref), from log-probabilities. Returns a scalar."""
    ### BEGIN SOLUTION
    probs = jnp.exp(logp)
    return jnp.sum(probs * rewards) - beta * jnp.sum(probs * (logp - ref_logp))
    ### END SOLUTION


# %% nbgrader={"grade": false, "grade_id": "objective_values_answer", "locked": false, "schema_version": 3, "solution": true, "task": false}
# define optimum_logp and the floats objective_reference, objective_trained, objective_optimum (beta = 0.2)
### BEGIN SOLUTION
optimum_logp = analytic_optimum(ref_logp, rewards, 0.2)
objective_reference = float(regularised_objective(ref_logp, rewards, ref_logp, 0.2))
objective_trained = float(regularised_objective(final_logp, rewards, ref_logp, 0.2))
objective_optimum = float(regularised_objective(optimum_logp, rewards, ref_logp, 0.2))
### END SOLUTION
print("Regularised objective reference/trained/optimum:", objective_reference, objective_trained,
      objective_optimum)

# %% nbgrader={"grade": true, "grade_id": "test_optimum_log_space", "locked": true, "points": 2, "schema_version": 3, "solution": false, "task": false}
# test_optimum_log_space: analytic_optimum equals log_softmax(ref_logp + r/beta) on fresh inputs, including beta = 1e-3 where exp(r/beta) overflows
### BEGIN HIDDEN TESTS
grading.judge("test_optimum_log_space")
### END HIDDEN TESTS
assert bool(np.all(np.isfinite(np.asarray(analytic_optimum(ref_logp, rewards, 1e-3))))), (
    "NaN or inf for beta = 0.001: exp(r / beta) overflows; compute it in log space")

# %% nbgrader={"grade": true, "grade_id": "test_optimum_bound", "locked": true, "points": 2, "schema_version": 3, "solution": false, "task": false}
# test_optimum_bound: regularised_objective matches the reference; the optimum's objective is >= the trained, reference and random policies' (lesson values and fresh inputs with beta = 1e-3)
### BEGIN HIDDEN TESTS
grading.judge("test_optimum_bound")
### END HIDDEN TESTS
assert objective_optimum >= objective_trained - 1e-5 and objective_optimum >= objective_reference - 1e-5, (
    "the optimum's regularised objective must be >= the trained and the reference policy's")
# the lesson's recorded values: reference 0.28191882, trained 1.7620493, optimum 1.7987912
np.testing.assert_allclose([objective_reference, objective_trained, objective_optimum],
                           [0.28191882, 1.7620493, 1.7987912], atol=1e-5,
                           err_msg="regularised objective of the reference / trained / optimum policy (beta = 0.2)")
print("optimum bound: visible checks passed")


# %% [markdown] nbgrader={"grade": false, "grade_id": "seeds_04", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ## 6. How far apart are two seeds?
#
# Every run so far used one seed. Before you compare two values of β or ε (the frontier below, the
# explorer at the end), find out how much a run moves when *only* the seed changes: the batch
# samples differ, so the final policy differs. The library's `sweep_seeds(config, seeds)` trains one
# run per seed in a single compiled call (`vmap` over the PRNG keys); every field of its result gains
# a leading `[S]` axis.
#
# To summarise `n` final values (one per seed), use the 95% t-interval for their mean,
#
# $$\bar x \pm t_{0.975,\,n-1}\,\frac{s}{\sqrt n},\qquad s = \sqrt{\tfrac{1}{n-1}\textstyle\sum_i (x_i-\bar x)^2},$$
#
# with the quantile from `stats.t.ppf(0.975, n - 1)` (`scipy.stats`, imported above). With eight
# seeds that quantile is 2.36, not the normal 1.96.
#
# Write `seed_interval(values)` returning the three floats `(mean, low, high)` for a 1-D array of
# `n >= 2` values.
#
# ### Task 4.5: `seed_interval` (2 points)

# %% nbgrader={"grade": false, "grade_id": "seed_interval_answer", "locked": false, "schema_version": 3, "solution": true, "task": false}
def seed_interval(values):
    """95% t-interval of the mean of n values: (mean, mean - t s / sqrt(n), mean + t s / sqrt(n)).

    values: [n] floats (one per seed), n >= 2; s is the sample std (ddof=1), t = t_{0.975, n-1}.
    """
    ### BEGIN SOLUTION
    x = np.asarray(values, dtype=np.float64)
    n = x.shape[0]
    half = stats.t.ppf(0.975, n - 1) * x.std(ddof=1) / np.sqrt(n)
    return float(x.mean()), float(x.mean() - half), float(x.mean() + half)
    ### END SOLUTION


# %% nbgrader={"grade": true, "grade_id": "test_seed_interval", "locked": true, "points": 2, "schema_version": 3, "solution": false, "task": false}
# test_seed_interval: on fresh samples of 3 to 11 values, (mean, low, high) is mean -+ t_{0.975, n-1} s / sqrt(n) with the sample std
### BEGIN HIDDEN TESTS
grading.judge("test_seed_interval")
### END HIDDEN TESTS
# four values 1, 2, 3, 4: mean 2.5, s = 1.2910, t_{0.975, 3} = 3.1824, half-width 3.1824 * 1.2910 / 2 = 2.0543
np.testing.assert_allclose(np.asarray(seed_interval(np.array([1.0, 2.0, 3.0, 4.0])), dtype=np.float64),
                           [2.5, 0.44573974, 4.55426026], atol=1e-4,
                           err_msg="seed_interval([1, 2, 3, 4]): expected (mean, low, high) = "
                                   "(2.5, 0.4457, 4.5543)")
print("seed interval: visible check passed")

# %% [markdown]
# **Prediction** (not graded, but write it down *before* running the next cell):
# eight runs with β = 0.2 and ε = 0.2 differ only in their seed. How far apart will their final
# expected rewards be (0.001? 0.01? 0.1?), and is that more or less than the difference you would
# expect between ε = 0.1 and ε = 0.3?
#
# *My prediction:* 

# %% nbgrader={"grade": false, "grade_id": "seed_sweep_04", "locked": true, "schema_version": 3, "solution": false, "task": false}
# short runs (20 rollouts of 32 samples, 3 epochs) so that each sweep compiles once and runs in a moment
SHORT_SIZES = dict(iterations=20, batch_size=32, epochs=3)
SHORT = PPOConfig(**SHORT_SIZES)
seeds = np.arange(8)
settings = [(0.2, 0.1), (0.2, 0.2), (0.2, 0.3), (0.05, 0.2)]          # (beta, epsilon)
seed_finals = {}                                                      # (beta, epsilon) -> (rewards [8], kls [8])
for beta_s, eps_s in settings:
    runs = sweep_seeds(PPOConfig(**SHORT_SIZES, beta=beta_s, epsilon=eps_s), seeds, rewards)
    seed_finals[beta_s, eps_s] = (np.asarray(runs.reward[:, -1]), np.asarray(runs.kl[:, -1]))


def interval_of(values):
    """Your seed_interval(values) as three floats; NaNs and a note if it does not return three numbers."""
    try:
        m, lo, hi = (float(np.asarray(v)) for v in seed_interval(values))
    except Exception as err:  # a wrong answer must not stop the experiment
        print(f"seed_interval did not give three numbers ({type(err).__name__}: {err}); plotting NaN")
        m = lo = hi = float("nan")
    return m, lo, hi


for (beta_s, eps_s), (fin_r, fin_kl) in seed_finals.items():
    m_r, lo_r, hi_r = interval_of(fin_r)
    m_kl, lo_kl, hi_kl = interval_of(fin_kl)
    print(f"beta = {beta_s:<4} eps = {eps_s:<4} final reward {m_r:.4f} [{lo_r:.4f}, {hi_r:.4f}] "
          f"(min {fin_r.min():.4f}, max {fin_r.max():.4f});  final KL {m_kl:.4f} [{lo_kl:.4f}, {hi_kl:.4f}] nats")

# %% nbgrader={"grade": false, "grade_id": "seed_plot_04", "locked": true, "schema_version": 3, "solution": false, "task": false}
fig, (ax_r, ax_k) = plt.subplots(1, 2, figsize=(11, 3.5))
labels = [f"β={b}, ε={e}" for b, e in settings]
for ax, which, unit in ((ax_r, 0, "expected reward (reward units)"), (ax_k, 1, "KL(π‖π_ref) (nats)")):
    for k, key in enumerate(settings):
        vals = seed_finals[key][which]
        m, lo, hi = interval_of(vals)
        ax.fill_between([k - 0.25, k + 0.25], vals.min(), vals.max(), color="#9ecae1", alpha=0.5,
                        label="min-max over seeds" if k == 0 else None)
        ax.vlines(k, lo, hi, color="#08519c", linewidth=2, label="95% t-interval of the mean" if k == 0 else None)
        ax.plot(k, m, "o", color="#08519c", label="mean over seeds" if k == 0 else None)
        ax.plot(np.full(vals.shape, k), vals, ".", color="grey", markersize=4)
    ax.set_xticks(range(len(settings)), labels, fontsize="small")
    ax.set_xlabel("setting (β, ε), 8 seeds each")
    ax.set_ylabel(f"final {unit}")
    ax.legend(fontsize="small")
ax_r.set_title("Final reward over seeds")
ax_k.set_title("Final KL over seeds")
plt.show()


# %% [markdown] nbgrader={"grade": false, "grade_id": "frontier_04", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ## 7. The exact reward-KL frontier
#
# Each β has its optimum $\pi^*_\beta \propto \pi_{\text{ref}}\,e^{r/\beta}$ (Task 4.3), and each
# optimum is one point $\big(\mathrm{KL}(\pi^*_\beta\Vert\pi_{\text{ref}}),\ \mathbb E_{\pi^*_\beta}[r]\big)$.
# As β falls from very large to very small, the points run from the reference, $(0, \mathbb E_{\pi_{\text{ref}}}[r])$,
# to the best action, $(-\log\pi_{\text{ref}}(a_{\text{best}}),\ \max_a r(a))$. The curve is a frontier: $\pi^*_\beta$
# maximises $\mathbb E_\pi[r] - \beta\,\mathrm{KL}(\pi\Vert\pi_{\text{ref}})$ over *all* policies, so a policy
# with no more KL than $\pi^*_\beta$ cannot have more reward (that is the Lagrangian of "most reward
# at a given KL"). No run, however it is trained, can lie above it.
#
# Write `optimum_frontier(ref_logp, rewards, betas)` returning the pair `(kls, expected_rewards)`, two
# arrays of shape `[B]` for the `B` values in `betas`, from *your* `analytic_optimum`. For the KL use the
# library's `categorical_kl(logp, ref_logp)` (log-probabilities, the optimum first).
#
# ### Task 4.6: `optimum_frontier` (2 points)

# %% nbgrader={"grade": false, "grade_id": "optimum_frontier_answer", "locked": false, "schema_version": 3, "solution": true, "task": false}
def optimum_frontier(ref_logp, rewards, betas):
    """(KL(pi*_b || pi_ref), E_{pi*_b}[r]) for every b in betas, pi*_b = analytic_optimum(ref_logp, rewards, b).

    ref_logp, rewards: [n]; betas: [B] (each > 0). Returns two [B] arrays: nats, reward units.
    """
    ### BEGIN SOLUTION
    opt = jnp.stack([analytic_optimum(ref_logp, rewards, b) for b in np.asarray(betas)])   # [B, n]
    return categorical_kl(opt, ref_logp), jnp.sum(jnp.exp(opt) * rewards, axis=-1)
    ### END SOLUTION


# %% nbgrader={"grade": true, "grade_id": "test_optimum_frontier", "locked": true, "points": 2, "schema_version": 3, "solution": false, "task": false}
# test_optimum_frontier: on fresh references, rewards and beta grids the pair equals (KL(pi*_b || pi_ref), E_{pi*_b}[r]) per beta
### BEGIN HIDDEN TESTS
grading.judge("test_optimum_frontier")
### END HIDDEN TESTS
probe_kl, probe_r = (np.asarray(x, dtype=np.float64) for x in optimum_frontier(ref_logp, rewards, np.array([1e6, 0.2])))
# beta = 1e6: the reference itself (KL 0, the recorded initial reward 0.28191882); beta = 0.2: the optimum of section 5
np.testing.assert_allclose(probe_kl, [0.0, 0.90995699], atol=1e-5,
                           err_msg="KL(pi* || pi_ref) for beta = 1e6 and 0.2: expected [0, 0.90996] nats")
np.testing.assert_allclose(probe_r, [0.28191882, 1.98078251], atol=1e-5,
                           err_msg="E_pi*[r] for beta = 1e6 and 0.2: expected [0.28192, 1.98078]")
falling = np.asarray(optimum_frontier(ref_logp, rewards, np.array([2.0, 1.0, 0.5, 0.3]))[0], dtype=np.float64)
assert np.all(np.diff(falling) > 0), f"the KL must grow as beta falls (2, 1, 0.5, 0.3), got {falling}"
print("optimum frontier: visible checks passed")

# %% [markdown]
# **Prediction** (not graded, but write it down *before* running the next cell):
# the next cell trains a 5 × 3 grid of short runs (β from 0.05 to 1, ε from 0.1 to 0.3, one seed).
# Which runs will land closest to the frontier, and will each run land near the frontier point of
# its *own* β? Can any run land above the curve?
#
# *My prediction:* 

# %% nbgrader={"grade": false, "grade_id": "frontier_sweep_04", "locked": true, "schema_version": 3, "solution": false, "task": false}
grid_betas, grid_epsilons = np.array([0.05, 0.1, 0.2, 0.5, 1.0]), np.array([0.1, 0.2, 0.3])
grid = sweep_grid(SHORT, grid_betas, grid_epsilons, rewards)          # one compiled call, fields [5, 3]
run_kl, run_reward = np.asarray(grid.final_kl), np.asarray(grid.final_reward)
curve_kl, curve_reward = (np.asarray(x, dtype=np.float64)
                          for x in optimum_frontier(ref_logp, rewards, np.geomspace(50.0, 0.01, 80)))
own_kl, own_reward = (np.asarray(x, dtype=np.float64) for x in optimum_frontier(ref_logp, rewards, grid_betas))
# vertical gap: run reward minus the frontier's reward at the run's own KL (negative = below the curve)
gap = run_reward - np.interp(run_kl, curve_kl, curve_reward)
for i, b in enumerate(grid_betas):
    print(f"beta = {b:<4}: pi*_beta at KL {own_kl[i]:.3f} nats, reward {own_reward[i]:.3f}; runs (eps 0.1/0.2/0.3) "
          f"KL {np.round(run_kl[i], 3)}, gap to the curve {np.round(gap[i], 4)}")
print("largest gap (above the curve would be > 0):", float(gap.max()))

# %% nbgrader={"grade": false, "grade_id": "frontier_plot_04", "locked": true, "schema_version": 3, "solution": false, "task": false}
fig, ax = plt.subplots(figsize=(7, 4.5))
ax.plot(curve_kl, curve_reward, color="#d62728", label="frontier: π*_β for β from 50 to 0.01")
colours = plt.cm.viridis(np.linspace(0.0, 0.9, len(grid_betas)))
for i, b in enumerate(grid_betas):
    ax.plot(own_kl[i], own_reward[i], "*", color=colours[i], markersize=13, markeredgecolor="black",
            label=f"π*_β, β = {b}")
    for j, (e, marker) in enumerate(zip(grid_epsilons, "o^s")):
        ax.plot(run_kl[i, j], run_reward[i, j], marker, color=colours[i], markersize=6, markeredgecolor="black",
                label=f"PPO run, ε = {e}" if i == 0 else None)
ax.set_xlabel("KL(π‖π_ref) (nats)")
ax.set_ylabel("expected reward (reward units)")
ax.set_title("Final PPO runs of a β × ε sweep against the exact frontier")
ax.legend(fontsize="x-small", ncol=2, loc="lower right")
plt.show()

# %% [markdown] nbgrader={"grade": false, "grade_id": "frontier_question", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ### Task 4.7: runs against the frontier (2 points)
#
# Which runs of the grid sit close to the frontier, and does each run sit near the point $\pi^*_\beta$
# of its own β? Give two reasons why a run's final policy need not be $\pi^*_\beta$, and explain why
# no run (and no policy at all) can lie above the curve. Use the printed gaps and the intervals of
# section 6 to say which differences between runs you would trust.

# %% [markdown] nbgrader={"grade": true, "grade_id": "frontier_answer", "locked": false, "points": 2, "schema_version": 3, "solution": true, "task": false}
# ### BEGIN SOLUTION
# **Model answer.** Every run ends below the curve, by 0.01 to 0.035 reward units at its own KL
# (the printed gaps are all negative), and every run ends short of the point of its own β: at
# β ≤ 0.2 the optimum is almost the best action (KL about 0.91 nats) while the runs stop near 0.62
# to 0.68 nats; at β = 1 the runs (about 0.4 nats) are closest to the curve and to their own point
# (0.50 nats). A run's final policy is not $\pi^*_\beta$ because PPO takes finitely many steps (20
# rollouts here) with a finite learning rate, each from a sampled batch, so the path is noisy (the
# seed intervals of section 6) and unfinished; and clipping removes the incentive on samples past
# the band in the direction their advantage favours, which slows each rollout's step (the ε = 0.1
# runs lag most). No run lies above
# the curve: $\pi^*_\beta$ maximises $\mathbb E[r]-\beta\,\mathrm{KL}$ over all policies, so a policy with more
# reward at no more KL would have a larger objective than the maximiser, a contradiction; the
# frontier is the most reward at each KL (the Lagrangian of that constrained problem). Between
# ε = 0.2 and 0.3 the runs differ by less than the seed interval, so from one seed that difference
# is not a finding; ε = 0.1 against 0.3 at β = 0.2 is (the intervals do not overlap).
#
# **Rubric (2 points).**
# - 1 point: identifies which runs are near the frontier/their own β's point (large β near it; small
#   β short of it, at smaller KL) and gives at least two reasons a run is not $\pi^*_\beta$ (finite
#   iterations or learning rate, sampling noise of the batches, clipping).
# - 1 point: no point can lie above the frontier because $\pi^*_\beta$ maximises $\mathbb E[r]-\beta\,\mathrm{KL}$
#   (the Lagrangian: the most reward at a given KL); bonus remarks on seed noise are welcome but
#   not required.
# ### END SOLUTION

# %% [markdown] nbgrader={"grade": false, "grade_id": "diagnose_04", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ## 8. Diagnose the result
#
# ### Task 4.8: diagnose the result (2 points)

# %% [markdown] nbgrader={"grade": false, "grade_id": "diagnose_question", "locked": true, "schema_version": 3, "solution": false, "task": false}
# A classmate's run prints ratios that are exactly 1.0 on every inner step, a clip fraction
# (the share of a batch's samples whose ratio lies outside $[1-\varepsilon, 1+\varepsilon]$, CleanRL's
# `clipfrac`; the clip binds only on part of them) of 0 throughout, and a reward curve that still rises. In a second project the learned
# reward keeps rising while an independent human evaluation gets worse. For each case,
# say what you suspect and one concrete check you would run to confirm it (the clip fraction is defined in notebook 3, section 3).

# %% [markdown] nbgrader={"grade": true, "grade_id": "diagnose_answer", "locked": false, "points": 2, "schema_version": 3, "solution": true, "task": false}
# ### BEGIN SOLUTION
# **Model answer.** Ratios of exactly 1 on every inner step mean the behaviour log probs are recomputed from
# the current parameters after each step (or taken through the same parameters), so
# `old_logp` is not frozen at collection time. The update collapses to a plain
# policy-gradient step and clipping can never engage (both fractions of notebook 3, outside the band and
# where the clip binds, stay 0). Check: store `old_logp` when the
# batch is sampled and assert it is identical across all inner epochs; print the ratio
# after the second inner step, which must differ from 1. Reward rising while an
# independent evaluation falls suggests reward exploitation (over-optimising a weak reward
# model), not alignment: check the KL to the reference, inspect high-reward samples by
# hand, and evaluate on held-out human judgments with the reward model version fixed.
#
# **Rubric (2 points).**
# - 1 point: recomputed (not frozen) old log probs as the cause of ratio = 1, with a check
#   such as asserting `old_logp` is unchanged across inner epochs or that the ratio moves
#   off 1 after the first step.
# - 1 point: reward hacking / exploitation of the learned reward (not "training worked"),
#   with a check such as held-out human evaluation, inspecting top-reward samples, or
#   watching the KL to the reference.
# ### END SOLUTION

# %% [markdown] nbgrader={"grade": false, "grade_id": "understanding_04", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ## 9. Check your understanding

# %% [markdown] nbgrader={"grade": false, "grade_id": "understanding_q1", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ### Task 4.9: the four lifetimes (2 points)
#
# Name the four objects with different lifetimes in this lesson (current policy, old
# behaviour policy, reference policy, reward model) and say when each one changes. What goes
# wrong if the KL is measured against the old policy instead of the reference?

# %% [markdown] nbgrader={"grade": true, "grade_id": "understanding_a1", "locked": false, "points": 2, "schema_version": 3, "solution": true, "task": false}
# ### BEGIN SOLUTION
# **Model answer.** The current policy changes on every inner optimiser step. The old behaviour policy is a
# snapshot taken when a batch is sampled; its log probs (and the advantages) stay fixed
# while that batch is reused and refresh at the next rollout. The reference policy and the
# reward model are fixed for the whole run. If the KL is taken against the old policy, the
# anchor moves every rollout: the penalty only limits the step size and no longer keeps
# the policy near the reference, so the policy can drift arbitrarily far over many
# rollouts while the reported "KL" stays small.
#
# **Rubric (2 points).**
# - 1 point: all four lifetimes correct (current: each step; old: per rollout; reference
#   and reward: whole run).
# - 1 point: KL against the old policy removes the anchor to the reference (the penalty
#   becomes a per-rollout step-size limit, cumulative drift is unpenalised).
# ### END SOLUTION

# %% [markdown] nbgrader={"grade": false, "grade_id": "understanding_q2", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ### Task 4.10: the signed minimum and the optimum (2 points)
#
# Why must the minimum be taken over the products $\rho A$ and
# $\operatorname{clip}(\rho)A$ rather than over the ratios? And why does the analytic optimum
# bound the trained policy's regularised objective without implying that forty PPO rollouts
# reach it?

# %% [markdown] nbgrader={"grade": true, "grade_id": "understanding_a2", "locked": false, "points": 2, "schema_version": 3, "solution": true, "task": false}
# ### BEGIN SOLUTION
# **Model answer.** Multiplying by a negative advantage flips the order of the two products, so the minimum
# of the products picks the lower clip bound for $A < 0$ and the upper bound for $A > 0$;
# a minimum over ratios ignores the sign and, for negative advantages, removes the
# pessimistic term (the worked example gives $-1$ instead of $-1.6$). The optimum
# $\pi^* \propto \pi_{\text{ref}} e^{r/\beta}$ maximises $J$ over all policies, so no policy,
# trained or not, can exceed it; but PPO only takes finite, clipped steps on sampled
# batches, so after forty rollouts a gap remains (1.7620 vs 1.7988 here).
#
# **Rubric (2 points).**
# - 1 point: the sign of A reverses which product is smaller / which bound binds; a min over
#   ratios is wrong for negative advantages.
# - 1 point: the optimum is a global maximiser of J (an upper bound), while sampled, clipped,
#   finitely many updates need not reach it.
# ### END SOLUTION

# %% [markdown] nbgrader={"grade": false, "grade_id": "explorer_04", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ## 10. Play: the live explorer
#
# Move β and ε and watch reward, KL and the action probabilities respond. The explorer
# re-runs the compiled trainer for every slider value (it is not graded and is skipped
# while autograding).

# %% [markdown]
# **Prediction** (not graded, but write it down *before* running the next cell):
# if you lower β from 0.2 to 0.05, what happens to the final KL and the final reward? What
# about a much smaller ε?
#
# *My prediction:* 

# %% nbgrader={"grade": false, "grade_id": "explorer_cell", "locked": true, "schema_version": 3, "solution": false, "task": false}
import os

if os.environ.get("NBGRADER_EXECUTION"):
    print("The live explorer is skipped while autograding.")
else:
    try:
        from rlhf_lab.explorer import explore
    except ImportError as err:
        print(f"The live explorer is not available in this installation: {err}")
    else:
        try:
            explore()
        except Exception as err:  # the explorer is optional: never break the notebook
            print(f"The live explorer could not start: {type(err).__name__}: {err}")

# %% [markdown] nbgrader={"grade": false, "grade_id": "recap_04", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ## Recap
#
# * **Four lifetimes.** Current policy: every inner step. Old log-probabilities and advantages: once
#   per rollout. Reference and reward model: the whole run. Measuring the KL against the old policy
#   instead of the reference removes the anchor.
# * **The signed clip.** $\min(\rho A, \operatorname{clip}(\rho)A)$ over the products; it removes the
#   incentive on samples already past the band in the direction their advantage favours, and is
#   not a trust region: the β·KL term keeps its gradient when every surrogate term is clipped.
# * **Reward beside KL.** The optimum $\pi^* \propto \pi_{\text{ref}}e^{r/\beta}$ trades them exactly;
#   a run is judged by both numbers, never by the reward alone, and no run lies above the frontier
#   that the optimum traces as β varies.
# * **Seeds first.** A difference between two settings smaller than the interval over seeds is not
#   a finding.

# %% [markdown] nbgrader={"grade": false, "grade_id": "dpo_04", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ## From $\pi^*$ to DPO
#
# The optimum of section 5 can be read backwards: $\pi^*(a) = \pi_{\text{ref}}(a)\,e^{r(a)/\beta}/Z$ gives
# $r(a) = \beta\log\frac{\pi^*(a)}{\pi_{\text{ref}}(a)} + \beta\log Z$. Put this into the Bradley-Terry
# loss of notebook 1: $Z$ cancels in the margin between the chosen and the rejected response, so
# the preference loss can be written directly in terms of a policy,
# $\operatorname{softplus}\!\big(-\beta[\log\tfrac{\pi_\theta(y_w)}{\pi_{\text{ref}}(y_w)} -
# \log\tfrac{\pi_\theta(y_l)}{\pi_{\text{ref}}(y_l)}]\big)$. That is Direct Preference Optimisation: no
# reward model and no PPO loop, but the same regularised objective (`a3_ppo_sequences` fits it).

# %% [markdown] nbgrader={"grade": false, "grade_id": "limits_04", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ## What this bandit cannot show
#
# A language-model PPO run differs in ways three actions cannot show:
#
# * **Token masks.** A response is a sequence of tokens; padding must be masked out of every mean,
#   while the end-of-sequence token must be kept.
# * **Termination.** Responses end at different lengths, and the reward arrives only at the last
#   token, so credit has to travel back through the sequence.
# * **A value estimator.** The exact baseline $\sum_a \pi(a) r(a)$ used here cannot be summed over all
#   sequences; a learned critic and GAE estimate it, with their own bias and variance.
# * **Sampled KL.** The exact KL cannot be summed either; only estimators such as `k1` and `k3` are
#   available. `a3_ppo_sequences` covers all four.

# %% [markdown] nbgrader={"grade": false, "grade_id": "checklist_04", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ## Debugging checklist
#
# The hidden tests name these mistakes; check them in this order when a run looks wrong.
#
# 1. **Ratios exactly 1 after the first inner step, clip fraction 0:** `old_logp` is recomputed
#    inside the inner loop; compute it once per rollout.
# 2. **KL stays near 0 while the policy moves:** the KL is measured against the old policy, or the
#    reference shares memory with the parameters (a view, `np.asarray`); pass the fixed `ref_logp`,
#    and snapshot with a copy.
# 3. **Negative-advantage samples never bounded below:** the minimum was taken over the ratios;
#    take it over the products.
# 4. **Non-zero gradient with respect to `old_logp` or the advantages:** wrap them in `stop_gradient`.
# 5. **Gradient too short:** a batch-mean baseline that includes the sample itself, where the exact
#    one is asked, scales the expected gradient by $1 - 1/B$ (section 2 enumerates it). No baseline
#    is not biased: it leaves the mean unchanged (section 2, $c = 0$) and only raises the variance.
# 6. **Numbers equal to the printed ones, but wrong on fresh inputs:** values copied, not computed.
# 7. **NaN for a small β:** $e^{r/\beta}$ overflowed; work in log space.
#
# The ungraded notebook `a2b_ppo_debugging/find_the_bug.ipynb` hands you four of these as broken code to fix.

# %% [markdown] nbgrader={"grade": false, "grade_id": "reading_04", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ## Further reading
#
# * Schulman, Wolski, Dhariwal, Radford, Klimov (2017), *Proximal Policy Optimization Algorithms*: the
#   clipped surrogate.
# * OpenAI Spinning Up, *Proximal Policy Optimization*: a short derivation with pseudocode.
# * Huang et al. (2022), *The 37 Implementation Details of Proximal Policy Optimization* (ICLR blog
#   track): where clip fraction and `approx_kl` come from, and what implementations add.
# * Ziegler et al. (2019), *Fine-Tuning Language Models from Human Preferences*: the KL-penalised
#   reward in language models.
# * Ouyang et al. (2022), *Training language models to follow instructions with human feedback*: the
#   full RLHF pipeline.
# * Rafailov et al. (2023), *Direct Preference Optimization*: the loss above.
