"""Checks of ``a2_ppo_rlhf/04_make_it_yours``: the baseline experiment, the transfer task, the challenge,
the interval over seeds and the reward-KL frontier.

The signed clip and the exact KL are given here (the library's ``clipped_surrogate`` and
``categorical_kl``): they were graded in ``a1_ppo_objective`` and in ``01_losses``.
"""
from __future__ import annotations

import numpy as np

from .core import Jax, check, close, diagnose, equal, pair, to_float
from .procedures import as_jax
from .registry import check as register

A, NB = "a2_ppo_rlhf", "04_make_it_yours.ipynb"


@register("test_score_terms", task="score_terms", needs=("score_terms",),
          forbid=("enumerated_baseline_gradient", "exact_reward_gradient"), assignment=A, notebook=NB)
def score_terms(student, rng, ref):
    """Rows pi(a)(r(a) - c)(e_a - pi) for fresh logits, rewards and baselines; they sum to the exact gradient."""
    import jax

    n = 3
    for _ in range(3):
        logits = rng.normal(size=n).astype(np.float32)
        rewards = rng.normal(scale=2.0, size=n).astype(np.float32)
        c = float(rng.normal(scale=3.0))
        got = to_float(student.call("score_terms", Jax(logits), Jax(rewards), c), "score_terms result")
        p = np.exp(np.asarray(jax.nn.log_softmax(logits), np.float64))
        r = rewards.astype(np.float64)
        score = np.eye(n) - p[None, :]
        want = (p * (r - c))[:, None] * score
        diagnose(got, want, lambda: {
            "the baseline c is not subtracted from the rewards": (p * r)[:, None] * score,
            "each row must be weighted by the probability pi(a)": (r - c)[:, None] * score,
            "rows and columns are swapped: row a holds action a's contribution": want.T,
        }, "score_terms")
        close(got, want, f"score terms for baseline c = {c:.3f}", rtol=1e-4, atol=1e-5)
        close(got.sum(axis=0), ref.exact_reward_gradient(logits, rewards),
              "sum of the score terms (the enumerated gradient)", rtol=1e-4, atol=1e-5)


def _prompts(rng) -> tuple:
    """Fresh several-prompt batch: logits [4, 3], old_logp [4, 8], actions [4, 8], advantages [4, 8], ref [4, 3]."""
    import jax

    P, n, B = 4, 3, 8
    logits = rng.normal(size=(P, n)).astype(np.float32)
    ref_logp = np.asarray(jax.nn.log_softmax(rng.normal(size=(P, n)).astype(np.float32), axis=-1))
    actions = rng.integers(0, n, size=(P, B))
    old = np.asarray(np.take_along_axis(np.asarray(jax.nn.log_softmax(logits, axis=-1)), actions, axis=1)
                     - np.log(rng.uniform(0.4, 1.8, size=(P, B))).astype(np.float32))
    adv = rng.normal(size=(P, B)).astype(np.float32)
    return logits, old, actions, adv, ref_logp


@register("test_transfer_value", task="multi_prompt_ppo_loss", needs=("multi_prompt_ppo_loss",),
          forbid=("ppo_loss",), assignment=A, notebook=NB)
def transfer_value(student, rng, ref):
    """Loss and gradient on fresh prompts equal the single-prompt reference loss averaged over prompts."""
    import jax
    import jax.numpy as jnp

    logits, old, actions, adv, ref_logp = _prompts(rng)
    beta, eps = float(rng.uniform(0.1, 0.6)), float(rng.uniform(0.1, 0.3))
    args = (logits, old, actions, adv, ref_logp, beta, eps)
    per_prompt = jax.vmap(ref.ppo_loss, in_axes=(0, 0, 0, 0, 0, None, None))
    want, want_grad = jax.jit(jax.value_and_grad(
        lambda z: jnp.mean(per_prompt(z, old, actions, adv, ref_logp, beta, eps))))(logits)
    got = student.call("multi_prompt_ppo_loss", *as_jax(args))

    def wrong_losses():
        kls = np.asarray(ref.categorical_kl(jax.nn.log_softmax(logits, axis=-1), ref_logp), np.float64)
        return {
            "the KL is summed over prompts: average it over prompts": float(want) + beta * (kls.sum() - kls.mean()),
            "the KL penalty is missing": float(want) - beta * kls.mean(),
        }

    diagnose(got, want, wrong_losses, "multi_prompt_ppo_loss")
    close(got, want, "several-prompt loss on fresh prompts", rtol=1e-4, atol=1e-5,
          hint="gather logp[p, actions[p, i]] per prompt, average the signed clipped terms over all "
               "samples and the exact KL over prompts")
    close(student.grad("multi_prompt_ppo_loss", 0, *as_jax(args)), want_grad, "gradient w.r.t. logits",
          rtol=1e-4, atol=1e-5)


@register("test_transfer_detached", task="multi_prompt_ppo_loss", needs=("multi_prompt_ppo_loss",),
          forbid=("ppo_loss",), assignment=A, notebook=NB)
