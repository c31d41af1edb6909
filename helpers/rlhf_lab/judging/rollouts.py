"""Checks of ``a2_ppo_rlhf/03_rollouts``: one rollout update, the loop, and the recorded run."""
from __future__ import annotations

import numpy as np

from .core import Jax, Key, Source, check, close, equal, field, matches, to_float
from .procedures import LOOP_FORBID, check_update, fresh_update_inputs, loss_grad, trusted_run, trusted_update
from .registry import check as register

A, NB = "a2_ppo_rlhf", "03_rollouts.ipynb"

#: The recorded run of the lesson (40 rollouts of 128 samples, 3 epochs, beta = epsilon = 0.2).
RECORDED = {"initial_reward": 0.28191882371902466, "final_reward": 1.9185447692871094,
            "final_kl": 0.7824773192405701}

#: On the student's side: one rollout update, then the inputs as they are afterwards.
ROLLOUT_AND_INPUTS = Source('''
def rollout_and_inputs(logits, draw_key, rewards, ref_logp, rollout_update, **hyper):
    new_logits = rollout_update(jnp.asarray(logits), draw_key, rewards, ref_logp, **hyper)
    return {"new_logits": new_logits, "rewards": np.array(rewards, copy=True),
            "ref_logp": np.array(ref_logp, copy=True)}
''', "rollout_and_inputs")


def _rollout(student, inputs, hyper) -> dict:
    out = student.scenario(ROLLOUT_AND_INPUTS, ("rollout_update",), *inputs, **hyper)
    check(isinstance(out, dict) and "new_logits" in out, "rollout_update: the grader's procedure returned "
                                                         "something unexpected")
    return out


def distinguishing_inputs(rng, ref, mistakes, **options) -> tuple[tuple, dict]:
    """Fresh rollout inputs (:func:`fresh_update_inputs`) on which every listed mistake changes the result.

    A draw whose reference is so close to the starting policy that sampling from it picks the same
    actions (or whose mistakes all land within the tolerance of the trusted update) could not tell
    the mistake from a correct answer: it is drawn again, so the mistakes are named on every seed.
    """
    import jax

    for _ in range(50):
        inputs, hyper = fresh_update_inputs(rng, **options)
        logits, key, rewards, ref_logp = inputs
        draw = jax.random.key(key.seed)
        want = trusted_update(ref, logits, draw, rewards, ref_logp, **hyper)
        if not any(matches(trusted_update(ref, logits, draw, rewards, ref_logp, **hyper, mistake=m), want,
                           rtol=1e-4, atol=1e-5) for m in mistakes):
            return inputs, hyper
    raise RuntimeError("grader self-check: no rollout inputs that tell the mistakes apart")


@register("test_rollout_update_fresh", task="rollout_update", needs=("rollout_update",), forbid=LOOP_FORBID,
          assignment=A, notebook=NB)
def rollout_update_fresh(student, rng, ref):
    """Fresh logits, rewards, reference and key, 3 inner steps: the trusted procedure, every mistake named
    (the inputs are drawn again until each mistake changes the result, so it is named on every seed)."""
    mistakes = ["recompute_old", "kl_to_old", "no_baseline", "batch_mean_baseline", "recompute_advantages",
                "sample_reference", "one_step"]
    inputs, hyper = distinguishing_inputs(rng, ref, mistakes, epochs=3)
    out = _rollout(student, inputs, hyper)
    equal(out["ref_logp"], inputs[3], "ref_logp after rollout_update", hint="the reference must never change")
    equal(out["rewards"], inputs[2], "rewards after rollout_update", hint="the reward is frozen")
    check_update(ref, out["new_logits"], inputs, hyper, mistakes)


@register("test_old_logp_frozen", task="rollout_update", needs=("rollout_update",), forbid=LOOP_FORBID,
          assignment=A, notebook=NB)
def old_logp_frozen(student, rng, ref):
    """Start at the reference (old policy = reference), 3 inner steps: only the inner-loop freezing matters."""
    inputs, hyper = fresh_update_inputs(rng, epochs=3, start_at_reference=True)
    out = _rollout(student, inputs, hyper)
    check_update(ref, out["new_logits"], inputs, hyper, ["recompute_old", "recompute_advantages", "one_step"])


