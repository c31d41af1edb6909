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
# Run the notebook top to bottom after restarting the kernel. Visible tests help you; hidden tests on fresh random inputs decide the grade. Keep the first code cell as it is.

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
# measured against `ref_logp`.

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
_UPDATE_MISTAKES = {
    "recompute_old": "ratios are always 1: old log probs recomputed after every inner step "
                     "(compute old_logp once per rollout, before the inner loop)",
    "kl_to_old": "KL measured against the old policy, not the reference: pass the fixed ref_logp to the loss",
    "no_baseline": "advantages have no baseline: subtract the old policy's exact expected reward sum_a pi_old(a) r(a)",
    "batch_mean_baseline": "the baseline is the batch mean of the rewards: use the old policy's EXACT expected "
                           "reward sum_a pi_old(a) r(a)",
    "recompute_advantages": "advantages recomputed after every inner step: freeze them when the batch is collected",
    "sample_reference": "actions were sampled from the reference policy: sample the batch from the CURRENT policy",
    "one_step": "only one inner step was taken: reuse the batch for `epochs` inner steps",
}


def _trusted_update(logits, draw_key, rewards, ref_logp, *, batch_size, epochs, beta, epsilon,
                    learning_rate, mistake=None):
    """One rollout built from grading.reference pieces; `mistake` reproduces a classic error."""
    R = grading.reference
    logits = jnp.asarray(logits, jnp.float32)
    rewards = jnp.asarray(rewards, jnp.float32)
    ref_logp = jnp.asarray(ref_logp, jnp.float32)
    old_all = jax.nn.log_softmax(logits)
    sampler = ref_logp if mistake == "sample_reference" else old_all
    actions = jax.random.categorical(draw_key, sampler, shape=(batch_size,))
    old_logp = old_all[actions]
    advantages = R.exact_advantages(actions, rewards, old_all)
    if mistake == "no_baseline":
        advantages = rewards[actions]
    if mistake == "batch_mean_baseline":
        advantages = rewards[actions] - jnp.mean(rewards[actions])
    anchor = old_all if mistake == "kl_to_old" else ref_logp
    grad = jax.grad(R.ppo_loss)
    for _ in range(1 if mistake == "one_step" else epochs):
        if mistake == "recompute_old":
            old_logp = jax.nn.log_softmax(logits)[actions]
        if mistake == "recompute_advantages":
            advantages = R.exact_advantages(actions, rewards, jax.nn.log_softmax(logits))
        logits = logits - learning_rate * grad(logits, old_logp, actions, advantages, anchor, beta, epsilon)
    return logits


def _check_update(got, inputs, hyper, mistakes):
    """Compare the student's new logits with the trusted procedure; name the matching mistake if any."""
    want = _trusted_update(*inputs, **hyper)
    if not grading.matches(got, want, rtol=1e-4, atol=1e-5):
        for mistake in mistakes:
            wrong = _trusted_update(*inputs, **hyper, mistake=mistake)
            grading.check(not grading.matches(got, wrong, rtol=1e-4, atol=1e-5),
                          "rollout_update: " + _UPDATE_MISTAKES[mistake])
    grading.close(got, want, "logits after one rollout update", rtol=1e-4, atol=1e-5,
                  hint="sample from the current policy with draw_key, freeze old_logp and exact-baseline "
                       "advantages, then take `epochs` steps of learning_rate * grad(ppo_loss) against ref_logp")
