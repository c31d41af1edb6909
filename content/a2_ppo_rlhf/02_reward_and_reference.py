# ---
# jupyter:
#   kernelspec:
#     display_name: Python 3 (ipykernel)
#     language: python
#     name: python3
# ---

# %% [markdown] nbgrader={"grade": false, "grade_id": "intro_02", "locked": true, "schema_version": 3, "solution": false, "task": false}
# # a2 · Build step 2: fit and freeze the reward, snapshot the reference
#
# Before any policy update, two things are fixed for the whole run: the **reward model**
# (fitted once to preferences, then frozen) and the **reference policy** (a copy of the
# starting policy that the KL penalty compares against). Here you build both.
#
# This notebook uses the course library's `preference_loss`, so a slip in notebook 1 does
# not carry over.
#
# * **You will be able to** fit a reward model to pairwise preferences by gradient descent and
#   freeze it, and take a reference snapshot that an in-place optimiser cannot move.
# * **Prerequisites:** notebook 1 (the preference loss); NumPy arrays and views.
# * **Expected time:** about 30 minutes.

# %% [markdown] nbgrader={"grade": false, "grade_id": "points_02", "locked": true, "schema_version": 3, "solution": false, "task": false}
# **Points.** This notebook: **6 points**. The whole assignment `a2_ppo_rlhf` (four notebooks) is worth **56 points**: 48 autograded and 8 graded by hand.
#
# | graded cell | points | how |
# |---|---|---|
# | **Task 2.1: `fit_reward_model`** (4 points) | | |
# | `test_fit_reward_lesson` | 2 | autograded |
# | `test_fit_reward_fresh` | 2 | autograded |
# | **Task 2.2: `snapshot_reference`** (2 points) | | |
# | `test_reference_snapshot` | 2 | autograded |
#
# Run the notebook top to bottom after restarting the kernel. Visible tests help you; hidden tests on fresh random inputs decide the grade. Validate's "Success! Your notebook passes all the tests." means the visible tests passed, not that you have full marks. Keep the first code cell as it is, and do not delete, move or edit the locked cells (the grader restores them); your own extra cells are fine anywhere, and a harmless line above the first cell (a `%matplotlib` magic, say) is only listed for the instructor, it costs nothing.

# %% nbgrader={"grade": false, "grade_id": "grading_start", "locked": true, "schema_version": 3, "solution": false, "task": false}
from rlhf_lab import grading
grading.start()

# %% nbgrader={"grade": false, "grade_id": "imports_02", "locked": true, "schema_version": 3, "solution": false, "task": false}
import jax
import jax.numpy as jnp
import numpy as np
import matplotlib.pyplot as plt
from rlhf_lab import preference_loss
from rlhf_lab.reward import LESSON_FEATURES, LESSON_CHOSEN, LESSON_REJECTED


# %% [markdown] nbgrader={"grade": false, "grade_id": "data_02", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ## 1. The preference data
#
# Each of the three actions has two features (rows of `LESSON_FEATURES`):
# action 0 is `[1, 0]`, action 1 is `[0, 1]`, action 2 is `[-1, -1]`. Labellers compared
# three pairs and preferred 0 over 1, 0 over 2, and 1 over 2 (`LESSON_CHOSEN`,
# `LESSON_REJECTED` hold the action indices).
#
# Fit $w$ by plain gradient descent from $w_0 = 0$:
# $w_{k+1} = w_k - \text{lr}\,\nabla L(w_k)$, using `preference_loss` on the chosen and
# rejected feature rows. The lesson uses 100 steps at learning rate 0.1. The per-action
# rewards are then `features @ w`, frozen with `jax.lax.stop_gradient`.
#
# ### Task 2.1: `fit_reward_model` (4 points)

