# ---
# jupyter:
#   kernelspec:
#     display_name: Python 3 (ipykernel)
#     language: python
#     name: python3
# ---

# %% [markdown]
# # a2b · Find the bug: four broken PPO pieces
#
# This notebook has nothing to hand in and is not graded. Each section gives a piece of the
# `a2_ppo_rlhf` pipeline with one classic mistake in it (the mistakes the hidden tests of that
# assignment name), a probe that shows its symptom, and a cell for your fix. Read the symptom,
# say what is wrong *before* you look at the code closely, then fix the code and run the check.
#
# * **You will be able to** recognise the four classic PPO bugs from their symptoms alone.
# * **Prerequisites:** `a2_ppo_rlhf` notebooks 1 to 3.
# * **Expected time:** about 30 minutes.

# %%
import jax
import jax.numpy as jnp
import numpy as np
from rlhf_lab import lesson_rewards, ppo_loss as reference_loss

rewards = lesson_rewards()
init_logits = jnp.array([0.2, 0.0, -0.2])
ref_logp = jax.nn.log_softmax(init_logits)
ppo_step = jax.jit(jax.value_and_grad(reference_loss))   # the course library's loss, for the rollout bugs


def report(name, got, want, atol=1e-5):
    ok = np.allclose(np.asarray(got), np.asarray(want), atol=atol)
    print(f"{name}: {'matches the reference' if ok else 'still differs'} (got {np.round(np.asarray(got), 6)}, "
          f"expected {np.round(np.asarray(want), 6)})")


# %% [markdown]
# ## Bug 1: a loss that treats bad actions too kindly
#
# **Symptom.** The probe prints the surrogate term of one sample with ratio 0.5 and advantage -2
# (ε = 0.2). The signed clip should give -1.6; this loss gives something else.

# %%
def buggy_loss_1(logits, old_logp, actions, advantages, ref_logp, beta=0.1, epsilon=0.2):
    logp = jax.nn.log_softmax(logits)
    ratio = jnp.exp(logp[actions] - jax.lax.stop_gradient(old_logp))
    advantages = jax.lax.stop_gradient(advantages)
    clipped = jnp.clip(ratio, 1.0 - epsilon, 1.0 + epsilon)
    # the min is taken over the RATIOS, then multiplied by A: the sign of A no longer picks the bound
    surrogate = jnp.mean(jnp.minimum(ratio, clipped) * advantages)
    kl = jnp.sum(jnp.exp(logp) * (logp - jax.lax.stop_gradient(ref_logp)))
    return -surrogate + beta * kl


# %%
def one_term(loss_fn, ratio, advantage):
    logp = jax.nn.log_softmax(init_logits)
    old = logp[1:2] - jnp.log(ratio)
    return -float(loss_fn(init_logits, old, jnp.array([1]), jnp.array([advantage]), logp, 0.0, 0.2))


print("term for (0.5, -2):", one_term(buggy_loss_1, 0.5, -2.0), "| expected -1.6")


# %% [markdown]
# **Your diagnosis** (write it here), then fix the copy below and run the check.
#
# *Diagnosis:* 

# %%
def fixed_loss_1(logits, old_logp, actions, advantages, ref_logp, beta=0.1, epsilon=0.2):
    logp = jax.nn.log_softmax(logits)
    ratio = jnp.exp(logp[actions] - jax.lax.stop_gradient(old_logp))
    advantages = jax.lax.stop_gradient(advantages)
    clipped = jnp.clip(ratio, 1.0 - epsilon, 1.0 + epsilon)
    # the min is taken over the RATIOS, then multiplied by A: the sign of A no longer picks the bound
    surrogate = jnp.mean(jnp.minimum(ratio, clipped) * advantages)
    kl = jnp.sum(jnp.exp(logp) * (logp - jax.lax.stop_gradient(ref_logp)))
    return -surrogate + beta * kl


# %%
report("bug 1", [one_term(fixed_loss_1, r, a) for r, a in [(0.5, -2.0), (1.5, 2.0), (1.1, -1.0)]],
       [one_term(reference_loss, r, a) for r, a in [(0.5, -2.0), (1.5, 2.0), (1.1, -1.0)]])


# %% [markdown]
# ## Bug 2: the clip never binds
#
# **Symptom.** The probe reuses one batch for 1, 2 and 3 inner steps at a large learning rate and
# prints how far the batch's ratios end up from 1. With the clip working, extra inner steps on the
# same batch cannot push them much further (the library's rollout even pulls back, through the
# KL term); here they keep growing, as if there were no clip at all.

