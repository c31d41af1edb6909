"""Checks of ``a2_ppo_rlhf/01_losses``: the Bradley-Terry preference loss and the signed clipped PPO loss."""
from __future__ import annotations

import numpy as np

from .core import Jax, close, diagnose, equal
from .procedures import as_jax, fresh_batch
from .registry import ALL
from .registry import check as register

A, NB = "a2_ppo_rlhf", "01_losses.ipynb"


@register("test_preference_loss", task="preference_loss", needs=("preference_loss",), forbid=ALL,
          assignment=A, notebook=NB)
def preference_loss(student, rng, ref):
    """Value and gradient on fresh pairs; wrong margin sign, a sum and the log-likelihood are named."""
    import jax

    d, pairs = 2, 3  # the lesson's shapes, fresh values
    w = rng.normal(size=d).astype(np.float32)
    chosen = rng.normal(size=(pairs, d)).astype(np.float32)
    rejected = rng.normal(size=(pairs, d)).astype(np.float32)
    got = student.call("preference_loss", Jax(w), Jax(chosen), Jax(rejected))
    want = ref.preference_loss(w, chosen, rejected)
    margin = (chosen.astype(np.float64) - rejected) @ w.astype(np.float64)
    diagnose(got, want, lambda: {
        "the margin has the wrong sign: the loss must FALL as the chosen response outscores the "
        "rejected one, softplus(-margin)": np.mean(np.logaddexp(0.0, margin)),
        "the loss is summed over pairs: average it (mean)": np.sum(np.logaddexp(0.0, -margin)),
        "you returned the log-likelihood; the loss is its negative": -np.mean(np.logaddexp(0.0, -margin)),
    }, "preference_loss")
    close(got, want, "preference_loss on fresh pairs", rtol=1e-5, atol=1e-6)
    got_grad = student.grad("preference_loss", 0, Jax(w), Jax(chosen), Jax(rejected))
    close(got_grad, jax.grad(ref.preference_loss)(w, chosen, rejected), "gradient of preference_loss w.r.t. w",
          rtol=1e-4, atol=1e-6, hint="build the loss from jax.numpy operations so jax.grad can differentiate it")


def one_sample_term(student, ratio: float, advantage: float, epsilon: float) -> float:
    """Minus the student's ``ppo_loss`` on a batch of ONE sample whose ratio is ``ratio`` (beta = 0: no KL)."""
    import jax

    logits = np.array([0.4, -0.3, 0.1], np.float32)
    logp = np.asarray(jax.nn.log_softmax(logits))
    old_logp = logp[1:2] - np.log(np.float32(ratio))
    loss = student.call("ppo_loss", Jax(logits), Jax(old_logp), Jax(np.array([1])),
                        Jax(np.array([advantage], np.float32)), Jax(logp), 0.0, epsilon)
    return -np.asarray(loss, np.float64)


@register("test_clip_named_terms", task="ppo_loss", needs=("ppo_loss",), forbid=ALL, assignment=A, notebook=NB)
def clip_named_terms(student, rng, ref):
    """The lesson's worked example: (rho, A) = (1.5, 2) and (0.5, -2), epsilon 0.2, give [2.4, -1.6]."""
    got = np.array([one_sample_term(student, 1.5, 2.0, 0.2), one_sample_term(student, 0.5, -2.0, 0.2)])
    diagnose(got, [2.4, -1.6], lambda: {
        "ratio clipped but the signed min was dropped (negative-advantage case wrong)": [2.4, -1.0],
        "neither term is clipped: use min(rho*A, clip(rho, 1-eps, 1+eps)*A)": [3.0, -1.0],
        "the loss must be MINUS the surrogate (we minimise -surrogate + beta*KL)": [-2.4, 1.6],
    }, "ppo_loss", atol=1e-5)
    close(got, [2.4, -1.6], "surrogate terms for (rho, A) = (1.5, 2) and (0.5, -2)", rtol=0.0, atol=1e-5)