# %% nbgrader={"grade": false, "grade_id": "fit_reward_answer", "locked": false, "schema_version": 3, "solution": true, "task": false}
def fit_reward_model(features, chosen_idx, rejected_idx, steps=100, learning_rate=0.1):
    """Fit a linear reward model to preference pairs by gradient descent, then freeze it.

    features: [n_actions, d]; chosen_idx, rejected_idx: [n_pairs] action indices.
    w starts at zeros(d); each step is w <- w - learning_rate * grad preference_loss(w).
    Returns (weights [d], rewards [n_actions] = features @ weights, frozen).
    """
    ### BEGIN SOLUTION
    features = jnp.asarray(features, jnp.float32)
    chosen = features[jnp.asarray(chosen_idx)]
    rejected = features[jnp.asarray(rejected_idx)]
    grad_fn = jax.jit(jax.grad(lambda w: preference_loss(w, chosen, rejected)))
    w = jnp.zeros(features.shape[1], jnp.float32)
    for _ in range(steps):
        w = w - learning_rate * grad_fn(w)
    return w, jax.lax.stop_gradient(features @ w)
    ### END SOLUTION


# %% [markdown]
# **Prediction** (not graded, but write it down *before* running the next cell):
# which action will get the highest reward, and which the lowest? Will action 1 end up
# closer to action 0 or to action 2?
#
# *My prediction:* 

# %% nbgrader={"grade": false, "grade_id": "fit_lesson_rewards", "locked": true, "schema_version": 3, "solution": false, "task": false}
reward_w, rewards = fit_reward_model(LESSON_FEATURES, LESSON_CHOSEN, LESSON_REJECTED)
print("reward weights:", np.asarray(reward_w))
print("frozen per-action rewards:", np.asarray(rewards))

# %% nbgrader={"grade": false, "grade_id": "plot_rewards", "locked": true, "schema_version": 3, "solution": false, "task": false}
fig, ax = plt.subplots(figsize=(5, 3))
ax.bar([f"action {a}" for a in range(len(rewards))], np.asarray(rewards), color="#1f77b4")
ax.axhline(0.0, color="black", linewidth=0.8)
ax.set_xlabel("action")
ax.set_ylabel("learned reward (reward-model score units)")
ax.set_title("Frozen rewards after 100 steps at lr 0.1")
plt.show()

# %% nbgrader={"grade": true, "grade_id": "test_fit_reward_lesson", "locked": true, "points": 2, "schema_version": 3, "solution": false, "task": false}
# test_fit_reward_lesson: 100 steps at lr 0.1 on the lesson's preferences give the recorded rewards [1.9811294, 0.327278, -2.3084073]
### BEGIN HIDDEN TESTS
grading.judge("test_fit_reward_lesson")
### END HIDDEN TESTS
np.testing.assert_allclose(np.asarray(rewards), [1.9811294, 0.327278, -2.3084073], atol=1e-5,
                           err_msg="the lesson's fitted rewards (100 steps, learning rate 0.1, w from 0)")

# %% nbgrader={"grade": true, "grade_id": "test_fit_reward_fresh", "locked": true, "points": 2, "schema_version": 3, "solution": false, "task": false}
# test_fit_reward_fresh: on fresh random preference data, steps and learning rate, weights and rewards match the reference fit
### BEGIN HIDDEN TESTS
grading.judge("test_fit_reward_fresh")
### END HIDDEN TESTS
_w, _r = fit_reward_model(np.eye(3, 2, dtype=np.float32), np.array([0]), np.array([1]), steps=1,
                          learning_rate=1.0)
np.testing.assert_allclose(np.asarray(_w), [0.5, -0.5], atol=1e-6,  # one step from w = 0
                           err_msg="one gradient step from w = 0: w <- w - learning_rate * grad")