def _fresh_update_inputs(rng, *, epochs, start_at_reference=False, beta_range=(0.1, 0.4)):
    """Fresh logits, rewards, reference, sampling key and hyperparameters for one rollout update."""
    n = 3  # the lesson's number of actions, fresh values (a new shape would recompile every primitive)
    logits = rng.normal(size=n).astype(np.float32)
    rewards_fresh = rng.normal(scale=1.5, size=n).astype(np.float32)
    ref_source = logits if start_at_reference else logits + rng.normal(scale=1.5, size=n).astype(np.float32)
    ref_fresh = np.asarray(jax.nn.log_softmax(jnp.asarray(ref_source, jnp.float32)))
    draw_key = jax.random.key(int(rng.integers(0, 2**31 - 1)))
    hyper = dict(batch_size=32, epochs=epochs, beta=float(rng.uniform(*beta_range)),
                 epsilon=float(rng.uniform(0.1, 0.25)), learning_rate=float(rng.uniform(0.5, 1.0)))
    return (logits, draw_key, rewards_fresh, ref_fresh), hyper
FORBID = ("exact_advantages", "train", "train_core", "make_train", "_rollout_update", "seed_style_train", "run_lesson", "sweep_grid", "sweep_seeds")
rng = grading.rng("rollout_update_fresh")
inputs, hyper = _fresh_update_inputs(rng, epochs=3)
rewards_before, ref_before = inputs[2].copy(), inputs[3].copy()
got = grading.call(rollout_update, jnp.asarray(inputs[0]), *inputs[1:], task="rollout_update",
                   forbid=FORBID, **hyper)
grading.equal(inputs[3], ref_before, "ref_logp after rollout_update", hint="the reference must never change")
grading.equal(inputs[2], rewards_before, "rewards after rollout_update", hint="the reward is frozen")
_check_update(got, inputs, hyper, ["recompute_old", "kl_to_old", "no_baseline", "batch_mean_baseline",
                                   "recompute_advantages", "sample_reference", "one_step"])
### END HIDDEN TESTS
_new = rollout_update(jnp.asarray(init_logits), jax.random.key(0), rewards,
                      jax.nn.log_softmax(jnp.asarray(init_logits)), batch_size=32, epochs=2, beta=0.2,
                      epsilon=0.2, learning_rate=0.15)
assert np.shape(_new) == (3,) and bool(np.all(np.isfinite(np.asarray(_new)))), (
    f"rollout_update must return the 3 updated logits (finite numbers), got {_new}")

# %% nbgrader={"grade": true, "grade_id": "test_old_logp_frozen", "locked": true, "points": 2, "schema_version": 3, "solution": false, "task": false}
# test_old_logp_frozen: starting at the reference with 3 inner steps: old log probs stay frozen across the inner steps (ratios move away from 1)
### BEGIN HIDDEN TESTS
_UPDATE_MISTAKES = {
    "recompute_old": "ratios are always 1: old log probs recomputed after every inner step "
                     "(compute old_logp once per rollout, before the inner loop)",
    "kl_to_old": "KL measured against the old policy, not the reference: pass the fixed ref_logp to the loss",
    "no_baseline": "advantages have no baseline: subtract the old policy's exact expected reward sum_a pi_old(a) r(a)",
    "batch_mean_baseline": "the baseline is the batch mean of the rewards: use the old policy's EXACT expected "
                           "reward sum_a pi_old(a) r(a)",
    "recompute_advantages": "advantages recomputed after every inner step: freeze them when the batch is collected",
    "sample_reference": "actions were sampled from the reference policy: sample the batch from the CURRENT policy",
    "one_step": "only one inner step was taken: reuse the batch for `epochs` inner steps",
}


