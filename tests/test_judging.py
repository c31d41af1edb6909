"""The hidden tests as library code (``rlhf_lab.judging``), checked outside any notebook.

* Every graded test cell of ``source/`` has exactly one registered check, and its hidden region is
  the one line that runs it.
* Each check passes a correct implementation (written here from the formulas, or the library's
  reference where the task is "reimplement the reference") and fails the classic mistakes with the
  message that names them, for both signs of the advantage where the sign matters.
* Plain data: what a check may receive from a student's code is numbers, arrays, bools, and
  tuples/lists/dicts of them; objects with their own comparison methods are refused.
"""
from __future__ import annotations

import json
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rlhf_lab import ppo, reward
from rlhf_lab.judging import CHECKS, core, procedures, rollouts
from rlhf_lab.judging.core import GradingError, Jax, Key, LocalStudent, Source

ROOT = Path(__file__).resolve().parents[1]
REF = core.library_reference()
#: The checks of the two bandit assignments (the sequence assignment's checks have their own tests).
BANDIT = sorted(n for n, c in CHECKS.items() if c.assignment in ("a1_ppo_objective", "a2_ppo_rlhf"))


def _run(name, namespace, seed=0):
    CHECKS[name].run(LocalStudent(namespace), np.random.default_rng(seed), REF)


def _fails(name, namespace, message, seed=0):
    with pytest.raises(GradingError) as err:
        _run(name, namespace, seed)
    assert message in str(err.value), str(err.value)
    return str(err.value)


# ------------------------------------------------------------------------------------------------
# correct implementations, from the formulas


def ppo_surrogate(ratio, advantage, epsilon=0.2, clip=True):
    ratio, advantage = jnp.asarray(ratio), jnp.asarray(advantage)
    if not clip:
        return ratio * advantage
    return jnp.minimum(ratio * advantage, jnp.clip(ratio, 1 - epsilon, 1 + epsilon) * advantage)


def surrogate_table(ratios, advantages, epsilon=0.2, surrogate=ppo_surrogate):
    unclipped = surrogate(ratios, advantages, epsilon, clip=False)
    clipped = surrogate(ratios, advantages, epsilon, clip=True)
    return unclipped, clipped, jnp.abs(jnp.asarray(unclipped) - jnp.asarray(clipped)) > 1e-6


def clip_boundary(epsilon, advantage, ratios=0.5 + 0.05 * np.arange(31), surrogate=ppo_surrogate):
    ratios = np.asarray(ratios, np.float32)
    div = np.abs(np.asarray(surrogate(ratios, advantage, epsilon, clip=False))
                 - np.asarray(surrogate(ratios, advantage, epsilon))) > 1e-6
    i = int(np.flatnonzero(div[1:] != div[:-1])[0])
    return float(ratios[i] if not div[i] else ratios[i + 1])


def kl_divergence(logits_p, logits_q):
    lp, lq = jax.nn.log_softmax(logits_p), jax.nn.log_softmax(logits_q)
    return jnp.sum(jnp.exp(lp) * (lp - lq))


def cap_numbers(ratio, advantage, epsilon=0.2, surrogate=ppo_surrogate):
    unclipped = float(surrogate(ratio, advantage, epsilon, clip=False))
    clipped = float(surrogate(ratio, advantage, epsilon, clip=True))
    return unclipped, clipped, unclipped - clipped


def surrogate_gradients(ratios, advantages, epsilon=0.2, surrogate=ppo.clipped_surrogate):
    return jax.vmap(jax.grad(lambda r, a: surrogate(r, a, epsilon)))(jnp.asarray(ratios), jnp.asarray(advantages))


def clipped_kl_loss(logits, old_logp, actions, advantages, ref_logits, beta, epsilon=0.2,
                    surrogate=ppo.clipped_surrogate, kl=kl_divergence):
    ratio = jnp.exp(jax.nn.log_softmax(logits)[actions] - old_logp)
    return -jnp.mean(surrogate(ratio, advantages, epsilon)) + beta * kl(logits, ref_logits)


def beta_sweep(reward_, kl, betas, penalize):
    penalised = penalize(reward_, betas, kl)
    return penalised, np.asarray(betas) * kl / reward_


def fit_reward_model(features, chosen_idx, rejected_idx, steps=100, learning_rate=0.1):
    fit = reward.fit_reward(features, chosen_idx, rejected_idx, steps=steps, learning_rate=learning_rate)
    return fit.weights, fit.rewards


def rollout_update(logits, draw_key, rewards, ref_logp, **hyper):
    return procedures.trusted_update(REF, logits, draw_key, rewards, ref_logp, **hyper)