@register("test_kl_against_reference", task="rollout_update", needs=("rollout_update",), forbid=LOOP_FORBID,
          assignment=A, notebook=NB)
def kl_against_reference(student, rng, ref):
    """One inner step (frozen and recomputed old log-probs agree), a reference far away: only the KL anchor matters."""
    inputs, hyper = fresh_update_inputs(rng, epochs=1, beta_range=(0.5, 1.0))
    out = _rollout(student, inputs, hyper)
    equal(out["ref_logp"], inputs[3], "ref_logp after rollout_update", hint="the reference must never change")
    check_update(ref, out["new_logits"], inputs, hyper, ["kl_to_old", "no_baseline", "batch_mean_baseline",
                                                         "sample_reference"])


#: On the student's side: run the loop with an update that records what it is given and returns stand-ins.
#: The recording update is a JAX function, so an answer may call it, ``jax.jit`` it (with
#: ``static_argnames=("batch_size", "epochs")`` or not: it needs no static argument), ``jax.vmap`` or
#: differentiate it: what it is given is recorded by an ordered ``jax.debug.callback`` (once per call,
#: or per element under ``vmap``), and its result is the stand-in planned for the sampling key it
#: receives (``stand_ins[k]`` for ``planned_keys[k]``, the first one for a key that was not planned:
#: the check names a wrong key before the logits it leads to), the same logits the k-th call returned
#: before. Hyperparameters passed as Python values are recorded as they are; traced ones (a ``jit``
#: without static arguments) as the numbers they carry.
LOOP_WITH_RECORDER = Source('''
def loop_with_recorder(rewards, init_logits, stand_ins, planned_keys, run_ppo, **options):
    import functools

    calls = []
    stand_ins = jnp.asarray(stand_ins, jnp.float32)
    planned_keys = jnp.asarray(planned_keys, jnp.uint32)

    def record(static, logits, rewards, ref_logp, key, dynamic):
        numbers = {k: (np.asarray(v).item() if np.ndim(v) == 0 else np.asarray(v)) for k, v in dynamic.items()}
        calls.append({"logits": np.asarray(logits), "rewards": np.asarray(rewards),
                      "ref_logp": np.asarray(ref_logp), "key": np.asarray(key), "kwargs": {**static, **numbers}})

    def recording_update(logits, draw_key, rewards, ref_logp, **kwargs):
        if jnp.issubdtype(getattr(draw_key, "dtype", np.uint32), jax.dtypes.prng_key):
            key = jax.random.key_data(draw_key)
        else:
            key = jnp.asarray(draw_key)
        dynamic = {k: v for k, v in kwargs.items() if isinstance(v, (jax.Array, np.ndarray, np.generic))}
        static = {k: v for k, v in kwargs.items() if k not in dynamic}
        jax.debug.callback(functools.partial(record, static), logits, rewards, ref_logp, key, dynamic,
                           ordered=True)
        if key.shape != planned_keys.shape[1:]:
            return stand_ins[0]
        found = jnp.all(key.astype(jnp.uint32) == planned_keys, axis=-1)
        return stand_ins[jnp.argmax(found)]

    out = run_ppo(rewards, init_logits, update=recording_update, **options)
    jax.effects_barrier()
    return {"out": out, "calls": calls}
''', "loop_with_recorder")