@register("test_clip_both_signs", task="ppo_loss", needs=("ppo_loss",), forbid=ALL, assignment=A, notebook=NB)
def clip_both_signs(student, rng, ref):
    """Fresh ratios below, inside and above the band for both signs of A, one sample at a time."""
    eps = float(rng.uniform(0.1, 0.3))
    bands = ((0.3, 1 - eps - 0.03), (1 - eps + 0.03, 1 + eps - 0.03), (1 + eps + 0.03, 2.2))
    cases = [(float(rng.uniform(low, high)), sign * float(rng.uniform(0.3, 2.5)))
             for sign in (1.0, -1.0) for low, high in bands for _ in range(2)]
    ratios = np.array([c[0] for c in cases])
    advs = np.array([c[1] for c in cases])
    got = np.array([one_sample_term(student, r, a, eps) for r, a in cases])
    clipped = np.clip(ratios, 1 - eps, 1 + eps)
    want = np.minimum(ratios * advs, clipped * advs)
    diagnose(got, want, lambda: {
        "ratio clipped but the signed min was dropped (negative-advantage case wrong): take the min "
        "of the two PRODUCTS rho*A and clip(rho)*A, not of the ratios": np.minimum(ratios, clipped) * advs,
        "only the clipped product is used: the min with the unclipped product rho*A is missing "
        "(wrong when the ratio moved the unfavourable way)": clipped * advs,
        "the ratio is not clipped: use clip(rho, 1-epsilon, 1+epsilon) inside the min": ratios * advs,
        "max instead of min: the surrogate keeps the SMALLER (pessimistic) product":
            np.maximum(ratios * advs, clipped * advs),
        "the clip range ignores the epsilon argument": np.minimum(ratios * advs, np.clip(ratios, 0.8, 1.2) * advs),
        "the loss must be MINUS the surrogate (we minimise -surrogate + beta*KL)": -want,
    }, "ppo_loss")
    close(got, want, f"surrogate terms for ratios {np.round(ratios, 3)} and advantages "
          f"{np.round(advs, 3)} (epsilon {eps:.3f})", rtol=1e-4, atol=1e-5)


def _parts(args):
    """float64 pieces of a batch: (log pi [n], ref [n], old [B], actions [B], advantages [B])."""
    import jax

    logits, old_logp, actions, advantages, ref_logp = args[:5]
    logp = np.asarray(jax.nn.log_softmax(logits), np.float64)
    return (logp, np.asarray(ref_logp, np.float64), np.asarray(old_logp, np.float64), np.asarray(actions),
            np.asarray(advantages, np.float64))


@register("test_kl_term", task="ppo_loss", needs=("ppo_loss",), forbid=ALL, assignment=A, notebook=NB)
def kl_term(student, rng, ref):
    """Every ratio inside the band, so the loss is -mean(rho A) + beta KL(pi || pi_ref): the KL term alone."""
    eps = float(rng.uniform(0.15, 0.3))
    beta = float(rng.uniform(0.3, 0.8))
    batch = fresh_batch(rng, 1 - eps / 2, 1 + eps / 2)
    args = batch + (beta, eps)
    got = student.call("ppo_loss", *as_jax(args))
    want = ref.ppo_loss(*args)
    logp, ref_lp, old, a, adv = _parts(args)
    surrogate = np.mean(np.exp(logp[a] - old) * adv)
    kl = np.sum(np.exp(logp) * (logp - ref_lp))
    diagnose(got, want, lambda: {
        "KL not measured against ref_logp: your penalty matches mean(log pi(a) - old_logp), a KL "
        "estimate against the old behaviour policy; measure KL(pi || pi_ref) against the reference":
            -surrogate + beta * np.mean(logp[a] - old),
        "KL not measured against ref_logp: the KL penalty is missing": -surrogate,
        "KL direction reversed: use KL(pi || pi_ref) = sum_a pi(a) (log pi(a) - log pi_ref(a)), "
        "weighted by the CURRENT policy": -surrogate + beta * np.sum(np.exp(ref_lp) * (ref_lp - logp)),
        "each log-ratio of the KL must be weighted by pi(a)": -surrogate + beta * np.sum(logp - ref_lp),
        "the KL penalty is not multiplied by beta": -surrogate + kl,
    }, "ppo_loss")
    close(got, want, "ppo_loss with every ratio inside the clip band", rtol=1e-4, atol=1e-5,
          hint="here the surrogate part is -mean(rho*A), so the penalty beta*KL(pi || pi_ref) is off")