def _trusted_update(logits, draw_key, rewards, ref_logp, *, batch_size, epochs, beta, epsilon,
                    learning_rate, mistake=None):
    """One rollout built from grading.reference pieces; `mistake` reproduces a classic error."""
    R = grading.reference
    logits = jnp.asarray(logits, jnp.float32)
    rewards = jnp.asarray(rewards, jnp.float32)
    ref_logp = jnp.asarray(ref_logp, jnp.float32)
    old_all = jax.nn.log_softmax(logits)
    sampler = ref_logp if mistake == "sample_reference" else old_all
    actions = jax.random.categorical(draw_key, sampler, shape=(batch_size,))
    old_logp = old_all[actions]
    advantages = R.exact_advantages(actions, rewards, old_all)
    if mistake == "no_baseline":
        advantages = rewards[actions]
    if mistake == "batch_mean_baseline":
        advantages = rewards[actions] - jnp.mean(rewards[actions])
    anchor = old_all if mistake == "kl_to_old" else ref_logp
    grad = jax.grad(R.ppo_loss)
    for _ in range(1 if mistake == "one_step" else epochs):
        if mistake == "recompute_old":
            old_logp = jax.nn.log_softmax(logits)[actions]
        if mistake == "recompute_advantages":
            advantages = R.exact_advantages(actions, rewards, jax.nn.log_softmax(logits))
        logits = logits - learning_rate * grad(logits, old_logp, actions, advantages, anchor, beta, epsilon)
    return logits


def _check_update(got, inputs, hyper, mistakes):
    """Compare the student's new logits with the trusted procedure; name the matching mistake if any."""
    want = _trusted_update(*inputs, **hyper)
    if not grading.matches(got, want, rtol=1e-4, atol=1e-5):
        for mistake in mistakes:
            wrong = _trusted_update(*inputs, **hyper, mistake=mistake)
            grading.check(not grading.matches(got, wrong, rtol=1e-4, atol=1e-5),
                          "rollout_update: " + _UPDATE_MISTAKES[mistake])
    grading.close(got, want, "logits after one rollout update", rtol=1e-4, atol=1e-5,
                  hint="sample from the current policy with draw_key, freeze old_logp and exact-baseline "
                       "advantages, then take `epochs` steps of learning_rate * grad(ppo_loss) against ref_logp")
def _fresh_update_inputs(rng, *, epochs, start_at_reference=False, beta_range=(0.1, 0.4)):
    """Fresh logits, rewards, reference, sampling key and hyperparameters for one rollout update."""
    n = 3  # the lesson's number of actions, fresh values (a new shape would recompile every primitive)
    logits = rng.normal(size=n).astype(np.float32)
    rewards_fresh = rng.normal(scale=1.5, size=n).astype(np.float32)
    ref_source = logits if start_at_reference else logits + rng.normal(scale=1.5, size=n).astype(np.float32)
    ref_fresh = np.asarray(jax.nn.log_softmax(jnp.asarray(ref_source, jnp.float32)))
    draw_key = jax.random.key(int(rng.integers(0, 2**31 - 1)))
    hyper = dict(batch_size=32, epochs=epochs, beta=float(rng.uniform(*beta_range)),
                 epsilon=float(rng.uniform(0.1, 0.25)), learning_rate=float(rng.uniform(0.5, 1.0)))
    return (logits, draw_key, rewards_fresh, ref_fresh), hyper
FORBID = ("exact_advantages", "train", "train_core", "make_train", "_rollout_update", "seed_style_train", "run_lesson", "sweep_grid", "sweep_seeds")
rng = grading.rng("old_logp_frozen")
# at the reference the old policy and the reference coincide, so only the inner-loop freezing matters
inputs, hyper = _fresh_update_inputs(rng, epochs=3, start_at_reference=True)
got = grading.call(rollout_update, jnp.asarray(inputs[0]), *inputs[1:], task="rollout_update",
                   forbid=FORBID, **hyper)
_check_update(got, inputs, hyper, ["recompute_old", "recompute_advantages", "one_step"])
### END HIDDEN TESTS
# record what rollout_update hands to ppo_step (checked only if your code calls ppo_step)
import inspect
_calls, _ppo_step = [], ppo_step


def ppo_step(*args, **kwargs):
    arguments = inspect.signature(ppo_loss).bind(*args, **kwargs).arguments
    try:  # concrete arrays only (inside a jax.jit of your own they are tracers: nothing recorded)
        _calls.append({k: np.asarray(v) for k, v in arguments.items()})
    except Exception:
        pass
    return _ppo_step(*args, **kwargs)


