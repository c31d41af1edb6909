# ---
# jupyter:
#   kernelspec:
#     display_name: Python 3 (ipykernel)
#     language: python
#     name: python3
# ---

# %% [markdown] nbgrader={"grade": false, "grade_id": "intro_03", "locked": true, "schema_version": 3, "solution": false, "task": false}
# # a2 · Build step 3: collect rollouts, reuse each batch, reach the recorded numbers
#
# One **rollout** samples a batch of actions from the current policy, freezes what the
# batch needs (the behaviour log-probabilities and the advantages), and then takes
# several inner gradient steps on that same batch. The next rollout samples a fresh batch
# from the updated policy. The reference and the reward never change.
#
# This notebook gives you the course library's `ppo_loss`, the lesson's frozen rewards and
# the reference logits, so earlier mistakes do not carry over.
#
# * **You will be able to** write one PPO rollout and the training loop around it, reproduce the
#   recorded run, read the standard PPO diagnostics (clip fraction, sampled KL estimates) inside a
#   batch, say where the KL penalty enters, and save your run with its provenance.
# * **Prerequisites:** notebooks 1 and 2 (the loss and the four lifetimes); `jax.random.split`.
# * **Expected time:** about 75 minutes.

# %% [markdown] nbgrader={"grade": false, "grade_id": "points_03", "locked": true, "schema_version": 3, "solution": false, "task": false}
# **Points.** This notebook: **16 points**. The whole assignment `a2_ppo_rlhf` (four notebooks) is worth **56 points**: 48 autograded and 8 graded by hand.
#
# | graded cell | points | how |
# |---|---|---|
# | **Task 3.1: `rollout_update`** (7 points) | | |
# | `test_rollout_update_fresh` | 3 | autograded |
# | `test_old_logp_frozen` | 2 | autograded |
# | `test_kl_against_reference` | 2 | autograded |
# | **Task 3.2: `run_ppo`** (6 points) | | |
# | `test_loop` | 3 | autograded |
# | `test_recorded_numbers` | 3 | autograded |
# | **Task 3.3: `inner_diagnostics`** (3 points) | | |
# | `test_inner_diagnostics` | 3 | autograded |
#
# Run the notebook top to bottom after restarting the kernel. Visible tests help you; hidden tests on fresh random inputs decide the grade. Validate's "Success! Your notebook passes all the tests." means the visible tests passed, not that you have full marks. Keep the first code cell as it is, and do not delete, move or edit the locked cells (the grader restores them); your own extra cells are fine anywhere, and a harmless line above the first cell (a `%matplotlib` magic, say) is only listed for the instructor, it costs nothing.

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
# ### Task 3.1: `rollout_update` (7 points)
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
# ### Task 3.2: `run_ppo` (6 points)
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


# %% nbgrader={"grade": true, "grade_id": "test_loop", "locked": true, "points": 3, "schema_version": 3, "solution": false, "task": false}
# test_loop: run_ppo chains rollouts: one fresh subkey per rollout, a fixed reference, each output fed into the next rollout, exact reward and KL recorded
### BEGIN HIDDEN TESTS
grading.judge("test_loop")
### END HIDDEN TESTS
_out = run_ppo(rewards, init_logits, iterations=2, batch_size=8, epochs=1)
assert len(_out["reward"]) == 2 and len(_out["kl"]) == 2 and np.shape(_out["probs"]) == (2, 3), (
    "with iterations=2, run_ppo must record one reward, one KL and one probability row per rollout")

# %% [markdown]
# **Prediction** (not graded, but write it down *before* running the next cell):
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