def transfer_detached(student, rng, ref):
    """Gradients of the several-prompt loss w.r.t. old_logp and advantages are exactly zero."""
    logits, old, actions, adv, ref_logp = _prompts(rng)
    args = (logits, old, actions, adv, ref_logp, float(rng.uniform(0.1, 0.6)), float(rng.uniform(0.1, 0.3)))
    grads = student.grad("multi_prompt_ppo_loss", (1, 3), *as_jax(args))
    grad_old, grad_adv = grads if isinstance(grads, (tuple, list)) and len(grads) == 2 else (grads, grads)
    equal(grad_adv, np.zeros(adv.shape), "gradient w.r.t. advantages",
          hint="gradient flows into advantages: wrap them in stop_gradient")
    equal(grad_old, np.zeros(old.shape), "gradient w.r.t. old_logp",
          hint="gradient flows into old_logp: wrap the behaviour log probs in stop_gradient")


OPTIMUM_FORBID = ("optimal_logp", "regularised_objective")


@register("test_optimum_log_space", task="analytic_optimum", needs=("analytic_optimum",), forbid=OPTIMUM_FORBID,
          assignment=A, notebook=NB)
def optimum_log_space(student, rng, ref):
    """log_softmax(ref_logp + r / beta) on fresh inputs, including beta = 1e-3 where exp(r / beta) overflows."""
    import jax

    n = 3
    for beta in (float(rng.uniform(0.1, 1.0)), 1e-3):
        ref_logp = np.asarray(jax.nn.log_softmax(rng.normal(size=n).astype(np.float32)))
        r = rng.normal(scale=1.5, size=n)
        r[int(rng.integers(0, n))] = 3.0  # r / beta = 3000 when beta = 1e-3: exp overflows even in float64
        r = r.astype(np.float32)
        got = to_float(student.call("analytic_optimum", Jax(ref_logp), Jax(r), beta), "analytic_optimum result")
        check(bool(np.all(np.isfinite(got))),
              f"analytic_optimum returned NaN or inf for beta = {beta:g}: exp(r / beta) overflows "
              "(or a probability underflows to log 0); compute it in log space, "
              "log_softmax(ref_logp + rewards / beta)")
        want = ref.optimal_logp(ref_logp, r, beta)
        diagnose(got, want, lambda: {
            "return log-probabilities, not probabilities": np.exp(np.asarray(want, np.float64)),
            "the rewards must be divided by beta": jax.nn.log_softmax(ref_logp + r),
            "the reference is missing: pi* is proportional to pi_ref(a) exp(r(a) / beta)": jax.nn.log_softmax(r / beta),
        }, "analytic_optimum")
        close(got, want, f"optimum log-probabilities for beta = {beta:g}", rtol=1e-4, atol=1e-4)


@register("test_optimum_bound", task="regularised_objective",
          needs=("objective_reference", "objective_trained", "objective_optimum", "regularised_objective",
                 "analytic_optimum"), forbid=OPTIMUM_FORBID, assignment=A, notebook=NB)
def optimum_bound(student, rng, ref):
    """The lesson's three objectives; on fresh inputs the optimum's objective is >= every other policy's."""
    import jax

    values = [student.value(n) for n in ("objective_reference", "objective_trained", "objective_optimum")]
    close(values, [0.28191882371902466, 1.7620493173599243, 1.7987911701202393],
          "regularised objective of reference / trained / optimum", rtol=0.0, atol=1e-5)
    n = 3
    for beta in (float(rng.uniform(0.1, 1.0)), 1e-3):
        ref_logp = np.asarray(jax.nn.log_softmax(rng.normal(size=n).astype(np.float32)))
        r = rng.normal(scale=1.5, size=n).astype(np.float32)
        policies = [ref_logp] + [np.asarray(jax.nn.log_softmax(rng.normal(scale=2.0, size=n).astype(np.float32)))
                                 for _ in range(5)]
        for logp in policies:
            close(student.call("regularised_objective", Jax(logp), Jax(r), Jax(ref_logp), beta),
                  ref.regularised_objective(logp, r, ref_logp, beta),
                  f"regularised objective of a fresh policy (beta = {beta:g})", rtol=1e-4, atol=1e-5,
                  hint="J = sum_a pi(a) r(a) - beta * sum_a pi(a) (log pi(a) - log pi_ref(a))")
        optimum = to_float(student.call("analytic_optimum", Jax(ref_logp), Jax(r), beta), "analytic_optimum result")
        check(bool(np.all(np.isfinite(optimum))), f"analytic_optimum is not finite for beta = {beta:g}: compute it in log space")
        best = float(ref.regularised_objective(optimum.astype(np.float32), r, ref_logp, beta))
        for k, logp in enumerate(policies):
            other = float(ref.regularised_objective(logp, r, ref_logp, beta))
            check(best >= other - 1e-4, f"the optimum's objective {best:.6f} is below policy {k}'s {other:.6f} "
                                        f"(beta = {beta:g}): the optimum is not the maximiser")


def _t_quantile(dof: int) -> float:
    """The 0.975 quantile of Student's t with ``dof`` degrees of freedom (the grader's scipy)."""
    from scipy import stats

    return float(stats.t.ppf(0.975, dof))