# %%
def buggy_update_2(logits, draw_key, rewards, ref_logp, *, batch_size, epochs, beta, epsilon,
                   learning_rate):
    logits = jnp.asarray(logits, jnp.float32)
    old_logp_all = jax.nn.log_softmax(logits)
    actions = jax.random.categorical(draw_key, old_logp_all, shape=(batch_size,))
    advantages = rewards[actions] - jnp.sum(jnp.exp(old_logp_all) * rewards)
    for _ in range(epochs):
        old_logp = jax.nn.log_softmax(logits)[actions]  # recomputed every inner step: the ratio is always 1
        _, grad = ppo_step(logits, old_logp, actions, advantages, ref_logp, beta, epsilon)
        logits = logits - learning_rate * grad
    return logits


# %%
def reference_update(logits, draw_key, rewards, ref_logp, *, batch_size, epochs, beta, epsilon, learning_rate):
    """The correct rollout (old log-probabilities and advantages frozen once, KL to the fixed reference)."""
    logits = jnp.asarray(logits, jnp.float32)
    old_all = jax.nn.log_softmax(logits)
    actions = jax.random.categorical(draw_key, old_all, shape=(batch_size,))
    old_logp, advantages = old_all[actions], rewards[actions] - jnp.sum(jnp.exp(old_all) * rewards)
    for _ in range(epochs):
        logits = logits - learning_rate * ppo_step(logits, old_logp, actions, advantages, ref_logp, beta, epsilon)[1]
    return logits


# %%
hyper = dict(batch_size=32, epochs=3, beta=0.2, epsilon=0.2, learning_rate=1.0)


def ratios_per_step(update, key=jax.random.key(1)):
    # run 1, 2 and 3 inner steps: the ratios of the batch's samples after each, against the batch's old policy
    old_all = jax.nn.log_softmax(init_logits)
    actions = jax.random.categorical(key, old_all, shape=(32,))
    rows = []
    for epochs in (1, 2, 3):
        new = update(init_logits, key, rewards, ref_logp, **{**hyper, "epochs": epochs})
        rows.append(float(jnp.max(jnp.abs(jnp.exp(jax.nn.log_softmax(new)[actions] - old_all[actions]) - 1))))
    return np.array(rows)


print("largest |ratio - 1| after 1, 2, 3 inner steps:", np.round(ratios_per_step(buggy_update_2), 4))
print("the library's rollout:", np.round(ratios_per_step(lambda *a, **k: reference_update(*a, **k)), 4))


# %% [markdown]
# **Your diagnosis**, then fix the copy below.
#
# *Diagnosis:* 

# %%
def fixed_update_2(logits, draw_key, rewards, ref_logp, *, batch_size, epochs, beta, epsilon,
                   learning_rate):
    logits = jnp.asarray(logits, jnp.float32)
    old_logp_all = jax.nn.log_softmax(logits)
    actions = jax.random.categorical(draw_key, old_logp_all, shape=(batch_size,))
    advantages = rewards[actions] - jnp.sum(jnp.exp(old_logp_all) * rewards)
    for _ in range(epochs):
        old_logp = jax.nn.log_softmax(logits)[actions]  # recomputed every inner step: the ratio is always 1
        _, grad = ppo_step(logits, old_logp, actions, advantages, ref_logp, beta, epsilon)
        logits = logits - learning_rate * grad
    return logits


# %%
report("bug 2", fixed_update_2(init_logits, jax.random.key(1), rewards, ref_logp, **hyper),
       reference_update(init_logits, jax.random.key(1), rewards, ref_logp, **hyper))


# %% [markdown]
# ## Bug 3: the policy drifts and the KL says nothing
#
# **Symptom.** The probe starts from a reference far from the policy. One inner step with a large β
# should pull the policy towards the reference; this update pulls it somewhere else.

# %%
def buggy_update_3(logits, draw_key, rewards, ref_logp, *, batch_size, epochs, beta, epsilon,
                   learning_rate):
    logits = jnp.asarray(logits, jnp.float32)
    old_logp_all = jax.nn.log_softmax(logits)
    actions = jax.random.categorical(draw_key, old_logp_all, shape=(batch_size,))
    old_logp = old_logp_all[actions]
    advantages = rewards[actions] - jnp.sum(jnp.exp(old_logp_all) * rewards)
    for _ in range(epochs):
        # the behaviour policy is passed where the reference belongs
        _, grad = ppo_step(logits, old_logp, actions, advantages, old_logp_all, beta, epsilon)
        logits = logits - learning_rate * grad
    return logits