def run_ppo(rewards, init_logits, *, iterations=40, batch_size=128, epochs=3, beta=0.2, epsilon=0.2,
            learning_rate=0.15, seed=11, update=rollout_update):
    logits = jnp.asarray(init_logits, jnp.float32)
    ref_logp = jax.nn.log_softmax(logits)
    key = jax.random.key(seed)
    hist = {"reward": [], "kl": [], "probs": []}
    for _ in range(iterations):
        key, draw = jax.random.split(key)
        logits = update(logits, draw, rewards, ref_logp, batch_size=batch_size, epochs=epochs, beta=beta,
                        epsilon=epsilon, learning_rate=learning_rate)
        logp = jax.nn.log_softmax(logits)
        hist["reward"].append(float(ppo.expected_reward(logp, rewards)))
        hist["kl"].append(float(ppo.categorical_kl(logp, ref_logp)))
        hist["probs"].append(np.exp(np.asarray(logp)))
    return {"reward": np.array(hist["reward"]), "kl": np.array(hist["kl"]), "probs": np.stack(hist["probs"]),
            "final_logits": np.asarray(logits), "ref_logp": np.asarray(ref_logp),
            "initial_reward": float(ppo.expected_reward(ref_logp, rewards))}


def inner_diagnostics(logits, draw_key, rewards, ref_logp, *, batch_size, epochs, beta, epsilon, learning_rate):
    logits = jnp.asarray(logits, jnp.float32)
    old_all = jax.nn.log_softmax(logits)
    actions = jax.random.categorical(draw_key, old_all, shape=(batch_size,))
    old_logp = old_all[actions]
    advantages = rewards[actions] - jnp.sum(jnp.exp(old_all) * rewards)
    grad = jax.grad(ppo.ppo_loss)
    out = {"clip_frac": [], "k1": [], "k3": [], "exact_kl": [], "ratio": []}
    for _ in range(epochs):
        logp_all = jax.nn.log_softmax(logits)
        r = jnp.exp(logp_all[actions] - old_logp)
        out["ratio"].append(np.asarray(r))
        out["clip_frac"].append(float(jnp.mean(jnp.abs(r - 1) > epsilon)))
        out["k1"].append(float(jnp.mean(-jnp.log(r))))
        out["k3"].append(float(jnp.mean(r - 1 - jnp.log(r))))
        out["exact_kl"].append(float(jnp.sum(jnp.exp(old_all) * (old_all - logp_all))))
        logits = logits - learning_rate * grad(logits, old_logp, actions, advantages, ref_logp, beta, epsilon)
    return {k: np.array(v) for k, v in out.items()} | {"logits": np.asarray(logits)}


def score_terms(logits, rewards, c):
    p = jnp.exp(jax.nn.log_softmax(logits))
    return (p * (rewards - c))[:, None] * (jnp.eye(p.shape[0]) - p[None, :])


def multi_prompt_ppo_loss(logits, old_logp, actions, advantages, ref_logp, beta, epsilon):
    logp = jax.nn.log_softmax(logits, axis=-1)
    ratio = jnp.exp(jnp.take_along_axis(logp, actions, axis=1) - jax.lax.stop_gradient(old_logp))
    adv = jax.lax.stop_gradient(advantages)
    terms = jnp.minimum(ratio * adv, jnp.clip(ratio, 1 - epsilon, 1 + epsilon) * adv)
    kl = jnp.sum(jnp.exp(logp) * (logp - ref_logp), axis=-1)
    return -jnp.mean(terms) + beta * jnp.mean(kl)


#: t_{0.975, n-1} for n = 2..12, from a printed table (not computed by scipy, the grader's source)
T_975 = {1: 12.7062, 2: 4.3027, 3: 3.1824, 4: 2.7764, 5: 2.5706, 6: 2.4469, 7: 2.3646, 8: 2.3060, 9: 2.2622,
         10: 2.2281, 11: 2.2010}


def seed_interval(values, quantile=None, ddof=1, root_n=True):
    x = np.asarray(values, np.float64)
    n = x.size
    q = T_975[n - 1] if quantile is None else quantile
    s = np.sqrt(np.sum((x - x.mean()) ** 2) / (n - ddof))
    half = q * s / (np.sqrt(n) if root_n else 1.0)
    return x.mean(), x.mean() - half, x.mean() + half


def optimum_frontier(ref_logp, rewards, betas):
    """Enumerated in float64 from the formula pi* = pi_ref exp(r / b) / Z (no library code)."""
    ref = np.asarray(ref_logp, np.float64)
    r = np.asarray(rewards, np.float64)
    kls, rs = [], []
    for b in np.asarray(betas, np.float64):
        w = np.exp(ref + r / b - np.max(ref + r / b))
        p = w / w.sum()
        kls.append(np.sum(p * (np.log(p) - ref)))
        rs.append(np.sum(p * r))
    return np.array(kls), np.array(rs)


RECORDED_RUN = {"initial_reward": 0.28191882, "reward": np.array([1.0, 1.9185448]), "kl": np.array([0.5, 0.7824773])}

