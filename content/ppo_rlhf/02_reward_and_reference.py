# ---
# jupyter:
#   kernelspec:
#     display_name: Python 3 (ipykernel)
#     language: python
#     name: python3
# ---

# %% [markdown] nbgrader={"grade": false, "grade_id": "intro_02", "locked": true, "schema_version": 3, "solution": false, "task": false}
# # Build step 2: fit and freeze the reward, snapshot the reference
#
# Before any policy update, two things are fixed for the whole run: the **reward model**
# (fitted once to preferences, then frozen) and the **reference policy** (a copy of the
# starting policy that the KL penalty compares against). Here you build both.
#
# This notebook uses the course library's `preference_loss`, so a slip in notebook 1 does
# not carry over.

# %% [markdown] nbgrader={"grade": false, "grade_id": "points_02", "locked": true, "schema_version": 3, "solution": false, "task": false}
# **Points.** This notebook: **6 points**. The whole assignment `ppo_rlhf` (four notebooks) is worth **50 points**: 44 autograded and 6 graded by hand.
#
# | graded cell | points | how |
# |---|---|---|
# | `test_fit_reward_lesson` | 2 | autograded |
# | `test_fit_reward_fresh` | 2 | autograded |
# | `test_reference_snapshot` | 2 | autograded |
#
# Run the notebook top to bottom after restarting the kernel. Visible tests help you; hidden tests on fresh random inputs decide the grade. Keep the first code cell as it is, and do not delete, move or edit the locked cells (the grader restores them); your own extra cells are fine anywhere, and a harmless line above the first cell (a `%matplotlib` magic, say) is only listed for the instructor, it costs nothing.

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
# **Predict** (not graded, but write it down *before* running the next cell):
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
# The reference policy is the starting policy, frozen. In JAX, arrays are immutable, but
# policy parameters often live in NumPy buffers that an optimiser updates **in place**
# (`theta -= lr * grad`). A reference that shares memory with those parameters would drift
# with them, and the KL penalty would quietly measure distance to the *current* policy.
#
# Write `snapshot_reference(policy_logits)`: return the reference log-probabilities
# `log_softmax(policy_logits)` as an independent NumPy array (float32), without modifying
# the argument.

# %% nbgrader={"grade": false, "grade_id": "snapshot_reference_answer", "locked": false, "schema_version": 3, "solution": true, "task": false}
def snapshot_reference(policy_logits):
    """Frozen reference log-probs: log_softmax(policy_logits) as an independent NumPy copy.

    policy_logits: [n_actions] (may be a NumPy array updated in place later).
    Returns [n_actions] float32 NumPy array that shares no memory with the argument.
    """
    ### BEGIN SOLUTION
    return np.array(jax.nn.log_softmax(jnp.asarray(policy_logits, jnp.float32)), dtype=np.float32, copy=True)
    ### END SOLUTION


# %% [markdown]
# **Predict** (not graded, but write it down *before* running the next cell):
# the next cell takes three in-place gradient-like steps on `theta` after the snapshot.
# Should `ref_logp` change? What would the KL to the reference read if it did?
#
# *My prediction:* 

# %% nbgrader={"grade": false, "grade_id": "reference_experiment", "locked": true, "schema_version": 3, "solution": false, "task": false}
theta = np.array([0.2, 0.0, -0.2], dtype=np.float32)
ref_logp = snapshot_reference(theta)
ref_before = ref_logp.copy()
for _ in range(3):
    theta += np.float32(0.3) * np.asarray(rewards)  # in-place updates of the policy parameters
print("policy logits after updates:", theta)
print("reference unchanged:", bool(np.array_equal(ref_logp, ref_before)), ref_logp)

# %% nbgrader={"grade": true, "grade_id": "test_reference_snapshot", "locked": true, "points": 2, "schema_version": 3, "solution": false, "task": false}
# test_reference_snapshot: the reference equals log_softmax of fresh logits, leaves them untouched, and does not move when they are updated in place
### BEGIN HIDDEN TESTS
grading.judge("test_reference_snapshot")
### END HIDDEN TESTS
assert np.array_equal(ref_logp, ref_before), (
    "the reference changed when theta was updated in place: return an independent copy")
np.testing.assert_allclose(ref_logp, jax.nn.log_softmax(jnp.array([0.2, 0.0, -0.2])), atol=1e-6,
                           err_msg="the reference is log_softmax of the initial logits [0.2, 0.0, -0.2]")
