# ---
# jupyter:
#   kernelspec:
#     display_name: Python 3 (ipykernel)
#     language: python
#     name: python3
# ---

# %% [markdown] nbgrader={"grade": false, "grade_id": "intro_03", "locked": true, "schema_version": 3, "solution": false, "task": false}
# # Build step 3: collect rollouts, reuse each batch, reach the recorded numbers
#
# One **rollout** samples a batch of actions from the current policy, freezes what the
# batch needs (the behaviour log-probabilities and the advantages), and then takes
# several inner gradient steps on that same batch. The next rollout samples a fresh batch
# from the updated policy. The reference and the reward never change.
#
# This notebook gives you the course library's `ppo_loss`, the lesson's frozen rewards and
# the reference logits, so earlier mistakes do not carry over.

# %% [markdown] nbgrader={"grade": false, "grade_id": "points_03", "locked": true, "schema_version": 3, "solution": false, "task": false}
# **Points.** This notebook: **12 points**. The whole assignment `ppo_rlhf` (four notebooks) is worth **50 points**: 44 autograded and 6 graded by hand.
#
# | graded cell | points | how |
# |---|---|---|
# | `test_rollout_update_fresh` | 3 | autograded |
# | `test_old_logp_frozen` | 2 | autograded |
# | `test_kl_against_reference` | 2 | autograded |
# | `test_loop` | 2 | autograded |
# | `test_recorded_numbers` | 3 | autograded |
#
# Run the notebook top to bottom after restarting the kernel. Visible tests help you; hidden tests on fresh random inputs decide the grade. Keep the first code cell as it is, and do not delete, move or edit the locked cells (the grader restores them); your own extra cells are fine anywhere, and a harmless line above the first cell (a `%matplotlib` magic, say) is only listed for the instructor, it costs nothing.

# %% nbgrader={"grade": false, "grade_id": "grading_start", "locked": true, "schema_version": 3, "solution": false, "task": false}
from rlhf_lab import grading
grading.start()

# %% nbgrader={"grade": false, "grade_id": "imports_03", "locked": true, "schema_version": 3, "solution": false, "task": false}
import jax
import jax.numpy as jnp
import numpy as np
import matplotlib.pyplot as plt
from types import SimpleNamespace
from rlhf_lab import categorical_kl, expected_reward, lesson_rewards, ppo_loss
from rlhf_lab.plots import three_panel_figure

rewards = lesson_rewards()                               # frozen reward model scores, [3]
init_logits = np.array([0.2, 0.0, -0.2], np.float32)    # starting policy = reference
ppo_step = jax.jit(jax.value_and_grad(ppo_loss))         # (loss, d loss / d logits), compiled once


# %% [markdown] nbgrader={"grade": false, "grade_id": "rollout_03", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ## 1. One rollout
#
# Write `rollout_update(logits, draw_key, rewards, ref_logp, *, batch_size, epochs, beta,
# epsilon, learning_rate)`:
#
# 1. `old_logp_all = log_softmax(logits)` is the behaviour policy of this batch;
# 2. sample `batch_size` actions with `jax.random.categorical(draw_key, old_logp_all, shape=(batch_size,))`;
# 3. freeze `old_logp = old_logp_all[actions]` and the advantages
#    $A_i = r(a_i) - \sum_a \pi_{\text{old}}(a)\,r(a)$ (the exact baseline);
# 4. take `epochs` steps `logits <- logits - learning_rate * grad` with
#    `_, grad = ppo_step(logits, old_logp, actions, advantages, ref_logp, beta, epsilon)`;
# 5. return the new logits.
#
# Nothing in steps 1 to 3 is recomputed inside the inner loop, and the KL is always
# measured against `ref_logp`. The given functions take log-probabilities, in this order:
# `ppo_step(logits, old_logp, actions, advantages, ref_logp, beta, epsilon)` returns
# `(loss, gradient w.r.t. logits)`; later you record `expected_reward(logp, rewards)` and
# `categorical_kl(logp, ref_logp)` (KL of the policy `logp` from the reference `ref_logp`).

# %% nbgrader={"grade": false, "grade_id": "rollout_update_answer", "locked": false, "schema_version": 3, "solution": true, "task": false}
def rollout_update(logits, draw_key, rewards, ref_logp, *, batch_size, epochs, beta, epsilon,
                   learning_rate):
    """One rollout: sample from the current policy, freeze old_logp and advantages, `epochs` steps.

    logits: [n] current policy; draw_key: PRNG key for this batch; rewards: [n] frozen;
    ref_logp: [n] fixed reference. Returns the updated logits [n].
    """
    ### BEGIN SOLUTION
    logits = jnp.asarray(logits, jnp.float32)
    old_logp_all = jax.nn.log_softmax(logits)
    actions = jax.random.categorical(draw_key, old_logp_all, shape=(batch_size,))
    old_logp = old_logp_all[actions]
    advantages = rewards[actions] - jnp.sum(jnp.exp(old_logp_all) * rewards)
    for _ in range(epochs):
        _, grad = ppo_step(logits, old_logp, actions, advantages, ref_logp, beta, epsilon)
        logits = logits - learning_rate * grad
    return logits
    ### END SOLUTION