CORRECT = {
    "ppo_surrogate": ppo_surrogate, "surrogate_table": surrogate_table, "clip_boundary": clip_boundary,
    "capped_ratio": 1.8, "capped_advantage": 1.5, "cap_numbers": cap_numbers, "kl_divergence": kl_divergence,
    "surrogate_gradients": surrogate_gradients, "clipped_kl_loss": clipped_kl_loss,
    "penalized_reward": lambda r, b, k: r - b * k, "beta_sweep": beta_sweep,
    "preference_loss": reward.preference_loss, "ppo_loss": ppo.ppo_loss,
    "rewards": np.array([1.9811294, 0.327278, -2.3084073]), "reward_w": None, "fit_reward_model": fit_reward_model,
    "snapshot_reference": lambda p: np.array(p, dtype=np.float32, copy=True),
    "rollout_update": rollout_update, "run_ppo": run_ppo, "run": RECORDED_RUN,
    "score_terms": score_terms, "inner_diagnostics": inner_diagnostics,
    "multi_prompt_ppo_loss": multi_prompt_ppo_loss, "analytic_optimum": ppo.optimal_logp,
    "regularised_objective": ppo.regularised_objective,
    "objective_reference": 0.28191882, "objective_trained": 1.7620493, "objective_optimum": 1.7987912,
    "seed_interval": seed_interval, "optimum_frontier": optimum_frontier,
}
LESSON = reward.fit_reward(np.array([[1.0, 0.0], [0.0, 1.0], [-1.0, -1.0]], np.float32), np.array([0, 0, 1]),
                           np.array([1, 2, 2]), steps=100, learning_rate=0.1)
CORRECT["reward_w"] = np.asarray(LESSON.weights)


def _with(**changes):
    return {**CORRECT, **changes}


# ------------------------------------------------------------------------------------------------
# the registry and the notebooks


def _test_cells():
    for path in sorted((ROOT / "source").glob("*/*.ipynb")):
        for cell in json.loads(path.read_text(encoding="utf-8"))["cells"]:
            meta = cell.get("metadata", {}).get("nbgrader", {})
            if cell["cell_type"] == "code" and meta.get("grade") and not meta.get("solution"):
                yield path, meta["grade_id"], "".join(cell["source"])


def test_every_test_cell_has_one_check_and_a_one_line_hidden_region():
    ids = []
    for path, gid, source in _test_cells():
        ids.append(gid)
        hidden = source.split("### BEGIN HIDDEN TESTS\n")[1].split("### END HIDDEN TESTS")[0]
        assert hidden == f'grading.judge("{gid}")\n', (path.name, gid, hidden)
        spec = CHECKS[gid]
        assert (spec.assignment, spec.notebook) == (path.parent.name, path.name), gid
    assert sorted(ids) == sorted(CHECKS)


def test_the_bandit_assignments_have_their_checks():
    count = {a: sum(CHECKS[n].assignment == a for n in BANDIT) for a in ("a1_ppo_objective", "a2_ppo_rlhf")}
    assert count["a1_ppo_objective"] == 9, count
    assert count["a2_ppo_rlhf"] == 22, count


@pytest.mark.parametrize("name", BANDIT)
def test_check_passes_a_correct_implementation(name):
    _run(name, CORRECT, seed=hash(name) % 1000)


@pytest.mark.parametrize("name", BANDIT)
def test_check_fails_when_what_it_needs_is_missing(name):
    spec = CHECKS[name]
    missing = {k: v for k, v in CORRECT.items() if k not in spec.needs}
    with pytest.raises(GradingError):
        _run(name, missing)


# ------------------------------------------------------------------------------------------------
# classic mistakes are named (both signs of the advantage where it matters)


def test_dropped_signed_min_is_named():
    def no_min(ratio, advantage, epsilon=0.2, clip=True):
        ratio = jnp.asarray(ratio)
        return ratio * advantage if not clip else jnp.clip(ratio, 1 - epsilon, 1 + epsilon) * advantage

    _fails("test_ppo_surrogate", _with(ppo_surrogate=no_min), "dropped the signed min")


def test_a_correct_surrogate_for_positive_advantages_only_fails():
    def positive_only(ratio, advantage, epsilon=0.2, clip=True):  # right for A > 0, wrong for A < 0
        ratio, advantage = jnp.asarray(ratio), jnp.asarray(advantage)
        if not clip:
            return ratio * advantage
        return jnp.minimum(ratio, 1 + epsilon) * advantage

    message = _fails("test_ppo_surrogate", _with(ppo_surrogate=positive_only), "ppo_surrogate")
    assert "bad action" in message or "sign" in message or "Clip bounds" in message