# %% [markdown] nbgrader={"grade": false, "grade_id": "reference_02", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ## 2. Snapshot the reference
#
# The reference policy is the starting policy, frozen. JAX arrays are immutable, but many
# training loops keep the policy parameters in a NumPy buffer and update it **in place**
# (`theta += lr * grad`), as the given code below does. A "snapshot" that shares memory with
# that buffer moves with every step, and the KL penalty then measures the distance from the
# current policy to itself: zero, whatever the policy does.
#
# Sharing memory is easy to do by accident: `params` itself, `params[:]`, `params.view()`,
# `params.reshape(-1)` and `np.asarray(params)` all hand back the same buffer, and on the CPU
# even `jnp.asarray(params)` may reuse it.
#
# ### Task 2.2: `snapshot_reference` (2 points)
#
# Write `snapshot_reference(params)`: return the reference **parameters** (the logits, not
# log-probabilities; the KL code applies `log_softmax` itself) as a float32 NumPy array that
# shares no memory with `params`, without modifying `params`.

# %% nbgrader={"grade": false, "grade_id": "snapshot_reference_answer", "locked": false, "schema_version": 3, "solution": true, "task": false}
def snapshot_reference(params):
    """Frozen reference parameters: a float32 NumPy copy of the policy logits `params` ([n_actions]).

    `params` is a NumPy buffer the optimiser later updates in place; the returned array must keep the
    values `params` has now (it shares no memory with it). `params` itself is not modified.
    """
    ### BEGIN SOLUTION
    return np.array(params, dtype=np.float32, copy=True)
    ### END SOLUTION


# %% [markdown]
# **Prediction** (not graded, but write it down *before* running the next cell):
# the next cell takes three in-place gradient-ascent steps on `theta` after the snapshot and prints
# the exact KL to the reference after each. If the snapshot were the buffer itself, what would the
# three KL values be? With a real copy, should they grow or shrink?
#
# *My prediction:* 

# %% nbgrader={"grade": false, "grade_id": "reference_experiment", "locked": true, "schema_version": 3, "solution": false, "task": false}
def kl_to_reference(params, ref_params):
    """Exact KL(pi_theta || pi_ref) in nats, both policies given by their logits ([n_actions])."""
    logp = jax.nn.log_softmax(jnp.asarray(params))
    ref = jax.nn.log_softmax(jnp.asarray(ref_params))
    return float(jnp.sum(jnp.exp(logp) * (logp - ref)))


reward_grad = jax.jit(jax.grad(lambda z: jnp.sum(jax.nn.softmax(z) * rewards)))  # d E_pi[r] / d logits
theta = np.array([0.2, 0.0, -0.2], dtype=np.float32)   # the policy parameters: a NumPy buffer
ref_params = snapshot_reference(theta)
ref_before = np.array(ref_params, copy=True)
kl_after_steps = []
for step in range(3):
    theta += np.float32(0.5) * np.asarray(reward_grad(jnp.asarray(theta)))  # the optimiser's in-place step
    kl_after_steps.append(kl_to_reference(theta, ref_params))
    print(f"after step {step + 1}: theta = {theta}, KL to the reference = {kl_after_steps[-1]:.6f} nats")

# %% nbgrader={"grade": true, "grade_id": "test_reference_snapshot", "locked": true, "points": 2, "schema_version": 3, "solution": false, "task": false}
# test_reference_snapshot: on fresh NumPy parameters the snapshot holds their values, leaves them untouched, and does not move when the given optimiser updates them in place
### BEGIN HIDDEN TESTS
grading.judge("test_reference_snapshot")
### END HIDDEN TESTS
np.testing.assert_allclose(np.asarray(ref_before), [0.2, 0.0, -0.2], atol=1e-6,
                           err_msg="the snapshot holds the starting logits [0.2, 0.0, -0.2] (parameters, "
                                   "not log-probabilities)")
assert np.array_equal(np.asarray(ref_params), ref_before), (
    f"expected the reference to stay {ref_before} while theta was updated in place, got {np.asarray(ref_params)}: "
    "it shares memory with theta; return an independent copy")
np.testing.assert_allclose(kl_after_steps, [0.0357713, 0.1201184, 0.2235378], atol=1e-5,
                           err_msg="exact KL to the reference after each in-place step (all zeros means "
                                   "the reference moved with theta)")