# %% nbgrader={"grade": true, "grade_id": "test_rollout_update_fresh", "locked": true, "points": 3, "schema_version": 3, "solution": false, "task": false}
# test_rollout_update_fresh: on fresh random logits, rewards, reference and key, one rollout update equals the reference procedure
### BEGIN HIDDEN TESTS
grading.judge("test_rollout_update_fresh")
### END HIDDEN TESTS
# the lesson's batch (key 0, 32 samples, 2 inner steps, learning rate 0.15) has a known result
_new = np.asarray(rollout_update(jnp.asarray(init_logits), jax.random.key(0), rewards,
                                 jax.nn.log_softmax(jnp.asarray(init_logits)), batch_size=32, epochs=2, beta=0.2,
                                 epsilon=0.2, learning_rate=0.15))
assert np.shape(_new) == (3,), f"rollout_update must return the 3 updated logits, got shape {np.shape(_new)}"
assert not np.allclose(_new, [0.2998050, -0.0137663, -0.2860387], atol=1e-5), (
    "only one inner step was taken: reuse the batch for `epochs` inner steps")
np.testing.assert_allclose(_new, [0.3996920, -0.0324169, -0.3672751], atol=1e-5,
                           err_msg="logits after one rollout of the lesson's batch (key 0, 2 inner steps)")
print("rollout_update: visible checks passed")

# %% nbgrader={"grade": true, "grade_id": "test_old_logp_frozen", "locked": true, "points": 2, "schema_version": 3, "solution": false, "task": false}
# test_old_logp_frozen: starting at the reference with 3 inner steps: old log probs stay frozen across the inner steps (ratios move away from 1)
### BEGIN HIDDEN TESTS
grading.judge("test_old_logp_frozen")
### END HIDDEN TESTS
# 3 inner steps at learning rate 1.0: with old log probs frozen the ratio leaves 1 and the clip binds
_new = np.asarray(rollout_update(jnp.asarray(init_logits), jax.random.key(1), rewards,
                                 jax.nn.log_softmax(jnp.asarray(init_logits)), batch_size=32, epochs=3, beta=0.2,
                                 epsilon=0.2, learning_rate=1.0))
assert not np.allclose(_new, [2.1544976, -0.1512665, -2.0032310], atol=1e-4), (
    "ratios are always 1: old log probs recomputed after every inner step, so the clip never binds "
    "(compute old_logp once per rollout, before the inner loop)")
np.testing.assert_allclose(_new, [0.8618618, -0.0455531, -0.8163088], atol=1e-4,
                           err_msg="logits after 3 inner steps at learning rate 1.0 (key 1)")
print("frozen old log probs: visible checks passed")

# %% nbgrader={"grade": true, "grade_id": "test_kl_against_reference", "locked": true, "points": 2, "schema_version": 3, "solution": false, "task": false}
# test_kl_against_reference: with one inner step and a reference far from the policy, the KL term pulls towards ref_logp, not the old policy; the reference is unchanged
### BEGIN HIDDEN TESTS
grading.judge("test_kl_against_reference")
### END HIDDEN TESTS
# one inner step (frozen and recomputed old log probs agree) with a reference far from the policy:
# the KL term must pull towards ref_logp, not towards the old policy
_far_ref = jax.nn.log_softmax(jnp.array([-1.0, 0.5, 1.0]))
_new = np.asarray(rollout_update(jnp.asarray(init_logits), jax.random.key(2), rewards, _far_ref, batch_size=32,
                                 epochs=1, beta=0.5, epsilon=0.2, learning_rate=1.0))
assert not np.allclose(_new, [0.9307936, -0.0845177, -0.8462759], atol=1e-4), (
    "KL measured against the old policy, not the reference: pass the fixed ref_logp to the loss")
np.testing.assert_allclose(_new, [0.6886282, -0.0031930, -0.6854352], atol=1e-4,
                           err_msg="logits after one inner step with a reference far from the policy (key 2)")
print("KL against the reference: visible checks passed")


# %% [markdown] nbgrader={"grade": false, "grade_id": "loop_03", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ## 2. The loop
#
# Write `run_ppo(rewards, init_logits, *, iterations=40, batch_size=128, epochs=3, beta=0.2,
# epsilon=0.2, learning_rate=0.15, seed=11, update=None)` (`update=None` means your current
# `rollout_update`, looked up each time `run_ppo` runs: fixing `rollout_update` and re-running
# its cell is enough):
#
# * the reference is `log_softmax(init_logits)`, computed once;
# * start from `key = jax.random.key(seed)`; before each rollout split it,
#   `key, draw = jax.random.split(key)`, and pass `draw` to `update`;
# * after each rollout record the **exact** expected reward and the exact KL to the
#   reference (use the library's `expected_reward` and `categorical_kl`) and the action
#   probabilities.
#
# Return a dict with `reward` `[T]`, `kl` `[T]`, `probs` `[T, n]`, `final_logits` `[n]`,
# `ref_logp` `[n]` and `initial_reward` (the reference's expected reward). The `update`
# argument lets the grader test the loop on its own, with its own rollout update: a mistake in
# `rollout_update` costs only the rollout tests. Use `expected_reward(logp, rewards)` and
# `categorical_kl(logp, ref_logp)` with log-probabilities, in that argument order.