@register("test_loop", task="run_ppo", needs=("run_ppo",), forbid=LOOP_FORBID, assignment=A, notebook=NB)
def loop(student, rng, ref):
    """run_ppo with a recording update: logits fed forward, one fresh subkey per rollout, the fixed
    reference, the hyperparameters passed on, and exact reward / KL / probabilities recorded."""
    import jax
    import jax.numpy as jnp

    n, T = 3, 4
    init = rng.normal(size=n).astype(np.float32)
    rewards = rng.normal(scale=1.5, size=n).astype(np.float32)
    seed = int(rng.integers(0, 2**31 - 1))
    hyper = dict(batch_size=int(rng.integers(8, 33)), epochs=int(rng.integers(1, 4)),  # only passed on
                 beta=float(rng.uniform(0.1, 0.4)), epsilon=float(rng.uniform(0.1, 0.3)),
                 learning_rate=float(rng.uniform(0.05, 0.3)))
    ref_logp = np.asarray(jax.nn.log_softmax(jnp.asarray(init)))
    # the plan: the logits and key each rollout should receive, and a stand-in result for each
    key, plan, current = jax.random.key(seed), [], init
    for _ in range(T):
        key, draw = jax.random.split(key)
        following = (current + rng.normal(scale=0.5, size=n)).astype(np.float32)
        plan.append((current, np.asarray(jax.random.key_data(draw)), following))
        current = following
    got = student.scenario(LOOP_WITH_RECORDER, ("run_ppo",), rewards, init, np.stack([p[2] for p in plan]),
                           np.stack([p[1] for p in plan]), iterations=T, seed=seed, **hyper)
    out, calls = got["out"], got["calls"]
    check(len(calls) == T, f"run_ppo must call its update argument once per rollout (the tests pass their own "
                           f"update): {T} rollouts, {len(calls)} calls")
    for k, call in enumerate(calls):
        close(call["logits"], plan[k][0], f"logits passed to update on rollout {k}", rtol=1e-6, atol=1e-6,
              hint="start from init_logits and feed each rollout's result into the next")
        if not matches(call["ref_logp"], ref_logp, rtol=1e-6, atol=1e-6):
            check(not matches(call["ref_logp"], np.asarray(jax.nn.log_softmax(plan[k][0])), rtol=1e-6, atol=1e-6),
                  "run_ppo: KL measured against the old policy, not the reference: the reference "
                  "must stay log_softmax(init_logits) for the whole run")
        close(call["ref_logp"], ref_logp, f"ref_logp passed to update on rollout {k}", rtol=1e-6, atol=1e-6,
              hint="the reference is log_softmax(init_logits), computed once and never refreshed")
        close(call["rewards"], rewards, f"rewards passed to update on rollout {k}")
        equal(call["key"], plan[k][1], f"sampling key passed to update on rollout {k}",
              hint="start from jax.random.key(seed) and split once per rollout: key, draw = jax.random.split(key); "
                   "pass draw")
        for name, value in hyper.items():
            passed = call["kwargs"].get(name)
            check(name in call["kwargs"] and matches(passed, value, rtol=1e-6, atol=0.0),
                  f"run_ppo must pass {name}={value} to update (got {passed!r})")
    logps = [jax.nn.log_softmax(jnp.asarray(p[2])) for p in plan]
    close(field(out, "reward", "run_ppo"), [ref.expected_reward(lp, rewards) for lp in logps],
          "exact expected reward after each rollout", rtol=1e-5, atol=1e-6,
          hint="record sum_a pi(a) r(a) of the policy returned by each rollout")
    close(field(out, "kl", "run_ppo"), [ref.categorical_kl(lp, ref_logp) for lp in logps],
          "exact KL after each rollout", rtol=1e-5, atol=1e-6, hint="record KL(pi || pi_ref) of each rollout's result")
    close(field(out, "probs", "run_ppo"), [np.exp(np.asarray(lp)) for lp in logps],
          "action probabilities after each rollout", rtol=1e-5, atol=1e-6)
    close(field(out, "final_logits", "run_ppo"), plan[-1][2], "final logits", rtol=1e-6, atol=1e-6)
    close(field(out, "ref_logp", "run_ppo"), ref_logp, "ref_logp returned by run_ppo", rtol=1e-6, atol=1e-6)
    close(field(out, "initial_reward", "run_ppo"), ref.expected_reward(ref_logp, rewards),
          "initial_reward (expected reward of the reference)", rtol=1e-5, atol=1e-6)


#: The grader's own rollout update, handed to the student's run_ppo so that the loop is graded on its
#: own: a mistake in rollout_update costs the rollout tests, not these points as well. A JAX function:
#: ``jax.jit`` of it works with ``static_argnames=("batch_size", "epochs")`` (the batch size is a shape),
#: ``jax.vmap`` over logits or keys and ``jax.grad`` / ``jax.jacrev`` with respect to the logits too.
#: An answer that ignores it and calls its own update is caught by test_loop (no recorded calls).
TRUSTED_UPDATE = Source('''
def trusted_update(logits, draw_key, rewards, ref_logp, *, batch_size, epochs, beta, epsilon, learning_rate):
    from rlhf_lab import ppo_loss
    grad = trusted_update.__dict__.get("grad")
    if grad is None:
        grad = trusted_update.__dict__["grad"] = jax.jit(jax.grad(ppo_loss))
    logits = jnp.asarray(logits, jnp.float32)
    rewards = jnp.asarray(rewards, jnp.float32)
    ref_logp = jnp.asarray(ref_logp, jnp.float32)
    behaviour_logp = jax.nn.log_softmax(logits)
    actions = jax.random.categorical(draw_key, behaviour_logp, shape=(batch_size,))
    old_logp = behaviour_logp[actions]
    advantages = rewards[actions] - jnp.sum(jnp.exp(behaviour_logp) * rewards)
    for _ in range(epochs):
        logits = logits - learning_rate * grad(logits, old_logp, actions, advantages, ref_logp, beta, epsilon)
    return logits
''', "trusted_update")