# %% [markdown] nbgrader={"grade": false, "grade_id": "diagnostics_03", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ## 3. Inside one batch: the PPO diagnostics
#
# Implementations such as CleanRL log a few numbers at every inner epoch. With the ratio
# $r_i = \pi_\theta(a_i)/\pi_{\text{old}}(a_i)$ of the batch's samples, measured **before** inner step
# $e$ (at the logits whose gradient that step takes):
#
# | metric | formula | what it tells you |
# |---|---|---|
# | `clip_frac` | mean of $\lvert r_i - 1\rvert > \epsilon$ | the share of samples whose ratio is outside the band (CleanRL's `clipfrac`); the clip binds only on those of them that are outside on the side their advantage pushes, which this section also counts |
# | `k1` | mean of $-\log r_i$ | the plain sampled estimate of $\mathrm{KL}(\pi_{\text{old}}\Vert\pi_\theta)$; unbiased on fresh samples from $\pi_{\text{old}}$, but a single sample can be negative |
# | `k3` | mean of $(r_i - 1) - \log r_i$ | the same KL with a control variate: every term is $\ge 0$; its variance is lower than `k1`'s while the ratios stay near 1 (the policy close to $\pi_{\text{old}}$), not in general: `a3_ppo_sequences` measures it far larger than `k1`'s far from the reference |
# | `exact_kl` | $\sum_a \pi_{\text{old}}(a)\,(\log\pi_{\text{old}}(a) - \log\pi_\theta(a))$ | what `k1` and `k3` estimate, summed exactly (possible here, with three actions) |
#
# These measure how far the inner steps have moved the policy from the **behaviour** policy of the
# batch; the KL to the **reference** (the penalty) is a different quantity. At the first inner step
# $\pi_\theta$ *is* $\pi_{\text{old}}$: every ratio is exactly 1, so the clip can only bind from the
# second step on.
#
# ### Task 3.3: `inner_diagnostics` (3 points)
#
# Write `inner_diagnostics(logits, draw_key, rewards, ref_logp, *, batch_size, epochs, beta, epsilon,
# learning_rate)`: the same rollout as `rollout_update`, recording before each inner step the four
# metrics above and the ratios. Return a dict with `clip_frac`, `k1`, `k3`, `exact_kl` (each `[epochs]`),
# `ratio` (`[epochs, batch_size]`) and `logits` (the logits after the last step). Compute the current
# log-probabilities with `jax.nn.log_softmax(logits)`, as you did for `old_logp`, so that the first
# ratios come out as exactly 1.0.

# %% nbgrader={"grade": false, "grade_id": "inner_diagnostics_answer", "locked": false, "schema_version": 3, "solution": true, "task": false}
def inner_diagnostics(logits, draw_key, rewards, ref_logp, *, batch_size, epochs, beta, epsilon,
                      learning_rate):
    """One rollout with the per-inner-epoch diagnostics, measured before each step.

    With r = exp(logp[actions] - old_logp) at that step: clip_frac = mean(|r - 1| > epsilon),
    k1 = mean(-log r), k3 = mean((r - 1) - log r), exact_kl = KL(pi_old || pi_theta) over all actions.
    old_logp, the actions and the advantages are frozen once, as in rollout_update; ref_logp is fixed.
    Returns {"clip_frac", "k1", "k3", "exact_kl": [epochs], "ratio": [epochs, batch_size], "logits": [n]}.
    """
    ### BEGIN SOLUTION
    logits = jnp.asarray(logits, jnp.float32)
    old_logp_all = jax.nn.log_softmax(logits)
    actions = jax.random.categorical(draw_key, old_logp_all, shape=(batch_size,))
    old_logp = old_logp_all[actions]
    advantages = rewards[actions] - jnp.sum(jnp.exp(old_logp_all) * rewards)
    rows = {"clip_frac": [], "k1": [], "k3": [], "exact_kl": [], "ratio": []}
    for _ in range(epochs):
        logp_all = jax.nn.log_softmax(logits)  # the policy this step's gradient is taken at
        log_r = logp_all[actions] - old_logp
        r = jnp.exp(log_r)
        rows["ratio"].append(np.asarray(r))
        rows["clip_frac"].append(float(jnp.mean(jnp.abs(r - 1.0) > epsilon)))
        rows["k1"].append(float(jnp.mean(-log_r)))
        rows["k3"].append(float(jnp.mean((r - 1.0) - log_r)))
        rows["exact_kl"].append(float(jnp.sum(jnp.exp(old_logp_all) * (old_logp_all - logp_all))))
        _, grad = ppo_step(logits, old_logp, actions, advantages, ref_logp, beta, epsilon)
        logits = logits - learning_rate * grad
    return {**{name: np.array(values) for name, values in rows.items()}, "logits": np.asarray(logits)}
    ### END SOLUTION


# %% [markdown]
# **Prediction** (not graded, but write it down *before* running the next cell):
# the next cell takes 4 inner steps at learning rate 1.0 on one batch of 32 samples. What are the
# clip fraction, `k1` and `k3` at the first step? Once the policy has moved, will `k1` or `k3` be
# closer to the exact KL?
#
# *My prediction:* 