# %% nbgrader={"grade": false, "grade_id": "run_ppo_answer", "locked": false, "schema_version": 3, "solution": true, "task": false}
def run_ppo(rewards, init_logits, *, iterations=40, batch_size=128, epochs=3, beta=0.2, epsilon=0.2,
            learning_rate=0.15, seed=11, update=None):
    """The lesson's PPO run: `iterations` rollouts, fixed reference, exact reward and KL per rollout."""
    update = rollout_update if update is None else update  # looked up now, not when the cell ran
    ### BEGIN SOLUTION
    logits = jnp.asarray(init_logits, jnp.float32)
    ref_logp = jax.nn.log_softmax(logits)
    key = jax.random.key(seed)
    reward_hist, kl_hist, probs_hist = [], [], []
    for _ in range(iterations):
        key, draw = jax.random.split(key)
        logits = update(logits, draw, rewards, ref_logp, batch_size=batch_size, epochs=epochs, beta=beta,
                        epsilon=epsilon, learning_rate=learning_rate)
        logp = jax.nn.log_softmax(logits)
        reward_hist.append(float(expected_reward(logp, rewards)))
        kl_hist.append(float(categorical_kl(logp, ref_logp)))
        probs_hist.append(np.exp(np.asarray(logp)))
    return {
        "reward": np.array(reward_hist),
        "kl": np.array(kl_hist),
        "probs": np.stack(probs_hist),
        "final_logits": np.asarray(logits),
        "ref_logp": np.asarray(ref_logp),
        "initial_reward": float(expected_reward(ref_logp, rewards)),
    }
    ### END SOLUTION


# %% nbgrader={"grade": true, "grade_id": "test_loop", "locked": true, "points": 2, "schema_version": 3, "solution": false, "task": false}
# test_loop: run_ppo chains rollouts: one fresh subkey per rollout, a fixed reference, each output fed into the next rollout, exact reward and KL recorded
### BEGIN HIDDEN TESTS
grading.judge("test_loop")
### END HIDDEN TESTS
_out = run_ppo(rewards, init_logits, iterations=2, batch_size=8, epochs=1)
assert len(_out["reward"]) == 2 and len(_out["kl"]) == 2 and np.shape(_out["probs"]) == (2, 3), (
    "with iterations=2, run_ppo must record one reward, one KL and one probability row per rollout")

# %% [markdown]
# **Predict** (not graded, but write it down *before* running the next cell):
# over 40 rollouts, which action gains probability? Does the KL to the reference rise,
# fall or stay flat, and will the final reward reach the best single action's reward
# (about 1.98)?
#
# *My prediction:* 

# %% nbgrader={"grade": false, "grade_id": "run_lesson_03", "locked": true, "schema_version": 3, "solution": false, "task": false}
run = run_ppo(rewards, init_logits)
print("Reward initial/final and final KL:", run["initial_reward"], run["reward"][-1], run["kl"][-1])

# %% nbgrader={"grade": true, "grade_id": "test_recorded_numbers", "locked": true, "points": 3, "schema_version": 3, "solution": false, "task": false}
# test_recorded_numbers: your pipeline reproduces the recorded run (0.28191882 / 1.9185448 / 0.7824773) and a fresh short run matches the reference procedure
### BEGIN HIDDEN TESTS
grading.judge("test_recorded_numbers")
### END HIDDEN TESTS
assert abs(run["initial_reward"] - 0.28191882) < 1e-5, f"initial reward {run['initial_reward']}, expected 0.28191882"
assert abs(run["reward"][-1] - 1.9185448) < 1e-5, f"final reward {run['reward'][-1]}, expected 1.9185448"
assert abs(run["kl"][-1] - 0.7824773) < 1e-5, f"final KL {run['kl'][-1]}, expected 0.7824773"

# %% nbgrader={"grade": false, "grade_id": "plot_03", "locked": true, "schema_version": 3, "solution": false, "task": false}
view = SimpleNamespace(**{"clip_frac": np.zeros(len(run["reward"])), **run})  # clip_frac is not plotted
fig = three_panel_figure(view, rewards, beta=0.2)
plt.show()

# %% [markdown] nbgrader={"grade": false, "grade_id": "read_03", "locked": true, "schema_version": 3, "solution": false, "task": false}
# **Reading the figure.** Panel (a) is the exact expected learned reward after each rollout
# (reward-model score units), panel (b) the exact KL to the fixed reference (nats), panel
# (c) the reference and final action probabilities with the analytic optimum marked. Reward
# and KL rise together: probability moves to action 0, which the reward model scores
# highest, and moving away from the reference costs KL. The panels have different units;
# never add their heights. Everything here is a synthetic bandit, not a measure of human
# approval.
