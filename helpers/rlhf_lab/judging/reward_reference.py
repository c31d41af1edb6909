"""Checks of ``a2_ppo_rlhf/02_reward_and_reference``: fitting the reward model, freezing the reference."""
from __future__ import annotations

import numpy as np

from .core import Source, check, close, equal, matches, pair
from .registry import ALL
from .registry import check as register

A, NB = "a2_ppo_rlhf", "02_reward_and_reference.ipynb"
FIT_FORBID = ("fit_reward", "_fit", "lesson_rewards", "_lesson_rewards_np")

LESSON_FEATURES = np.array([[1.0, 0.0], [0.0, 1.0], [-1.0, -1.0]], np.float32)
LESSON_CHOSEN, LESSON_REJECTED = np.array([0, 0, 1]), np.array([1, 2, 2])
LESSON_REWARDS = [1.9811294, 0.327278, -2.3084073]


@register("test_fit_reward_lesson", task="fit_reward_model", needs=("rewards", "reward_w", "fit_reward_model"),
          forbid=FIT_FORBID, assignment=A, notebook=NB)
def fit_reward_lesson(student, rng, ref):
    """The notebook's fit reproduces the recorded rewards; a short fit through the grader matches too."""
    want = ref.fit_reward(LESSON_FEATURES, LESSON_CHOSEN, LESSON_REJECTED, steps=100, learning_rate=0.1)
    rewards = student.value("rewards")
    close(rewards, want.rewards, "rewards fitted on the lesson's preferences", rtol=1e-5, atol=1e-5)
    close(rewards, LESSON_REWARDS, "the lesson's recorded rewards", rtol=0.0, atol=1e-5)
    close(student.value("reward_w"), want.weights, "reward weights fitted on the lesson's preferences",
          rtol=1e-5, atol=1e-5)
    out = pair(student.call("fit_reward_model", LESSON_FEATURES, LESSON_CHOSEN, LESSON_REJECTED, steps=7,
                            learning_rate=0.1), "fit_reward_model")
    short = ref.fit_reward(LESSON_FEATURES, LESSON_CHOSEN, LESSON_REJECTED, steps=7, learning_rate=0.1)
    close(out[1], short.rewards, "rewards after 7 steps on the lesson's data", rtol=1e-4, atol=1e-5,
          hint="run exactly `steps` gradient-descent steps from w = 0")


@register("test_fit_reward_fresh", task="fit_reward_model", needs=("fit_reward_model",), forbid=FIT_FORBID,
          assignment=A, notebook=NB)
def fit_reward_fresh(student, rng, ref):
    """Fresh preference data, steps and learning rate; ignored arguments and an off-by-one are named."""
    n, d, pairs = 3, 2, 3
    features = rng.normal(size=(n, d)).astype(np.float32)
    chosen = rng.integers(0, n, size=pairs)
    rejected = (chosen + rng.integers(1, n, size=pairs)) % n
    steps, lr = int(rng.integers(6, 12)), float(rng.uniform(0.2, 0.6))
    out = pair(student.call("fit_reward_model", features, chosen, rejected, steps=steps, learning_rate=lr),
               "fit_reward_model")
    want = ref.fit_reward(features, chosen, rejected, steps=steps, learning_rate=lr)
    if not matches(out[0], want.weights, rtol=1e-4, atol=1e-5):
        for message, wrong in {
            "the steps argument was ignored (100 steps were run)":
                ref.fit_reward(features, chosen, rejected, steps=100, learning_rate=lr).weights,
            "the learning_rate argument was ignored (0.1 was used)":
                ref.fit_reward(features, chosen, rejected, steps=steps, learning_rate=0.1).weights,
            "one gradient step too few": ref.fit_reward(features, chosen, rejected, steps=steps - 1,
                                                        learning_rate=lr).weights,
        }.items():
            check(not matches(out[0], wrong, rtol=1e-4, atol=1e-5), "fit_reward_model: " + message)
    close(out[0], want.weights, f"weights after {steps} steps at lr {lr:.3f} on fresh data",
          rtol=1e-4, atol=1e-5, hint="gradient DESCENT on preference_loss from w = 0")
    close(out[1], want.rewards, "per-action rewards on fresh data", rtol=1e-4, atol=1e-5,
          hint="the rewards are features @ w for every action")