try:
    rollout_update(jnp.asarray(init_logits), jax.random.key(1), rewards,
                   jax.nn.log_softmax(jnp.asarray(init_logits)), batch_size=32, epochs=3, beta=0.2,
                   epsilon=0.2, learning_rate=1.0)
finally:
    ppo_step = _ppo_step
if _calls:
    assert len(_calls) == 3, f"expected 3 inner steps (epochs=3), got {len(_calls)}"
    assert all(np.array_equal(c["old_logp"], _calls[0]["old_logp"]) for c in _calls), (
        "ratios are always 1: old log probs recomputed after every inner step")

# %% nbgrader={"grade": true, "grade_id": "test_kl_against_reference", "locked": true, "points": 2, "schema_version": 3, "solution": false, "task": false}
# test_kl_against_reference: with one inner step and a reference far from the policy, the KL term pulls towards ref_logp, not the old policy; the reference is unchanged
### BEGIN HIDDEN TESTS
_UPDATE_MISTAKES = {
    "recompute_old": "ratios are always 1: old log probs recomputed after every inner step "
                     "(compute old_logp once per rollout, before the inner loop)",
    "kl_to_old": "KL measured against the old policy, not the reference: pass the fixed ref_logp to the loss",
    "no_baseline": "advantages have no baseline: subtract the old policy's exact expected reward sum_a pi_old(a) r(a)",
    "batch_mean_baseline": "the baseline is the batch mean of the rewards: use the old policy's EXACT expected "
                           "reward sum_a pi_old(a) r(a)",
    "recompute_advantages": "advantages recomputed after every inner step: freeze them when the batch is collected",
    "sample_reference": "actions were sampled from the reference policy: sample the batch from the CURRENT policy",
    "one_step": "only one inner step was taken: reuse the batch for `epochs` inner steps",
}


def _trusted_update(logits, draw_key, rewards, ref_logp, *, batch_size, epochs, beta, epsilon,
                    learning_rate, mistake=None):
    """One rollout built from grading.reference pieces; `mistake` reproduces a classic error."""
    R = grading.reference
    logits = jnp.asarray(logits, jnp.float32)
    rewards = jnp.asarray(rewards, jnp.float32)
    ref_logp = jnp.asarray(ref_logp, jnp.float32)
    old_all = jax.nn.log_softmax(logits)
    sampler = ref_logp if mistake == "sample_reference" else old_all
    actions = jax.random.categorical(draw_key, sampler, shape=(batch_size,))
    old_logp = old_all[actions]
    advantages = R.exact_advantages(actions, rewards, old_all)
    if mistake == "no_baseline":
        advantages = rewards[actions]
    if mistake == "batch_mean_baseline":
        advantages = rewards[actions] - jnp.mean(rewards[actions])
    anchor = old_all if mistake == "kl_to_old" else ref_logp
    grad = jax.grad(R.ppo_loss)
    for _ in range(1 if mistake == "one_step" else epochs):
        if mistake == "recompute_old":
            old_logp = jax.nn.log_softmax(logits)[actions]
        if mistake == "recompute_advantages":
            advantages = R.exact_advantages(actions, rewards, jax.nn.log_softmax(logits))
        logits = logits - learning_rate * grad(logits, old_logp, actions, advantages, anchor, beta, epsilon)
    return logits


def _check_update(got, inputs, hyper, mistakes):
    """Compare the student's new logits with the trusted procedure; name the matching mistake if any."""
    want = _trusted_update(*inputs, **hyper)
    if not grading.matches(got, want, rtol=1e-4, atol=1e-5):
        for mistake in mistakes:
            wrong = _trusted_update(*inputs, **hyper, mistake=mistake)
            grading.check(not grading.matches(got, wrong, rtol=1e-4, atol=1e-5),
                          "rollout_update: " + _UPDATE_MISTAKES[mistake])
    grading.close(got, want, "logits after one rollout update", rtol=1e-4, atol=1e-5,
                  hint="sample from the current policy with draw_key, freeze old_logp and exact-baseline "
                       "advantages, then take `epochs` steps of learning_rate * grad(ppo_loss) against ref_logp")