# %%
far_ref = jax.nn.log_softmax(jnp.array([-1.0, 0.5, 1.0]))
one = dict(batch_size=32, epochs=1, beta=0.5, epsilon=0.2, learning_rate=1.0)
print("buggy:    ", np.round(np.asarray(buggy_update_3(init_logits, jax.random.key(2), rewards, far_ref, **one)), 4))
print("reference:", np.round(np.asarray(reference_update(init_logits, jax.random.key(2), rewards, far_ref, **one)), 4))


# %% [markdown]
# **Your diagnosis**, then fix the copy below.
#
# *Diagnosis:* 

# %%
def fixed_update_3(logits, draw_key, rewards, ref_logp, *, batch_size, epochs, beta, epsilon,
                   learning_rate):
    logits = jnp.asarray(logits, jnp.float32)
    old_logp_all = jax.nn.log_softmax(logits)
    actions = jax.random.categorical(draw_key, old_logp_all, shape=(batch_size,))
    old_logp = old_logp_all[actions]
    advantages = rewards[actions] - jnp.sum(jnp.exp(old_logp_all) * rewards)
    for _ in range(epochs):
        # the behaviour policy is passed where the reference belongs
        _, grad = ppo_step(logits, old_logp, actions, advantages, old_logp_all, beta, epsilon)
        logits = logits - learning_rate * grad
    return logits


# %%
report("bug 3", fixed_update_3(init_logits, jax.random.key(2), rewards, far_ref, **one),
       reference_update(init_logits, jax.random.key(2), rewards, far_ref, **one))


# %% [markdown]
# ## Bug 4: gradients where there should be none
#
# **Symptom.** The advantages are constants of the update, but the probe finds a gradient with
# respect to them.

# %%
def buggy_loss_4(logits, old_logp, actions, advantages, ref_logp, beta=0.1, epsilon=0.2):
    logp = jax.nn.log_softmax(logits)
    ratio = jnp.exp(logp[actions] - jax.lax.stop_gradient(old_logp))
    clipped = jnp.clip(ratio, 1.0 - epsilon, 1.0 + epsilon)
    surrogate = jnp.mean(jnp.minimum(ratio * advantages, clipped * advantages))  # advantages not detached
    kl = jnp.sum(jnp.exp(logp) * (logp - jax.lax.stop_gradient(ref_logp)))
    return -surrogate + beta * kl


# %%
batch = (init_logits, jnp.log(jnp.array([0.3, 0.3])), jnp.array([0, 1]), jnp.array([1.0, -1.0]), ref_logp, 0.1, 0.2)
print("d loss / d advantages:", np.asarray(jax.grad(buggy_loss_4, argnums=3)(*batch)))


# %% [markdown]
# **Your diagnosis**, then fix the copy below.
#
# *Diagnosis:* 

# %%
def fixed_loss_4(logits, old_logp, actions, advantages, ref_logp, beta=0.1, epsilon=0.2):
    logp = jax.nn.log_softmax(logits)
    ratio = jnp.exp(logp[actions] - jax.lax.stop_gradient(old_logp))
    clipped = jnp.clip(ratio, 1.0 - epsilon, 1.0 + epsilon)
    surrogate = jnp.mean(jnp.minimum(ratio * advantages, clipped * advantages))  # advantages not detached
    kl = jnp.sum(jnp.exp(logp) * (logp - jax.lax.stop_gradient(ref_logp)))
    return -surrogate + beta * kl


# %%
report("bug 4 (gradient w.r.t. advantages)", jax.grad(fixed_loss_4, argnums=3)(*batch), np.zeros(2))
report("bug 4 (loss value)", fixed_loss_4(*batch), reference_loss(*batch))

# %% [markdown]
# ## Where to look next
#
# The debugging checklist at the end of `a2_ppo_rlhf/04_make_it_yours` lists these four and three
# more, each with the check that confirms it. If a check above still differs, compare your fix line by
# line with the formula in the notebook where that piece was built (bug 1 and 4: notebook 1; bugs 2
# and 3: notebook 3).