LESSON_INIT = np.array([0.2, 0.0, -0.2], np.float32)


@register("test_recorded_numbers", task="run_ppo", needs=("run_ppo",), forbid=LOOP_FORBID,
          assignment=A, notebook=NB)
def recorded_numbers(student, rng, ref):
    """run_ppo with the grader's rollout update reproduces the recorded run, and a fresh short run matches."""
    from rlhf_lab.trainer import lesson_rewards

    run = student.call("run_ppo", Jax(np.asarray(lesson_rewards(), np.float32)), LESSON_INIT,
                       update=TRUSTED_UPDATE)
    close(field(run, "initial_reward", "run"), RECORDED["initial_reward"], "initial expected reward",
          rtol=0.0, atol=1e-5)
    close(to_float(field(run, "reward", "run"), "run['reward']")[-1], RECORDED["final_reward"],
          "final expected reward", rtol=0.0, atol=1e-5)
    close(to_float(field(run, "kl", "run"), "run['kl']")[-1], RECORDED["final_kl"],
          "final KL to the reference (nats)", rtol=0.0, atol=1e-5)
    n = 3
    init = rng.normal(size=n).astype(np.float32)
    rewards = rng.normal(scale=1.5, size=n).astype(np.float32)
    hyper = dict(batch_size=32, epochs=2, beta=float(rng.uniform(0.1, 0.4)),
                 epsilon=float(rng.uniform(0.1, 0.3)), learning_rate=float(rng.uniform(0.1, 0.5)))
    seed = int(rng.integers(0, 2**31 - 1))
    out = student.call("run_ppo", Jax(rewards), init, iterations=3, seed=seed, update=TRUSTED_UPDATE, **hyper)
    want_reward, want_kl, want_logits = trusted_run(ref, rewards, init, iterations=3, seed=seed, **hyper)
    close(field(out, "reward", "run_ppo"), want_reward, "expected reward per rollout on a fresh short run",
          rtol=1e-4, atol=1e-5, hint="compute the run; do not return recorded numbers")
    close(field(out, "kl", "run_ppo"), want_kl, "KL per rollout on a fresh short run", rtol=1e-4, atol=1e-5)
    close(field(out, "final_logits", "run_ppo"), want_logits, "final logits on a fresh short run",
          rtol=1e-4, atol=1e-5)