def _fresh_update_inputs(rng, *, epochs, start_at_reference=False, beta_range=(0.1, 0.4)):
    """Fresh logits, rewards, reference, sampling key and hyperparameters for one rollout update."""
    n = 3  # the lesson's number of actions, fresh values (a new shape would recompile every primitive)
    logits = rng.normal(size=n).astype(np.float32)
    rewards_fresh = rng.normal(scale=1.5, size=n).astype(np.float32)
    ref_source = logits if start_at_reference else logits + rng.normal(scale=1.5, size=n).astype(np.float32)
    ref_fresh = np.asarray(jax.nn.log_softmax(jnp.asarray(ref_source, jnp.float32)))
    draw_key = jax.random.key(int(rng.integers(0, 2**31 - 1)))
    hyper = dict(batch_size=32, epochs=epochs, beta=float(rng.uniform(*beta_range)),
                 epsilon=float(rng.uniform(0.1, 0.25)), learning_rate=float(rng.uniform(0.5, 1.0)))
    return (logits, draw_key, rewards_fresh, ref_fresh), hyper
FORBID = ("exact_advantages", "train", "train_core", "make_train", "_rollout_update", "seed_style_train", "run_lesson", "sweep_grid", "sweep_seeds")
rng = grading.rng("kl_against_reference")
# one inner step: frozen and recomputed old log probs agree, so only the KL anchor matters
inputs, hyper = _fresh_update_inputs(rng, epochs=1, beta_range=(0.5, 1.0))
ref_before = inputs[3].copy()
got = grading.call(rollout_update, jnp.asarray(inputs[0]), *inputs[1:], task="rollout_update",
                   forbid=FORBID, **hyper)
grading.equal(inputs[3], ref_before, "ref_logp after rollout_update", hint="the reference must never change")
_check_update(got, inputs, hyper, ["kl_to_old", "no_baseline", "batch_mean_baseline", "sample_reference"])
### END HIDDEN TESTS
# record what rollout_update hands to ppo_step (checked only if your code calls ppo_step)
_far_ref = jax.nn.log_softmax(jnp.array([-1.0, 0.5, 1.0]))
import inspect
_calls, _ppo_step = [], ppo_step


def ppo_step(*args, **kwargs):
    arguments = inspect.signature(ppo_loss).bind(*args, **kwargs).arguments
    try:  # concrete arrays only (inside a jax.jit of your own they are tracers: nothing recorded)
        _calls.append({k: np.asarray(v) for k, v in arguments.items()})
    except Exception:
        pass
    return _ppo_step(*args, **kwargs)


try:
    rollout_update(jnp.asarray(init_logits), jax.random.key(2), rewards, _far_ref, batch_size=32,
                   epochs=2, beta=0.2, epsilon=0.2, learning_rate=0.5)
finally:
    ppo_step = _ppo_step
if _calls:
    assert all(np.allclose(c["ref_logp"], _far_ref) for c in _calls), (
        "KL measured against the old policy, not the reference: pass ref_logp to the loss")


# %% [markdown] nbgrader={"grade": false, "grade_id": "loop_03", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ## 2. The loop
#
# Write `run_ppo(rewards, init_logits, *, iterations=40, batch_size=128, epochs=3, beta=0.2,
# epsilon=0.2, learning_rate=0.15, seed=11, update=rollout_update)`:
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
# argument lets the grader test the loop on its own.