#: On the student's side: snapshot the parameters, then update them in place as the given optimiser does.
#: The parameters are copied into a 64-byte aligned buffer first: JAX on CPU wraps such a NumPy buffer
#: without copying it, so ``jnp.asarray(params)`` (or ``jax.device_put``) shares memory with the
#: parameters on every draw, as it may in the notebook, and the in-place update shows it.
SNAPSHOT_THEN_UPDATE = Source('''
def snapshot_then_update(params, grad, snapshot_reference):
    values = np.asarray(params, dtype=np.float32)
    buffer = np.empty(values.size + 16, dtype=np.float32)
    start = (-buffer.ctypes.data % 64) // buffer.itemsize
    params = buffer[start:start + values.size]
    params[...] = values
    snap = snapshot_reference(params)
    params_after_call = params.copy()
    frozen = np.array(snap, dtype=np.float64, copy=True)
    params += np.float32(0.5) * grad   # the given optimiser's step: in place, like theta += lr * grad
    params *= np.float32(3.0)
    return {"params_after_call": params_after_call, "snapshot": frozen,
            "snapshot_after_update": np.array(snap, dtype=np.float64, copy=True),
            "snapshot_dtype": str(getattr(snap, "dtype", type(snap).__name__))}
''', "snapshot_then_update")


@register("test_reference_snapshot", task="snapshot_reference", needs=("snapshot_reference",), forbid=ALL,
          assignment=A, notebook=NB)
def reference_snapshot(student, rng, ref):
    """Fresh NumPy float32 parameters in a 64-byte aligned buffer: the snapshot holds their values, leaves
    them untouched, does not move when the given optimiser updates them in place (the array itself, a
    view, a slice, np.asarray or jnp.asarray of it aliases the buffer), and is float32 as asked."""
    n = 3
    params = rng.normal(size=n).astype(np.float32)
    grad = rng.normal(size=n).astype(np.float32)
    out = student.scenario(SNAPSHOT_THEN_UPDATE, ("snapshot_reference",), params, grad)
    check(isinstance(out, dict) and set(out) == {"params_after_call", "snapshot", "snapshot_after_update",
                                                 "snapshot_dtype"},
          "snapshot_reference: the grader's procedure returned something unexpected")
    equal(out["params_after_call"], params, "policy parameters after snapshot_reference",
          hint="snapshot_reference must not modify the parameters it copies")
    x = params.astype(np.float64)
    if not matches(out["snapshot"], x, rtol=1e-6, atol=1e-6):
        check(not matches(out["snapshot"], x - (np.max(x) + np.log(np.sum(np.exp(x - np.max(x))))),
                          rtol=1e-5, atol=1e-5),
              "snapshot_reference returned log-probabilities: return the reference PARAMETERS (a copy of the "
              "logits); the KL code takes log_softmax of them itself")
    close(out["snapshot"], x, "reference parameters right after the snapshot", rtol=1e-6, atol=1e-6,
          hint="return a copy of the parameters (the logits), unchanged")
    equal(out["snapshot_after_update"], out["snapshot"], "reference after in-place updates of the parameters",
          hint="the reference moved with the policy: it shares memory with the parameters (the array itself, "
               "a view, a slice, np.asarray or jnp.asarray of it: JAX may wrap a NumPy buffer without "
               "copying it); return an independent copy, e.g. params.copy()")
    check(out["snapshot_dtype"] == "float32",
          f"snapshot_reference must return float32 parameters, got {out['snapshot_dtype']}: keep the dtype "
          f"of the logits (np.array(params, dtype=np.float32, copy=True))")