def reference_diagnostics(ref, logits, draw_key, rewards, ref_logp, *, batch_size, epochs, beta, epsilon,
                          learning_rate, mistake: str | None = None) -> dict:
    """The trusted rollout with its per-inner-epoch diagnostics (or one named ``mistake``).

    Before inner step e (at the logits whose gradient that step takes), with the ratio
    r_i = pi_theta(a_i) / pi_old(a_i) of the batch's samples: ``clip_frac[e]`` = mean(|r - 1| > eps),
    ``k1[e]`` = mean(-log r), ``k3[e]`` = mean((r - 1) - log r), ``exact_kl[e]`` = KL(pi_old || pi_theta)
    summed over all actions (the quantity k1 and k3 estimate, samples being drawn from pi_old),
    ``ratio[e]`` = the [batch_size] ratios. ``logits`` = the logits after the last step.
    Mistakes: ``after_step`` (measured after each step), ``k1_sign``, ``k3_sign``, ``kl_reversed``,
    ``clip_inside`` (counts the ratios inside the band), ``clip_binds`` (counts only the samples where
    the clip binds, ``A > 0`` and ``r > 1 + eps`` or ``A < 0`` and ``r < 1 - eps``: TRL's ``pg_clipfrac``).
    """
    import jax
    import jax.numpy as jnp

    logits = jnp.asarray(logits, jnp.float32)
    rewards = jnp.asarray(rewards, jnp.float32)
    ref_logp = jnp.asarray(ref_logp, jnp.float32)
    old_all = jax.nn.log_softmax(logits)
    actions = jax.random.categorical(draw_key, old_all, shape=(batch_size,))
    old_logp = old_all[actions]
    advantages = ref.exact_advantages(actions, rewards, old_all)
    grad = loss_grad(ref.ppo_loss)
    rows = {"clip_frac": [], "k1": [], "k3": [], "exact_kl": [], "ratio": []}

    def measure(z):
        logp_all = jax.nn.log_softmax(z)
        log_r = np.asarray(logp_all[actions] - old_logp, np.float64)
        r = np.exp(log_r)
        outside = np.abs(r - 1.0) > epsilon
        if mistake == "clip_binds":
            adv = np.asarray(advantages, np.float64)
            outside = ((adv > 0) & (r > 1.0 + epsilon)) | ((adv < 0) & (r < 1.0 - epsilon))
        rows["clip_frac"].append(float(np.mean(~outside if mistake == "clip_inside" else outside)))
        rows["k1"].append(float(np.mean(log_r if mistake == "k1_sign" else -log_r)))
        rows["k3"].append(float(np.mean((r - 1.0) + log_r if mistake == "k3_sign" else (r - 1.0) - log_r)))
        p_old, lp_old = np.exp(np.asarray(old_all, np.float64)), np.asarray(old_all, np.float64)
        lp = np.asarray(logp_all, np.float64)
        rows["exact_kl"].append(float(np.sum(np.exp(lp) * (lp - lp_old)) if mistake == "kl_reversed"
                                      else np.sum(p_old * (lp_old - lp))))
        rows["ratio"].append(r)

    for _ in range(epochs):
        if mistake != "after_step":
            measure(logits)
        logits = logits - learning_rate * grad(logits, old_logp, actions, advantages, ref_logp, beta, epsilon)
        if mistake == "after_step":
            measure(logits)
    out = {k: np.array(v) for k, v in rows.items()}
    out["logits"] = np.asarray(logits, np.float64)
    return out


#: The named mistakes of the diagnostics task, with the message a student sees.
DIAGNOSTIC_MISTAKES = {
    "after_step": "the metrics were measured AFTER each inner step: measure before the step, at the logits "
                  "whose gradient it takes (then the first ratio is exactly 1)",
    "k1_sign": "k1 has the wrong sign: k1 = mean(-log r) with r = pi_theta / pi_old",
    "k3_sign": "k3 = mean((r - 1) - log r): the log term is subtracted",
    "kl_reversed": "exact_kl is reversed: k1 and k3 estimate KL(pi_old || pi_theta) = sum_a pi_old(a) "
                   "(log pi_old(a) - log pi_theta(a)), the samples come from pi_old",
    "clip_inside": "the clip fraction counts the ratios INSIDE the band: count those with |r - 1| > epsilon",
    "clip_binds": "the clip fraction counts only the samples where the clip binds (TRL's pg_clipfrac: outside "
                  "the band on the side the advantage pushes towards); clip_frac is the share of ALL samples "
                  "outside the band, mean(|r - 1| > epsilon), on either side",
}

#: The lesson's batch (03_rollouts' diagnostics cell): the lesson's start and rewards, key 1, 32 samples,
#: 4 inner steps at learning rate 1.0. From the second step on every ratio is outside the band but the
#: clip binds on only some of them, so the two definitions of the clip fraction differ on every draw.
LESSON_DIAGNOSTICS = dict(batch_size=32, epochs=4, beta=0.2, epsilon=0.2, learning_rate=1.0)


@register("test_inner_diagnostics", task="inner_diagnostics", needs=("inner_diagnostics",),
          forbid=LOOP_FORBID + ("clip_fraction",), assignment=A, notebook=NB)