# %% nbgrader={"grade": false, "grade_id": "diagnostics_experiment", "locked": true, "schema_version": 3, "solution": false, "task": false}
diag = inner_diagnostics(jnp.asarray(init_logits), jax.random.key(1), rewards,
                         jax.nn.log_softmax(jnp.asarray(init_logits)), batch_size=32, epochs=4, beta=0.2,
                         epsilon=0.2, learning_rate=1.0)
print("inner step | clip fraction |     k1     |     k3     | exact KL(old || current), nats")
for e in range(4):
    print(f"{e + 1:10d} | {diag['clip_frac'][e]:13.3f} | {diag['k1'][e]:10.6f} | {diag['k3'][e]:10.6f} | "
          f"{diag['exact_kl'][e]:.6f}")
print("ratios at the first inner step all exactly 1.0:", bool(np.all(np.asarray(diag["ratio"])[0] == 1.0)))

# %% nbgrader={"grade": true, "grade_id": "test_inner_diagnostics", "locked": true, "points": 3, "schema_version": 3, "solution": false, "task": false}
# test_inner_diagnostics: on a fresh rollout with 4 inner steps the first ratios are exactly 1 and clip fraction, k1, k3 and the exact KL per epoch match the reference procedure
### BEGIN HIDDEN TESTS
grading.judge("test_inner_diagnostics")
### END HIDDEN TESTS
_first = np.asarray(diag["ratio"])[0]
assert np.all(_first == 1.0), (
    f"expected every ratio at the first inner step to be exactly 1.0, got values from {_first.min()!r} to "
    f"{_first.max()!r}: measure BEFORE the step, with log_softmax(logits) computed as for old_logp")
for _name, _want in {"clip_frac": [0.0, 1.0, 1.0, 1.0], "k1": [0.0, 0.0253238, 0.0160440, 0.0084631],
                     "k3": [0.0, 0.1643529, 0.1452967, 0.1281989],
                     "exact_kl": [0.0, 0.1656445, 0.1461946, 0.1289225]}.items():
    np.testing.assert_allclose(np.asarray(diag[_name]), _want, atol=1e-5,
                               err_msg=f"{_name} per inner step on the lesson's batch (key 1, learning rate 1.0)")
print("inner diagnostics: visible checks passed")

# %% [markdown] nbgrader={"grade": false, "grade_id": "read_diagnostics_03", "locked": true, "schema_version": 3, "solution": false, "task": false}
# **Reading the diagnostics.** One line per metric:
#
# * **Ratio at step 1:** exactly 1 for every sample, because the batch was just drawn from the
#   current policy; the clip cannot bind yet, and the first step is a plain policy-gradient step.
# * **Clip fraction:** 0 at step 1, then 1.000: after one step at this large learning rate every
#   ratio is outside the band. Outside the band is not the same as clipped: the next cell counts the
#   samples on which the clip binds.
# * **k1:** far below the exact KL here: the inner steps raised the probability of exactly the
#   sampled actions with positive advantage, so on *this* batch $-\log r$ is biased low (it is
#   unbiased only on fresh samples).
# * **k3:** close to the exact KL and never negative per sample, which is why many
#   implementations log it (CleanRL's `approx_kl`).
# * **Exact KL:** the ground truth the estimators aim at; in a language model it cannot be summed,
#   which is why the estimators exist.

# %% nbgrader={"grade": false, "grade_id": "clip_binds_03", "locked": true, "schema_version": 3, "solution": false, "task": false}
# the lesson's batch again (key 1, 32 samples from the reference) with its frozen advantages
from rlhf_lab.ppo import exact_advantages   # given: A_i = r(a_i) - sum_a pi_old(a) r(a)

diag_old_logp_all = jax.nn.log_softmax(jnp.asarray(init_logits))
diag_actions = np.asarray(jax.random.categorical(jax.random.key(1), diag_old_logp_all, shape=(32,)))
diag_adv = np.asarray(exact_advantages(diag_actions, rewards, diag_old_logp_all))
diag_ratio = np.asarray(diag["ratio"])                          # [4 inner steps, 32 samples]
outside_band = np.abs(diag_ratio - 1.0) > 0.2                   # CleanRL's clipfrac counts these
clip_binds = ((diag_adv > 0) & (diag_ratio > 1.2)) | ((diag_adv < 0) & (diag_ratio < 0.8))   # TRL's pg_clipfrac
print("inner step | outside the band (clipfrac) | clip binds (pg_clipfrac)")
for e in range(4):
    print(f"{e + 1:10d} | {outside_band[e].mean():26.3f} | {clip_binds[e].mean():.3f}")