# %% nbgrader={"grade": false, "grade_id": "run_ppo_answer", "locked": false, "schema_version": 3, "solution": true, "task": false}
def run_ppo(rewards, init_logits, *, iterations=40, batch_size=128, epochs=3, beta=0.2, epsilon=0.2,
            learning_rate=0.15, seed=11, update=rollout_update):
    """The lesson's PPO run: `iterations` rollouts, fixed reference, exact reward and KL per rollout."""
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
FORBID = ("exact_advantages", "train", "train_core", "make_train", "_rollout_update", "seed_style_train", "run_lesson", "sweep_grid", "sweep_seeds")
R = grading.reference
rng = grading.rng("loop")
n, T = 3, 4
init = rng.normal(size=n).astype(np.float32)
rewards_fresh = rng.normal(scale=1.5, size=n).astype(np.float32)
seed = int(rng.integers(0, 2**31 - 1))
hyper = dict(batch_size=int(rng.integers(8, 33)), epochs=int(rng.integers(1, 4)),  # only passed on
             beta=float(rng.uniform(0.1, 0.4)), epsilon=float(rng.uniform(0.1, 0.3)),
             learning_rate=float(rng.uniform(0.05, 0.3)))
ref = jax.nn.log_softmax(jnp.asarray(init))
# the plan: which logits and key each rollout should receive, and a stand-in result for each
key, plan, current = jax.random.key(seed), [], jnp.asarray(init)
for _ in range(T):
    key, draw = jax.random.split(key)
    following = current + jnp.asarray(rng.normal(scale=0.5, size=n), jnp.float32)
    plan.append((current, jax.random.key_data(draw), following))
    current = following
stand_ins, calls = [p[2] for p in plan], []  # the recorder sees only what it must return

def recording_update(logits, draw_key, rewards, ref_logp, **kwargs):
    calls.append((logits, draw_key, rewards, ref_logp, kwargs))
    return stand_ins[min(len(calls), len(stand_ins)) - 1]

out = grading.call_raw(run_ppo, rewards_fresh, init, iterations=T, seed=seed, update=recording_update,
                       task="run_ppo", forbid=FORBID, convert=False, **hyper)
grading.check(len(calls) == T, f"run_ppo must call update once per rollout: {T} rollouts, {len(calls)} calls")
for k, (logits_k, draw_k, rewards_k, ref_k, kwargs_k) in enumerate(calls):
    grading.close(logits_k, plan[k][0], f"logits passed to update on rollout {k}", rtol=1e-6, atol=1e-6,
                  hint="start from init_logits and feed each rollout's result into the next")
    if not grading.matches(ref_k, ref, rtol=1e-6, atol=1e-6):
        grading.check(not grading.matches(ref_k, jax.nn.log_softmax(jnp.asarray(plan[k][0])),
                                          rtol=1e-6, atol=1e-6),
                      "run_ppo: KL measured against the old policy, not the reference: the reference "
                      "must stay log_softmax(init_logits) for the whole run")
    grading.close(ref_k, ref, f"ref_logp passed to update on rollout {k}", rtol=1e-6, atol=1e-6,
                  hint="the reference is log_softmax(init_logits), computed once and never refreshed")
    grading.close(rewards_k, rewards_fresh, f"rewards passed to update on rollout {k}")
    is_typed = jnp.issubdtype(getattr(draw_k, "dtype", np.uint32), jax.dtypes.prng_key)
    grading.equal(jax.random.key_data(draw_k) if is_typed else draw_k, plan[k][1],
                  f"sampling key passed to update on rollout {k}",
                  hint="start from jax.random.key(seed) and split once per rollout: "
                       "key, draw = jax.random.split(key); pass draw")
    for name, value in hyper.items():
        grading.check(name in kwargs_k and grading.matches(kwargs_k[name], value, rtol=1e-6, atol=0.0),
                      f"run_ppo must pass {name}={value} to update (got {kwargs_k.get(name)!r})")