def test_answers_that_transform_the_graders_stand_ins_pass():
    """The surrogate and the penalty the checks pass in are JAX functions: vmap / jit of them works."""
    def vmapped_table(ratios, advantages, epsilon=0.2, surrogate=ppo_surrogate):
        r, a = jnp.broadcast_arrays(jnp.asarray(ratios, jnp.float32), jnp.asarray(advantages, jnp.float32))
        u = jax.vmap(lambda x, y: surrogate(x, y, epsilon, clip=False))(r, a)
        c = jax.jit(jax.vmap(lambda x, y: surrogate(x, y, epsilon, clip=True)))(r, a)
        return u, c, jnp.abs(u - c) > 1e-6

    def vmapped_sweep(reward_, kl, betas, penalize):
        betas = jnp.asarray(betas)
        return jax.vmap(lambda b: penalize(reward_, b, kl))(betas), betas * kl / reward_

    for seed in range(3):
        _run("test_surrogate_table", _with(surrogate_table=vmapped_table), seed)
        _run("test_beta_sweep", _with(beta_sweep=vmapped_sweep), seed)


def test_answers_that_ignore_the_function_they_are_given_fail():
    def own_surrogate(ratios, advantages, epsilon=0.2, surrogate=ppo_surrogate):
        return surrogate_table(ratios, advantages, epsilon, ppo_surrogate)

    def own_penalty(reward_, kl, betas, penalize):
        return beta_sweep(reward_, kl, betas, lambda r, b, k: r - b * k)

    def float_diverge(ratios, advantages, epsilon=0.2, surrogate=ppo_surrogate):
        u, c, d = surrogate_table(ratios, advantages, epsilon, surrogate)
        return u, c, jnp.asarray(d, jnp.float32)

    def own_boundary(epsilon, advantage, ratios=0.5 + 0.05 * np.arange(31), surrogate=ppo_surrogate):
        return clip_boundary(epsilon, advantage, ratios, ppo_surrogate)

    def own_numbers(ratio, advantage, epsilon=0.2, surrogate=ppo_surrogate):
        return cap_numbers(ratio, advantage, epsilon, ppo_surrogate)

    def own_gradients(ratios, advantages, epsilon=0.2, surrogate=ppo.clipped_surrogate):
        return surrogate_gradients(ratios, advantages, epsilon, ppo.clipped_surrogate)

    def own_kl(logits, old_logp, actions, advantages, ref_logits, beta, epsilon=0.2,
               surrogate=ppo.clipped_surrogate, kl=kl_divergence):
        return clipped_kl_loss(logits, old_logp, actions, advantages, ref_logits, beta, epsilon, surrogate,
                               kl_divergence)

    def own_update(rewards, init_logits, *, update=rollout_update, **options):
        return run_ppo(rewards, init_logits, update=rollout_update, **options)

    for seed in range(3):
        _fails("test_surrogate_table", _with(surrogate_table=own_surrogate), "call the surrogate argument", seed)
        _fails("test_beta_sweep", _with(beta_sweep=own_penalty), "call the penalize argument", seed)
        _fails("test_clip_boundary", _with(clip_boundary=own_boundary),
               "sweep with the surrogate argument, not ppo_surrogate", seed)
        _fails("test_capped_pair", _with(cap_numbers=own_numbers), "call the surrogate argument, not ppo_surrogate",
               seed)
        _fails("test_surrogate_gradients", _with(surrogate_gradients=own_gradients),
               "differentiate the surrogate argument", seed)
    _fails("test_clipped_kl_loss", _with(clipped_kl_loss=own_kl), "call the kl argument, not kl_divergence")
    _fails("test_loop", _with(run_ppo=own_update), "must call its update argument once per rollout")
    _fails("test_surrogate_table", _with(surrogate_table=float_diverge), "diverge must be a boolean array")


#: Every function a check hands to a student's function (the stand-ins), by the module that defines it.
STAND_INS = {"objective": ("TRUSTED_SURROGATE", "SCALED_SURROGATE", "WIDE_SURROGATE", "TRUSTED_PENALIZE",
                           "SCALED_PENALIZE", "TRUSTED_JAX_SURROGATE", "SCALED_JAX_SURROGATE", "TRUSTED_JAX_KL",
                           "SCALED_JAX_KL"),
             "rollouts": ("TRUSTED_UPDATE",)}
#: The procedures a check runs on the student's side with the student's functions (``student.scenario``):
#: trusted code that is not handed to the student (the recording update LOOP_WITH_RECORDER defines is, and is
#: tested through run_ppo below).
SCENARIOS = {"rollouts": ("ROLLOUT_AND_INPUTS", "LOOP_WITH_RECORDER"), "reward_reference": ("SNAPSHOT_THEN_UPDATE",)}


def test_every_source_of_the_checks_is_a_known_stand_in_or_scenario():
    """A new function written by a check must be listed above, so the JAX test below covers it."""
    import importlib
    import pkgutil

    import rlhf_lab.judging as judging

    for info in pkgutil.iter_modules(judging.__path__):
        module = importlib.import_module(f"rlhf_lab.judging.{info.name}")
        found = {n for n, v in vars(module).items() if isinstance(v, Source)}
        assert found == set(STAND_INS.get(info.name, ())) | set(SCENARIOS.get(info.name, ())), (info.name, found)