def inner_diagnostics(student, rng, ref):
    """Fresh rollout, 4 inner steps: the first ratios are exactly 1, every metric per epoch matches the
    trusted procedure, and each named mistake (measured after the step, signs, KL direction) is told.
    Then the lesson's batch, where the share outside the band (clip_frac) and the share where the clip
    binds (TRL's pg_clipfrac) always differ: counting the second is named on every draw."""
    import jax

    inputs, hyper = fresh_update_inputs(rng, epochs=4)
    hyper["learning_rate"] = float(rng.uniform(1.0, 2.0))  # large enough that the clip binds from step 2
    out = student.call("inner_diagnostics", Jax(inputs[0]), inputs[1], Jax(inputs[2]), Jax(inputs[3]), **hyper)
    key = jax.random.key(inputs[1].seed)
    want = reference_diagnostics(ref, inputs[0], key, inputs[2], inputs[3], **hyper)
    ratio = to_float(field(out, "ratio", "inner_diagnostics"), "inner_diagnostics['ratio']")
    check(ratio.shape == want["ratio"].shape,
          f"inner_diagnostics['ratio'] must be [epochs, batch_size] = {list(want['ratio'].shape)}, "
          f"got {list(ratio.shape)}")
    for name in ("clip_frac", "k1", "k3", "exact_kl", "ratio"):
        got = to_float(field(out, name, "inner_diagnostics"), f"inner_diagnostics[{name!r}]")
        if not matches(got, want[name], rtol=1e-4, atol=1e-5):
            for mistake, message in DIAGNOSTIC_MISTAKES.items():
                wrong = reference_diagnostics(ref, inputs[0], key, inputs[2], inputs[3], **hyper, mistake=mistake)
                check(not matches(got, wrong[name], rtol=1e-4, atol=1e-5), f"inner_diagnostics: {message}")
        close(got, want[name], f"{name} per inner epoch on a fresh rollout", rtol=1e-4, atol=1e-5)
    equal(ratio[0], np.ones(hyper["batch_size"]), "the ratios at the first inner step",
          hint="before the first step pi_theta IS pi_old: compute both log-probabilities the same way "
               "so exp(logp - old_logp) is exactly 1")
    close(field(out, "logits", "inner_diagnostics"), want["logits"], "logits after the inner steps",
          rtol=1e-4, atol=1e-5, hint="the diagnostics must not change the update: same steps as rollout_update")
    # the lesson's batch, where counting the samples the clip binds on differs from counting those outside
    # the band (a fresh rollout may have no sample outside the band on the side the clip leaves alone),
    # and the KL is large enough that its two directions differ beyond the tolerance (on a fresh rollout
    # whose policy barely moves they agree to third order)
    from rlhf_lab.trainer import lesson_rewards

    rewards = np.asarray(lesson_rewards(), np.float32)
    ref_logp = np.asarray(jax.nn.log_softmax(LESSON_INIT))
    lesson = reference_diagnostics(ref, LESSON_INIT, jax.random.key(1), rewards, ref_logp, **LESSON_DIAGNOSTICS)
    binds = reference_diagnostics(ref, LESSON_INIT, jax.random.key(1), rewards, ref_logp, **LESSON_DIAGNOSTICS,
                                  mistake="clip_binds")
    check(not matches(lesson["clip_frac"], binds["clip_frac"]), "grader self-check (the lesson's clip fractions)")
    out = student.call("inner_diagnostics", Jax(LESSON_INIT), Key(1), Jax(rewards), Jax(ref_logp), **LESSON_DIAGNOSTICS)
    wrongs = {m: reference_diagnostics(ref, LESSON_INIT, jax.random.key(1), rewards, ref_logp, **LESSON_DIAGNOSTICS,
                                       mistake=m) for m in DIAGNOSTIC_MISTAKES}
    for name in ("clip_frac", "k1", "k3", "exact_kl", "ratio"):
        got = to_float(field(out, name, "inner_diagnostics"), f"inner_diagnostics[{name!r}]")
        if not matches(got, lesson[name], rtol=1e-4, atol=1e-5):
            for mistake, message in DIAGNOSTIC_MISTAKES.items():
                check(not matches(got, wrongs[mistake][name], rtol=1e-4, atol=1e-5), f"inner_diagnostics: {message}")
        close(got, lesson[name], f"{name} per inner epoch on the lesson's batch (key 1, learning rate 1.0)",
              rtol=1e-4, atol=1e-5, hint="clip_frac = mean(|r - 1| > epsilon) before each inner step"
              if name == "clip_frac" else "")