print("at inner step 2, per action: samples, advantage, ratio, clip binds")
for a in range(3):
    k = diag_actions == a
    print(f"  action {a}: {k.sum():2d} samples, A = {diag_adv[k][0]:+.3f}, ratio {diag_ratio[1][k][0]:.3f}, "
          f"binds: {bool(clip_binds[1][k][0])}")

# %% [markdown] nbgrader={"grade": false, "grade_id": "read_clip_binds_03", "locked": true, "schema_version": 3, "solution": false, "task": false}
# **Outside the band is not clipped.** The clip binds where the ratio has left the band on the side
# its advantage pushes ($A > 0$ above $1 + \epsilon$, $A < 0$ below $1 - \epsilon$): there the minimum
# picks the clipped product and that sample's surrogate gradient is 0. Action 1 has a small positive
# advantage (+0.045), but the first step moved probability to action 0 and its ratio fell to 0.695,
# below the band on the other side. For its 8 samples the minimum picks $\rho A$, so their gradient is
# intact and pulls action 1 back up. From step 2 on all 32 ratios are outside the band (1.000) while
# the clip binds on 24 of them (0.750). Implementations log one or the other: CleanRL's `clipfrac` is
# the first column (and Task 3.3's `clip_frac`), TRL's and verl's `pg_clipfrac` count where the
# clipped term is the one chosen, the second.

# %% [markdown] nbgrader={"grade": false, "grade_id": "kl_where_03", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ## 4. Where the KL goes
#
# `a1_ppo_objective` wrote the penalised reward $r - \beta\,\mathrm{KL}(\pi\Vert\pi_{\text{ref}})$ with one
# exact KL per policy. That is the value of the objective $J = \mathbb E_\pi[r] - \beta\,\mathrm{KL}(\pi\Vert
# \pi_{\text{ref}})$ for that policy, but as a **reward** in a policy-gradient step it is one number
# subtracted from every sample: a constant shift, which (like a baseline) changes no gradient. Two
# placements do follow $\nabla J$:
#
# * **per sample, in the reward:** $\tilde r(a) = r(a) - \beta\,(\log\pi(a) - \log\pi_{\text{ref}}(a))$,
#   whose expectation under $\pi$ is the KL; the score-function gradient of $\tilde r$ is $\nabla J$;
# * **in the loss** (this assignment): $L = -\text{surrogate} + \beta\,\mathrm{KL}(\pi_\theta\Vert\pi_{\text{ref}})$,
#   differentiated exactly.
#
# The next cell checks this exactly, with no sampling: for a policy that has moved away from the
# reference it sums $\sum_a \pi(a)\,\nabla\log\pi(a)\,R(a)$ over the three actions for each choice of
# the per-action reward $R$ (`jax.grad`, with $\pi$ and $R$ held fixed), beside `jax.grad` of $J$ itself.

# %% nbgrader={"grade": false, "grade_id": "kl_placement_03", "locked": true, "schema_version": 3, "solution": false, "task": false}
moved_logits = jnp.array([1.0, 0.0, -1.0])                 # a policy that has moved away from the reference
lesson_ref_logp = jax.nn.log_softmax(jnp.asarray(init_logits))
moved_logp = jax.nn.log_softmax(moved_logits)


def score_function_gradient(logits, per_action_reward):
    """Exact sum_a pi(a) grad log pi(a) R(a): the expected policy-gradient step for rewards R, pi and R fixed."""
    probs = jax.lax.stop_gradient(jax.nn.softmax(logits))
    return jax.grad(lambda z: jnp.sum(probs * jax.nn.log_softmax(z) * per_action_reward))(logits)


one_kl = categorical_kl(moved_logp, lesson_ref_logp)        # a1's single number for this policy
placements = {
    "reward r (no penalty)": rewards,
    "r - beta KL, one KL for all": rewards - 0.2 * one_kl,
    "r - beta (log pi - log pi_ref)": rewards - 0.2 * (moved_logp - lesson_ref_logp),
}
print(f"KL(pi || pi_ref) = {float(one_kl):.4f} nats, beta = 0.2; gradient of the objective w.r.t. the 3 logits:")
for name, per_action in placements.items():
    print(f"{name:34s}", " ".join(f"{g:+.4f}" for g in np.asarray(score_function_gradient(moved_logits, per_action))))