def test_every_stand_in_is_a_jax_function():
    """jit, vmap and grad of each stand-in work and agree with calling it (no NumPy inside)."""
    from rlhf_lab.judging import objective

    r = jnp.array([0.5, 0.9, 1.1, 1.6], jnp.float32)
    a = jnp.array([1.0, -1.0, 1.5, -0.5], jnp.float32)
    for name in STAND_INS["objective"]:
        fn = getattr(objective, name).build()
        if "SURROGATE" in name and "JAX" not in name:
            for clip in (True, False):
                eager = fn(r, a, 0.15, clip=clip)
                assert np.allclose(jax.jit(fn, static_argnames="clip")(r, a, 0.15, clip=clip), eager), name
                assert np.allclose(jax.vmap(lambda x, y: fn(x, y, 0.15, clip=clip))(r, a), eager), name
                assert np.isfinite(jax.grad(lambda x: jnp.sum(fn(x, a, 0.15, clip=clip)))(r)).all(), name
        elif "PENALIZE" in name:
            eager = fn(1.5, r, 0.7)
            assert np.allclose(jax.jit(fn)(1.5, r, 0.7), eager), name
            assert np.allclose(jax.vmap(lambda b: fn(1.5, b, 0.7))(r), eager), name
            assert np.isfinite(jax.grad(lambda b: jnp.sum(fn(1.5, b, 0.7)))(r)).all(), name
        elif "SURROGATE" in name:
            eager = fn(r, a, 0.15)
            assert np.allclose(jax.jit(fn)(r, a, 0.15), eager), name
            assert np.allclose(jax.jit(jax.vmap(jax.grad(fn)))(r, a), jax.grad(lambda x: jnp.sum(fn(x, a)))(r)), name
        else:  # the KL of two logit vectors
            p, q = jnp.array([0.3, -1.0, 0.5, 0.0]), jnp.array([0.0, 0.2, -0.4, 1.0])
            eager = fn(p, q)
            assert np.allclose(jax.jit(fn)(p, q), eager), name
            assert np.allclose(jax.vmap(fn)(jnp.stack([p, q]), jnp.stack([q, p])), [eager, fn(q, p)]), name
            assert np.isfinite(jax.grad(fn)(p, q)).all(), name
    update = rollouts.TRUSTED_UPDATE.build()
    hyper = dict(batch_size=16, epochs=2, beta=0.2, epsilon=0.2, learning_rate=0.5)
    logits, key = jnp.array([0.2, 0.0, -0.2]), jax.random.key(3)
    args = (jnp.array([1.0, 0.0, -1.0]), jax.nn.log_softmax(logits))
    eager = update(logits, key, *args, **hyper)
    assert np.allclose(jax.jit(update, static_argnames=("batch_size", "epochs"))(logits, key, *args, **hyper), eager)
    keys = jax.random.split(key, 2)
    assert np.allclose(jax.vmap(lambda k: update(logits, k, *args, **hyper))(keys)[0],
                       update(logits, keys[0], *args, **hyper))
    assert np.isfinite(jax.jacrev(lambda z: update(z, key, *args, **hyper))(logits)).all()


@pytest.mark.parametrize("transform", ["jit", "jit_static", "vmap", "grad"])
def test_a_loop_that_transforms_the_update_it_is_given_passes(transform):
    """The recording update test_loop hands to run_ppo, and the grader's update, are JAX functions too."""
    def wrap(update):
        if transform == "jit":
            return jax.jit(update)
        if transform == "jit_static":
            return jax.jit(update, static_argnames=("batch_size", "epochs"))
        if transform == "vmap":
            return lambda logits, *args, **hyper: jax.vmap(lambda z: update(z, *args, **hyper))(logits[None])[0]

        def differentiated(logits, *args, **hyper):  # the value and a reverse-mode pullback from one call
            value, pullback = jax.vjp(lambda z: update(z, *args, **hyper), jnp.asarray(logits, jnp.float32))
            assert np.isfinite(pullback(jnp.ones(3, jnp.float32))[0]).all()
            return value
        return differentiated

    def transforming(rewards, init_logits, *, update=rollout_update, **options):
        return run_ppo(rewards, init_logits, update=wrap(update), **options)

    _run("test_loop", _with(run_ppo=transforming), seed=1)
    if transform != "jit":  # the grader's own update samples batch_size actions: a shape, static under jit
        _run("test_recorded_numbers", _with(run_ppo=transforming), seed=1)


def test_kl_direction_and_log_space_are_named():
    _fails("test_kl_divergence", _with(kl_divergence=lambda p, q: kl_divergence(q, p)), "KL direction reversed")

    def log_of_softmax(p, q):
        sp, sq = jax.nn.softmax(p), jax.nn.softmax(q)
        return jnp.sum(sp * (jnp.log(sp) - jnp.log(sq)))

    _fails("test_kl_divergence", _with(kl_divergence=log_of_softmax), "log space")