@register("test_seed_interval", task="seed_interval", needs=("seed_interval",), assignment=A, notebook=NB)
def seed_interval(student, rng, ref):
    """95% t-interval over seeds, mean +- t_{0.975, n-1} s / sqrt(n) with the sample std, on fresh samples."""
    for n in (3, 4, 6, 11):
        values = rng.normal(loc=rng.uniform(-2.0, 2.0), scale=rng.uniform(0.05, 1.0), size=n)
        got = to_float(student.call("seed_interval", values.copy()), "seed_interval result")
        check(got.shape == (3,), f"seed_interval must return the three numbers (mean, low, high), "
                                 f"got shape {got.shape}")
        mean, s, s_pop = values.mean(), values.std(ddof=1), values.std(ddof=0)
        t = _t_quantile(n - 1)

        def interval(half):
            return np.array([mean, mean - half, mean + half])

        want = interval(t * s / np.sqrt(n))
        diagnose(got, want, lambda: {
            "use the sample standard deviation (ddof=1, divide by n - 1), not the population one (ddof=0)":
                interval(t * s_pop / np.sqrt(n)),
            "use the t quantile with n - 1 degrees of freedom (scipy.stats.t.ppf(0.975, n - 1)), "
            "not the normal 1.96: with a handful of seeds the interval must be wider":
                interval(1.959964 * s / np.sqrt(n)),
            "divide the standard deviation by sqrt(n): the interval is for the mean over seeds, "
            "not for one seed": interval(t * s),
            "the t quantile has n - 1 degrees of freedom, not n": interval(_t_quantile(n) * s / np.sqrt(n)),
        }, "seed_interval")
        # tolerance relative to the half-width: a t quantile read from a 4-digit table passes
        half = t * s / np.sqrt(n)
        close(got, want, f"(mean, low, high) of {n} seeds", rtol=1e-6, atol=1e-4 * half + 1e-9,
              hint="mean -+ t * s / sqrt(n) with s = std(values, ddof=1) and t = scipy.stats.t.ppf(0.975, n - 1)")


@register("test_optimum_frontier", task="optimum_frontier", needs=("optimum_frontier", "analytic_optimum"),
          forbid=("reward_kl_frontier", "optimal_logp", "regularised_objective"), assignment=A, notebook=NB)
def optimum_frontier(student, rng, ref):
    """(KL(pi*_b || pi_ref), E_{pi*_b}[r]) for each b of a fresh beta grid, on fresh references and rewards."""
    import jax

    for n in (3, 5):
        ref_logp = np.asarray(jax.nn.log_softmax(rng.normal(size=n).astype(np.float32)))
        r = rng.normal(scale=1.5, size=n).astype(np.float32)
        # below 0.7, so that 1 / beta is never close to beta
        betas = np.sort(rng.uniform(0.05, 0.7, size=5)).astype(np.float32)[::-1].copy()
        got = pair(student.call("optimum_frontier", Jax(ref_logp), Jax(r), betas.copy()), "optimum_frontier",
                   "the pair (kls, rewards)")
        kls = to_float(got[0], "optimum_frontier kls")
        rewards = to_float(got[1], "optimum_frontier rewards")
        check(kls.shape == rewards.shape == (5,), f"optimum_frontier must return two arrays of shape [5] for 5 "
                                                  f"betas, got shapes {kls.shape} and {rewards.shape}")
        want_kl, want_r = (np.asarray(x, np.float64) for x in ref.reward_kl_frontier(ref_logp, r, betas))
        want = np.concatenate([want_kl, want_r])

        def mistakes():
            opt = np.asarray(jax.vmap(lambda b: ref.optimal_logp(ref_logp, r, b))(betas))
            reversed_kl = np.asarray(ref.categorical_kl(np.broadcast_to(ref_logp, opt.shape), opt), np.float64)
            ref_reward = float(ref.expected_reward(ref_logp, r))
            inv_kl, inv_r = (np.asarray(x, np.float64) for x in ref.reward_kl_frontier(ref_logp, r, 1.0 / betas))
            return {
                "the KL is in the wrong direction: measure KL(pi*_beta || pi_ref), the optimum first "
                "(categorical_kl(optimum_logp, ref_logp))": np.concatenate([reversed_kl, want_r]),
                "the rewards are those of pi_ref: take the expected reward under the optimum pi*_beta":
                    np.concatenate([want_kl, np.full(5, ref_reward)]),
                "beta is used as 1 / beta: pi* is proportional to pi_ref exp(r / beta)":
                    np.concatenate([inv_kl, inv_r]),
                "the pair is swapped: return (kls, rewards)": np.concatenate([want_r, want_kl]),
            }

        diagnose(np.concatenate([kls, rewards]), want, mistakes, "optimum_frontier")
        close(kls, want_kl, "KL(pi*_beta || pi_ref) per beta (nats)", rtol=1e-4, atol=1e-5)
        close(rewards, want_r, "E_{pi*_beta}[r] per beta (reward units)", rtol=1e-4, atol=1e-5)