finals = [jnp.asarray(p[2]) for p in plan]
logps = [jax.nn.log_softmax(f) for f in finals]
grading.close(out["reward"], [R.expected_reward(lp, jnp.asarray(rewards_fresh)) for lp in logps],
              "exact expected reward after each rollout", rtol=1e-5, atol=1e-6,
              hint="record sum_a pi(a) r(a) of the policy returned by each rollout")
grading.close(out["kl"], [R.categorical_kl(lp, ref) for lp in logps], "exact KL after each rollout",
              rtol=1e-5, atol=1e-6, hint="record KL(pi || pi_ref) of each rollout's result")
grading.close(out["probs"], [jnp.exp(lp) for lp in logps], "action probabilities after each rollout",
              rtol=1e-5, atol=1e-6)
grading.close(out["final_logits"], finals[-1], "final logits", rtol=1e-6, atol=1e-6)
grading.close(out["ref_logp"], ref, "ref_logp returned by run_ppo", rtol=1e-6, atol=1e-6)
grading.close(out["initial_reward"], R.expected_reward(ref, jnp.asarray(rewards_fresh)),
              "initial_reward (expected reward of the reference)", rtol=1e-5, atol=1e-6)
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
_UPDATE_MISTAKES = {
    "recompute_old": "ratios are always 1: old log probs recomputed after every inner step "
                     "(compute old_logp once per rollout, before the inner loop)",
    "kl_to_old": "KL measured against the old policy, not the reference: pass the fixed ref_logp to the loss",
    "no_baseline": "advantages have no baseline: subtract the old policy's exact expected reward sum_a pi_old(a) r(a)",
    "batch_mean_baseline": "the baseline is the batch mean of the rewards: use the old policy's EXACT expected "
                           "reward sum_a pi_old(a) r(a)",
    "recompute_advantages": "advantages recomputed after every inner step: freeze them when the batch is collected",
    "sample_reference": "actions were sampled from the reference policy: sample the batch from the CURRENT policy",
    "one_step": "only one inner step was taken: reuse the batch for `epochs` inner steps",
}


def _trusted_update(logits, draw_key, rewards, ref_logp, *, batch_size, epochs, beta, epsilon,
                    learning_rate, mistake=None):
    """One rollout built from grading.reference pieces; `mistake` reproduces a classic error."""
    R = grading.reference
    logits = jnp.asarray(logits, jnp.float32)
    rewards = jnp.asarray(rewards, jnp.float32)
    ref_logp = jnp.asarray(ref_logp, jnp.float32)
    old_all = jax.nn.log_softmax(logits)
    sampler = ref_logp if mistake == "sample_reference" else old_all
    actions = jax.random.categorical(draw_key, sampler, shape=(batch_size,))
    old_logp = old_all[actions]
    advantages = R.exact_advantages(actions, rewards, old_all)
    if mistake == "no_baseline":
        advantages = rewards[actions]
    if mistake == "batch_mean_baseline":
        advantages = rewards[actions] - jnp.mean(rewards[actions])
    anchor = old_all if mistake == "kl_to_old" else ref_logp
    grad = jax.grad(R.ppo_loss)
    for _ in range(1 if mistake == "one_step" else epochs):
        if mistake == "recompute_old":
            old_logp = jax.nn.log_softmax(logits)[actions]
        if mistake == "recompute_advantages":
            advantages = R.exact_advantages(actions, rewards, jax.nn.log_softmax(logits))
        logits = logits - learning_rate * grad(logits, old_logp, actions, advantages, anchor, beta, epsilon)
    return logits


def _check_update(got, inputs, hyper, mistakes):
    """Compare the student's new logits with the trusted procedure; name the matching mistake if any."""
    want = _trusted_update(*inputs, **hyper)
    if not grading.matches(got, want, rtol=1e-4, atol=1e-5):
        for mistake in mistakes:
            wrong = _trusted_update(*inputs, **hyper, mistake=mistake)
            grading.check(not grading.matches(got, wrong, rtol=1e-4, atol=1e-5),
                          "rollout_update: " + _UPDATE_MISTAKES[mistake])
    grading.close(got, want, "logits after one rollout update", rtol=1e-4, atol=1e-5,
                  hint="sample from the current policy with draw_key, freeze old_logp and exact-baseline "
                       "advantages, then take `epochs` steps of learning_rate * grad(ppo_loss) against ref_logp")