def test_capped_pair_grades_the_numbers_of_the_cap():
    def reversed_lost(ratio, advantage, epsilon=0.2, surrogate=ppo_surrogate):
        u, c, _ = cap_numbers(ratio, advantage, epsilon, surrogate)
        return u, c, c - u

    def pair_only(ratio, advantage, epsilon=0.2, surrogate=ppo_surrogate):  # the printout's numbers, always
        return 2.7, 1.8, 0.9

    _fails("test_capped_pair", _with(cap_numbers=reversed_lost), "lost is unclipped - clipped")
    _fails("test_capped_pair", _with(cap_numbers=pair_only), "cap_numbers(ratio=")
    _fails("test_capped_pair", _with(capped_ratio=0.3, capped_advantage=-1.0), "advantage must be positive")


def test_gradient_column_is_exactly_zero_where_clipped():
    def unclipped_grad(ratios, advantages, epsilon=0.2, surrogate=ppo.clipped_surrogate):
        return jnp.asarray(advantages, jnp.float32)

    def mean_grad(ratios, advantages, epsilon=0.2, surrogate=ppo.clipped_surrogate):
        r, a = jnp.asarray(ratios), jnp.asarray(advantages)
        return jax.grad(lambda x: jnp.mean(surrogate(x, a, epsilon)))(r)

    def fixed_epsilon(ratios, advantages, epsilon=0.2, surrogate=ppo.clipped_surrogate):
        return surrogate_gradients(ratios, advantages, 0.2, surrogate)

    _fails("test_surrogate_gradients", _with(surrogate_gradients=unclipped_grad), "must have gradient exactly 0")
    _fails("test_surrogate_gradients", _with(surrogate_gradients=mean_grad), "not the mean")
    _fails("test_surrogate_gradients", _with(surrogate_gradients=fixed_epsilon), "surrogate_gradients on fresh cases")


def test_clipped_kl_loss_keeps_the_kl_gradient_when_every_term_is_clipped():
    def no_kl(logits, old_logp, actions, advantages, ref_logits, beta, epsilon=0.2,
              surrogate=ppo.clipped_surrogate, kl=kl_divergence):
        return clipped_kl_loss(logits, old_logp, actions, advantages, ref_logits, 0.0, epsilon, surrogate, kl)

    def plus_surrogate(logits, old_logp, actions, advantages, ref_logits, beta, epsilon=0.2,
                       surrogate=ppo.clipped_surrogate, kl=kl_divergence):
        ratio = jnp.exp(jax.nn.log_softmax(logits)[actions] - old_logp)
        return jnp.mean(surrogate(ratio, advantages, epsilon)) + beta * kl(logits, ref_logits)

    def library_loss(logits, old_logp, actions, advantages, ref_logits, beta, epsilon=0.2,
                     surrogate=ppo.clipped_surrogate, kl=kl_divergence):  # ignores the arguments it is given
        return ppo.ppo_loss(logits, old_logp, actions, advantages, jax.nn.log_softmax(ref_logits), beta, epsilon)

    def raw_logit_ratio(logits, old_logp, actions, advantages, ref_logits, beta, epsilon=0.2,
                        surrogate=ppo.clipped_surrogate, kl=kl_divergence):
        ratio = jnp.exp(jnp.asarray(logits)[actions] - old_logp)
        return -jnp.mean(surrogate(ratio, advantages, epsilon)) + beta * kl(logits, ref_logits)

    _fails("test_clipped_kl_loss", _with(clipped_kl_loss=no_kl), "The KL term is missing")
    _fails("test_clipped_kl_loss", _with(clipped_kl_loss=plus_surrogate), "MINUS the surrogate")
    _fails("test_clipped_kl_loss", _with(clipped_kl_loss=library_loss), "Call the surrogate argument")
    _fails("test_clipped_kl_loss", _with(clipped_kl_loss=raw_logit_ratio), "raw logits")


def test_penalty_sign_is_named():
    _fails("test_penalized_reward", _with(penalized_reward=lambda r, b, k: r + b * k), "SUBTRACTED")


def test_preference_margin_sign_is_named():
    def flipped(w, chosen, rejected):
        return jnp.mean(jax.nn.softplus((chosen - rejected) @ w))

    _fails("test_preference_loss", _with(preference_loss=flipped), "wrong sign")