objective = lambda z: (expected_reward(jax.nn.log_softmax(z), rewards)
                       - 0.2 * categorical_kl(jax.nn.log_softmax(z), lesson_ref_logp))
print(f"{'jax.grad of E[r] - beta KL':34s}", " ".join(f"{g:+.4f}" for g in np.asarray(jax.grad(objective)(moved_logits))))

# %% [markdown] nbgrader={"grade": false, "grade_id": "read_kl_placement_03", "locked": true, "schema_version": 3, "solution": false, "task": false}
# **Reading the gradients.** The first two rows are equal: subtracting one KL from every reward moved
# nothing, because $\sum_a \pi(a)\nabla\log\pi(a) = 0$. The per-sample penalty gives exactly
# `jax.grad` of $J$, smaller on action 0 and larger on action 2: it pulls back towards the reference.
# Where the two working placements differ:
#
# * **In the reward, per sample,** the penalty is frozen when the batch is collected: it is whitened
#   and clipped together with the advantage, and it sees only the sampled actions.
# * **In the loss,** the penalty is recomputed at every inner step, is never clipped (its gradient
#   survives when every surrogate term is clipped, as `a1_ppo_objective` showed) and, here, is summed
#   over all actions. With exact expectations, no clipping and one step per batch, both give $\nabla J$.
# * **Language models** put it in the reward, per token: `a3_ppo_sequences` gives each token the
#   penalty $-\beta(\log\pi_\theta - \log\pi_{\text{ref}})$ of that token and adds the reward model's score at
#   the last one, so the value function and GAE carry the penalty like any other reward.

# %% [markdown] nbgrader={"grade": false, "grade_id": "export_03", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ## 5. Save your run
#
# The course library writes a run's series with its provenance (UTC time, Python, platform, package
# versions, the configuration including the seed) as JSON or CSV: `rlhf_lab.plots.export_run`. The next
# cell runs your loop once more with an update that also measures the clip fraction of every rollout
# (`inner_diagnostics`, averaged over the inner steps; it takes the same steps as `rollout_update`),
# and writes `my_ppo_run.json` next to this notebook. It is not graded and is skipped while
# autograding; change the file name to keep several runs.

# %% nbgrader={"grade": false, "grade_id": "export_cell", "locked": true, "schema_version": 3, "solution": false, "task": false}
import os
from rlhf_lab.plots import export_run

if os.environ.get("NBGRADER_EXECUTION"):
    print("Saving the run is skipped while autograding.")
else:
    clip_per_rollout = []

    def update_with_diagnostics(logits, draw_key, rewards, ref_logp, **hyper):
        measured = inner_diagnostics(logits, draw_key, rewards, ref_logp, **hyper)
        clip_per_rollout.append(float(np.mean(measured["clip_frac"])))
        return jnp.asarray(measured["logits"])

    config = dict(iterations=40, batch_size=128, epochs=3, beta=0.2, epsilon=0.2, learning_rate=0.15, seed=11,
                  init_logits=init_logits.tolist())
    hyper = {k: v for k, v in config.items() if k != "init_logits"}
    my_run = run_ppo(rewards, init_logits, **hyper, update=update_with_diagnostics)
    series = SimpleNamespace(**my_run, clip_frac=np.array(clip_per_rollout))
    summary = {"initial_reward": my_run["initial_reward"], "final_reward": float(my_run["reward"][-1]),
               "final_kl": float(my_run["kl"][-1])}
    try:
        record = export_run("my_ppo_run.json", config, series, summary, rewards=np.asarray(rewards))
    except (OSError, ValueError) as err:  # saving is optional: never break the notebook
        print(f"could not save the run: {type(err).__name__}: {err}")
    else:
        print("wrote my_ppo_run.json:", record["summary"], "| made with", record["provenance"]["packages"])

# %% [markdown] nbgrader={"grade": false, "grade_id": "recap_03", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ## Recap
#
# * **Four lifetimes.** The current policy changes at every inner step; the old (behaviour)
#   log-probabilities and the advantages once per rollout; the reference and the reward model never.
# * **The signed clip.** The minimum is over the products $\rho A$ and $\operatorname{clip}(\rho)A$, so the
#   sign of $A$ picks the bound; it can only bind from the second inner step of a batch.
# * **Reward beside KL.** Report the expected reward together with the KL to the reference: a higher
#   reward bought with a large KL is a different result.