def _trusted_run(rewards_run, init_logits, *, iterations, seed, **hyper):
    """The whole loop with the trusted update: per-rollout exact reward and KL, final logits."""
    R = grading.reference
    logits = jnp.asarray(init_logits, jnp.float32)
    ref_logp = jax.nn.log_softmax(logits)
    key = jax.random.key(seed)
    reward_hist, kl_hist = [], []
    for _ in range(iterations):
        key, draw = jax.random.split(key)
        logits = _trusted_update(logits, draw, rewards_run, ref_logp, **hyper)
        logp = jax.nn.log_softmax(logits)
        reward_hist.append(R.expected_reward(logp, jnp.asarray(rewards_run, jnp.float32)))
        kl_hist.append(R.categorical_kl(logp, ref_logp))
    return np.asarray(reward_hist), np.asarray(kl_hist), np.asarray(logits)
FORBID = ("exact_advantages", "train", "train_core", "make_train", "_rollout_update", "seed_style_train", "run_lesson", "sweep_grid", "sweep_seeds")
grading.close(run["initial_reward"], 0.28191882371902466, "initial expected reward", rtol=0.0, atol=1e-5)
grading.close(run["reward"][-1], 1.9185447692871094, "final expected reward", rtol=0.0, atol=1e-5)
grading.close(run["kl"][-1], 0.7824773192405701, "final KL to the reference (nats)", rtol=0.0, atol=1e-5)
# a fresh short run of YOUR pipeline (a hard-coded or delegated answer fails here)
rng = grading.rng("recorded_fresh")
n = 3  # the lesson's number of actions, fresh values
init = rng.normal(size=n).astype(np.float32)
rewards_fresh = rng.normal(scale=1.5, size=n).astype(np.float32)
hyper = dict(batch_size=32, epochs=2, beta=float(rng.uniform(0.1, 0.4)),
             epsilon=float(rng.uniform(0.1, 0.3)), learning_rate=float(rng.uniform(0.1, 0.5)))
seed = int(rng.integers(0, 2**31 - 1))
out = grading.call_raw(run_ppo, jnp.asarray(rewards_fresh), init, iterations=3, seed=seed,
                       task="run_ppo", forbid=FORBID, convert=False, **hyper)
want_reward, want_kl, want_logits = _trusted_run(rewards_fresh, init, iterations=3, seed=seed, **hyper)
grading.close(out["reward"], want_reward, "expected reward per rollout on a fresh short run",
              rtol=1e-4, atol=1e-5, hint="compute the run; do not return recorded numbers")
grading.close(out["kl"], want_kl, "KL per rollout on a fresh short run", rtol=1e-4, atol=1e-5)
grading.close(out["final_logits"], want_logits, "final logits on a fresh short run", rtol=1e-4, atol=1e-5)
### END HIDDEN TESTS
assert abs(run["initial_reward"] - 0.28191882) < 1e-5, f"initial reward {run['initial_reward']}, expected 0.28191882"
assert abs(run["reward"][-1] - 1.9185448) < 1e-5, f"final reward {run['reward'][-1]}, expected 1.9185448"
assert abs(run["kl"][-1] - 0.7824773) < 1e-5, f"final KL {run['kl'][-1]}, expected 0.7824773"

# %% nbgrader={"grade": false, "grade_id": "plot_03", "locked": true, "schema_version": 3, "solution": false, "task": false}
view = SimpleNamespace(clip_frac=np.zeros(len(run["reward"])), **run)  # clip_frac is not plotted
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