def test_ppo_loss_without_stop_gradient_fails_the_detached_check_only():
    def leaky(logits, old_logp, actions, advantages, ref_logp, beta, epsilon):
        logp = jax.nn.log_softmax(logits)
        ratio = jnp.exp(logp[actions] - old_logp)
        terms = jnp.minimum(ratio * advantages, jnp.clip(ratio, 1 - epsilon, 1 + epsilon) * advantages)
        return -jnp.mean(terms) + beta * ppo.categorical_kl(logp, ref_logp)

    _run("test_ppo_loss_value_grad", _with(ppo_loss=leaky))
    _fails("test_ppo_loss_detached", _with(ppo_loss=leaky), "stop_gradient")


@pytest.mark.parametrize("mistake,check", [("recompute_old", "test_old_logp_frozen"),
                                           ("kl_to_old", "test_kl_against_reference"),
                                           ("sample_reference", "test_rollout_update_fresh")])
def test_rollout_mistakes_are_named(mistake, check):
    def wrong(logits, draw_key, rewards, ref_logp, **hyper):
        return procedures.trusted_update(REF, logits, draw_key, rewards, ref_logp, **hyper, mistake=mistake)

    _fails(check, _with(rollout_update=wrong), procedures.UPDATE_MISTAKES[mistake])


def test_a_reference_that_aliases_the_parameters_is_caught():
    # the natural answers that share the optimiser's buffer: the array itself, np.asarray, a view, a slice
    for alias in (lambda p: p, lambda p: np.asarray(p, dtype=np.float32), lambda p: p.view(), lambda p: p[:]):
        _fails("test_reference_snapshot", _with(snapshot_reference=alias), "shares memory with the parameters")
    # JAX wraps an aligned NumPy buffer without copying it: the check's buffer is aligned on every draw
    for seed in range(8):
        _fails("test_reference_snapshot", _with(snapshot_reference=jnp.asarray), "shares memory with the parameters",
               seed)
    _fails("test_reference_snapshot", _with(snapshot_reference=lambda p: np.array(p, np.float64)),
           "must return float32 parameters")

    def in_place(params):
        params -= np.log(np.sum(np.exp(params)))
        return params.copy()

    _fails("test_reference_snapshot", _with(snapshot_reference=in_place), "must not modify the parameters")
    _fails("test_reference_snapshot", _with(snapshot_reference=lambda p: np.array(jax.nn.log_softmax(p))),
           "returned log-probabilities")


@pytest.mark.parametrize("mistake", sorted(rollouts.DIAGNOSTIC_MISTAKES))
def test_diagnostics_mistakes_are_named(mistake):
    def wrong(logits, draw_key, rewards, ref_logp, **hyper):
        return rollouts.reference_diagnostics(REF, logits, draw_key, rewards, ref_logp, **hyper, mistake=mistake)

    _fails("test_inner_diagnostics", _with(inner_diagnostics=wrong), rollouts.DIAGNOSTIC_MISTAKES[mistake])


def test_diagnostics_that_change_the_update_fail():
    def one_step_more(logits, draw_key, rewards, ref_logp, *, epochs, **hyper):
        out = inner_diagnostics(logits, draw_key, rewards, ref_logp, epochs=epochs, **hyper)
        bigger = inner_diagnostics(logits, draw_key, rewards, ref_logp, epochs=epochs + 1, **hyper)
        return out | {"logits": bigger["logits"]}

    _fails("test_inner_diagnostics", _with(inner_diagnostics=one_step_more), "logits after the inner steps")


def test_loop_that_refreshes_the_reference_is_named():
    def refreshing(rewards, init_logits, *, iterations=40, seed=11, update=rollout_update, **hyper):
        logits, key, out = jnp.asarray(init_logits), jax.random.key(seed), {"reward": [], "kl": [], "probs": []}
        for _ in range(iterations):
            key, draw = jax.random.split(key)
            logits = update(logits, draw, rewards, jax.nn.log_softmax(logits), **hyper)
        return out

    _fails("test_loop", _with(run_ppo=refreshing), "KL measured against the old policy")


def test_hard_coded_recorded_numbers_fail_the_fresh_run():
    def hard_coded(*args, **kwargs):
        return RECORDED_RUN | {"final_logits": np.zeros(3)}

    _fails("test_recorded_numbers", _with(run_ppo=hard_coded), "fresh short run")


def test_the_loop_is_graded_with_the_graders_update_not_the_students():
    def broken_update(logits, draw_key, rewards, ref_logp, **hyper):
        raise ValueError("my rollout_update is still broken")

    # run_ppo defaults to the student's (broken) rollout_update, but the check hands it the grader's
    _run("test_recorded_numbers", _with(rollout_update=broken_update))


def test_optimum_overflow_is_named():
    _fails("test_optimum_log_space", _with(analytic_optimum=lambda ref, r, b: jnp.log(
        jax.nn.softmax(ref) * jnp.exp(r / b) / jnp.sum(jax.nn.softmax(ref) * jnp.exp(r / b)))), "log space")