@register("test_ppo_loss_value_grad", task="ppo_loss", needs=("ppo_loss",), forbid=ALL, assignment=A, notebook=NB)
def ppo_loss_value_grad(student, rng, ref):
    """Value and gradient w.r.t. logits on a fresh batch with clipping and the KL both active."""
    import jax

    beta, eps = float(rng.uniform(0.05, 0.5)), float(rng.uniform(0.1, 0.3))
    args = fresh_batch(rng) + (beta, eps)
    got = student.call("ppo_loss", *as_jax(args))
    want, want_grad = jax.value_and_grad(ref.ppo_loss)(*args)

    def wrong_losses():
        logp, ref_lp, old, a, adv = _parts(args)
        ratio = np.exp(logp[a] - old)
        clipped = np.clip(ratio, 1 - eps, 1 + eps)
        terms = np.minimum(ratio * adv, clipped * adv)
        kl = np.sum(np.exp(logp) * (logp - ref_lp))
        return {
            "ratio clipped but the signed min was dropped (negative-advantage case wrong)":
                -np.mean(np.minimum(ratio, clipped) * adv) + beta * kl,
            "only the clipped product is used: the min with the unclipped product rho*A is missing":
                -np.mean(clipped * adv) + beta * kl,
            "KL not measured against ref_logp: your penalty matches a KL estimate against the old "
            "behaviour policy (old_logp)": -np.mean(terms) + beta * np.mean(logp[a] - old),
            "the surrogate enters with the wrong sign: minimise -surrogate + beta*KL": np.mean(terms) + beta * kl,
            "the whole loss has the wrong sign: minimise -surrogate + beta*KL": -float(want),
            "the surrogate is summed over the batch: average it (mean)": -np.sum(terms) + beta * kl,
        }

    diagnose(got, want, wrong_losses, "ppo_loss")
    close(got, want, "ppo_loss value on a fresh batch", rtol=1e-4, atol=1e-5,
          hint="the clip and KL tests above show which part differs")
    close(student.grad("ppo_loss", 0, *as_jax(args)), want_grad, "gradient of ppo_loss w.r.t. logits",
          rtol=1e-4, atol=1e-5,
          hint="only old_logp, advantages and ref_logp are constants; the ratio and the KL must depend on logits")


@register("test_ppo_loss_detached", task="ppo_loss", needs=("ppo_loss",), forbid=ALL, assignment=A, notebook=NB)
def ppo_loss_detached(student, rng, ref):
    """The gradients w.r.t. old_logp and advantages are exactly zero: both are constants of the update."""
    args = fresh_batch(rng) + (float(rng.uniform(0.05, 0.5)), float(rng.uniform(0.1, 0.3)))
    batch = args[1].shape[0]
    grads = student.grad("ppo_loss", (1, 3), *as_jax(args))
    grad_old, grad_adv = grads if isinstance(grads, (tuple, list)) and len(grads) == 2 else (grads, grads)
    equal(grad_adv, np.zeros(batch), "gradient of ppo_loss w.r.t. advantages",
          hint="gradient flows into advantages: wrap them in stop_gradient")
    equal(grad_old, np.zeros(batch), "gradient of ppo_loss w.r.t. old_logp",
          hint="gradient flows into old_logp: wrap the behaviour log probs in stop_gradient")