def test_seed_interval_model_answer_matches_the_printed_t_table():
    # 1, 2, 3, 4: mean 2.5, s = 1.29099, t_{0.975, 3} = 3.1824 -> half-width 2.0543 (by hand)
    mean, low, high = seed_interval(np.array([1.0, 2.0, 3.0, 4.0]))
    assert (mean, round(low, 3), round(high, 3)) == (2.5, 0.446, 4.554)
    _run("test_seed_interval", CORRECT, seed=4)


@pytest.mark.parametrize("wrong,message", [
    (lambda v: seed_interval(v, ddof=0), "not the population one (ddof=0)"),
    (lambda v: seed_interval(v, quantile=1.959964), "not the normal 1.96"),
    (lambda v: seed_interval(v, root_n=False), "divide the standard deviation by sqrt(n)"),
    (lambda v: seed_interval(v, quantile=T_975[len(v)]), "n - 1 degrees of freedom, not n"),
])
def test_seed_interval_mistakes_are_named(wrong, message):
    _fails("test_seed_interval", _with(seed_interval=wrong), message)


def test_seed_interval_that_returns_one_number_fails():
    _fails("test_seed_interval", _with(seed_interval=lambda v: float(np.mean(v))), "the three numbers")


def _frontier_with(kl_of=None, reward_of=None, beta_map=lambda b: b):
    """A frontier built from the float64 formula with one piece changed, as a student might."""
    def frontier(ref_logp, rewards, betas):
        ref = np.asarray(ref_logp, np.float64)
        r = np.asarray(rewards, np.float64)
        kls, rs = [], []
        for b in np.asarray(betas, np.float64):
            z = ref + r / beta_map(b)
            p = np.exp(z - np.logaddexp.reduce(z))
            kls.append(kl_of(p, ref) if kl_of else np.sum(p * (np.log(p) - ref)))
            rs.append(reward_of(p, ref, r) if reward_of else np.sum(p * r))
        return np.array(kls), np.array(rs)
    return frontier


@pytest.mark.parametrize("wrong,message", [
    (_frontier_with(kl_of=lambda p, ref: np.sum(np.exp(ref) * (ref - np.log(p)))), "wrong direction"),
    (_frontier_with(reward_of=lambda p, ref, r: np.sum(np.exp(ref) * r)), "rewards are those of pi_ref"),
    (_frontier_with(beta_map=lambda b: 1.0 / b), "beta is used as 1 / beta"),
    (lambda ref, r, b: optimum_frontier(ref, r, b)[::-1], "the pair is swapped"),
])
def test_frontier_mistakes_are_named(wrong, message):
    _fails("test_optimum_frontier", _with(optimum_frontier=wrong), message)


def test_frontier_model_answer_passes_on_several_seeds():
    for seed in range(3):
        _run("test_optimum_frontier", CORRECT, seed=seed)


def test_frontier_of_the_wrong_length_fails():
    _fails("test_optimum_frontier", _with(optimum_frontier=lambda ref, r, b: optimum_frontier(ref, r, b[:2])),
           "shape [5]")


# ------------------------------------------------------------------------------------------------
# plain data and argument markers


class _Anything:
    def __eq__(self, other):
        return True

    def __bool__(self):
        return True


@pytest.mark.parametrize("bad", [_Anything(), lambda: 1, (x for x in range(2)), {1: 2}, np.array(["a"]),
                                 np.array([object()])])
def test_plain_refuses_what_could_lie(bad):
    with pytest.raises(GradingError):
        core.plain(bad)


def test_plain_converts_jax_values_and_nests():
    out = core.plain({"a": jnp.arange(3.0), "b": (1, 2.5, True, None), "k": jax.random.key(3)})
    assert isinstance(out["a"], np.ndarray) and out["a"].tolist() == [0.0, 1.0, 2.0]
    assert out["b"] == (1, 2.5, True, None)
    assert out["k"].tolist() == np.asarray(jax.random.key_data(jax.random.key(3))).tolist()


def test_materialise_builds_markers_and_copies_arrays():
    arr = np.ones(3, np.float32)
    got = core.materialise((Jax(arr), Key(5), Source("def f(x):\n    return 2 * x\n", "f"), arr))
    assert isinstance(got[0], jax.Array)
    assert np.array_equal(jax.random.key_data(got[1]), jax.random.key_data(jax.random.key(5)))
    assert got[2](3) == 6
    got[3][0] = 7.0
    assert arr[0] == 1.0


def test_comparisons_refuse_fake_booleans_and_report_differences():
    with pytest.raises(GradingError, match="not a boolean"):
        core.check(_Anything(), "x")
    with pytest.raises(GradingError, match="expected shape"):
        core.close([1.0, 2.0], [1.0], "v")
    with pytest.raises(GradingError, match="NaN or inf"):
        core.close([np.nan], [1.0], "v")
    with pytest.raises(GradingError, match="largest difference"):
        core.close([1.0], [1.1], "v")
    core.close([1.0], [1.0 + 1e-9], "v")
    assert not core.matches("text", 1.0)
