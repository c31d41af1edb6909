# ---
# jupyter:
#   kernelspec:
#     display_name: Python 3 (ipykernel)
#     language: python
#     name: python3
# ---

# %% [markdown] nbgrader={"grade": false, "grade_id": "intro_01", "locked": true, "schema_version": 3, "solution": false, "task": false}
# # Build step 1: the reward-model loss and the signed PPO loss
#
# This assignment follows one RLHF run on a *bandit*: one prompt, three possible responses
# (actions), a reward model fitted to pairwise preferences, and a policy trained with PPO.
# Because there are only three actions, every expectation can be summed exactly, so nothing
# you measure is blurred by sampling noise.
#
# In this notebook you write the two losses everything else is built on.

# %% [markdown] nbgrader={"grade": false, "grade_id": "points_01", "locked": true, "schema_version": 3, "solution": false, "task": false}
# **Points.** This notebook: **12 points**. The whole assignment `ppo_rlhf` (four notebooks) is worth **50 points**: 44 autograded and 6 graded by hand.
#
# | graded cell | points | how |
# |---|---|---|
# | `test_preference_loss` | 2 | autograded |
# | `test_clip_named_terms` | 1 | autograded |
# | `test_clip_both_signs` | 3 | autograded |
# | `test_kl_term` | 2 | autograded |
# | `test_ppo_loss_value_grad` | 2 | autograded |
# | `test_ppo_loss_detached` | 2 | autograded |
#
# Run the notebook top to bottom after restarting the kernel. Visible tests help you; hidden tests on fresh random inputs decide the grade. Keep the first code cell as it is.

# %% nbgrader={"grade": false, "grade_id": "grading_start", "locked": true, "schema_version": 3, "solution": false, "task": false}
from rlhf_lab import grading
grading.start()

# %% nbgrader={"grade": false, "grade_id": "imports_01", "locked": true, "schema_version": 3, "solution": false, "task": false}
import jax
import jax.numpy as jnp
import numpy as np


# %% [markdown] nbgrader={"grade": false, "grade_id": "pref_intro", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ## 1. The preference loss
#
# A linear reward model scores a response with features $x$ as $r(x) = x \cdot w$. Given a
# pair where a labeller preferred `chosen` over `rejected`, the Bradley-Terry model says
# the preference happens with probability $\sigma(m)$ for the margin
# $m = (x_{\text{chosen}} - x_{\text{rejected}}) \cdot w$. Its negative log-likelihood,
# averaged over pairs, is
#
# $$L(w) = \frac{1}{n}\sum_i \operatorname{softplus}(-m_i), \qquad \operatorname{softplus}(z) = \log(1 + e^z).$$
#
# `softplus(-m)` equals $-\log\sigma(m)$ but never overflows. Only `w` is trained; the
# feature arrays are data.

# %% nbgrader={"grade": false, "grade_id": "preference_loss_answer", "locked": false, "schema_version": 3, "solution": true, "task": false}
def preference_loss(w, chosen, rejected):
    """Bradley-Terry loss: mean_i softplus(-(chosen_i - rejected_i) . w).

    w: [d] reward weights (trained). chosen, rejected: [n_pairs, d] features (fixed data).
    Returns a scalar.
    """
    ### BEGIN SOLUTION
    margin = (chosen - rejected) @ w
    return jnp.mean(jax.nn.softplus(-margin))
    ### END SOLUTION


# %% nbgrader={"grade": true, "grade_id": "test_preference_loss", "locked": true, "points": 2, "schema_version": 3, "solution": false, "task": false}
# test_preference_loss: preference_loss matches the reference Bradley-Terry loss (value and gradient) on fresh random pairs
### BEGIN HIDDEN TESTS
def _diagnose(got, want, mistakes, task, rtol=1e-4, atol=1e-5):
    """If got != want, name the classic mistake it matches; `mistakes()` -> {message: wrong formula's value}."""
    if not grading.matches(got, want, rtol=rtol, atol=atol):
        for message, wrong in mistakes().items():
            grading.check(not grading.matches(got, wrong, rtol=rtol, atol=atol), f"{task}: {message}")
rng = grading.rng("preference_loss")
d, pairs = 2, 3  # the lesson's shapes, fresh values (a new shape would recompile every primitive)
w = jnp.asarray(rng.normal(size=d), jnp.float32)
chosen = jnp.asarray(rng.normal(size=(pairs, d)), jnp.float32)
rejected = jnp.asarray(rng.normal(size=(pairs, d)), jnp.float32)
got = grading.call(preference_loss, w, chosen, rejected, task="preference_loss", forbid=("*",))
want = grading.reference.preference_loss(w, chosen, rejected)
margin = np.asarray((chosen - rejected) @ w, np.float64)
_diagnose(got, want, lambda: {
    "the margin has the wrong sign: the loss must FALL as the chosen response outscores the "
    "rejected one, softplus(-margin)": np.mean(np.logaddexp(0.0, margin)),
    "the loss is summed over pairs: average it (mean)": np.sum(np.logaddexp(0.0, -margin)),
    "you returned the log-likelihood; the loss is its negative": -np.mean(np.logaddexp(0.0, -margin)),
}, "preference_loss")
grading.close(got, want, "preference_loss on fresh pairs", rtol=1e-5, atol=1e-6)
got_grad = grading.call(jax.grad(preference_loss), w, chosen, rejected, task="preference_loss",
                        forbid=("*",))
grading.close(got_grad, jax.grad(grading.reference.preference_loss)(w, chosen, rejected),
              "gradient of preference_loss w.r.t. w", rtol=1e-4, atol=1e-6,
              hint="build the loss from jax.numpy operations so jax.grad can differentiate it")
### END HIDDEN TESTS
# a zero margin costs log 2 per pair
assert abs(float(preference_loss(jnp.zeros(2), jnp.ones((3, 2)), jnp.zeros((3, 2)))) - np.log(2.0)) < 1e-6, (
    "with w = 0 every margin is 0, so the loss must be log 2 = 0.6931 (softplus(0), averaged over pairs)")


# %% [markdown] nbgrader={"grade": false, "grade_id": "ppo_intro", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ## 2. The signed clipped PPO loss
#
# Four objects appear in the loss, and each has its own lifetime:
#
# | name | what it is | changes when |
# |---|---|---|
# | `logits` | the **current** policy $\pi_\theta$ | every inner optimisation step |
# | `old_logp` | log-probabilities of the sampled actions under the **old (behaviour)** policy that collected the batch | once per rollout (frozen while the batch is reused) |
# | `ref_logp` | the **reference** policy $\pi_{\text{ref}}$, all actions | never |
# | `advantages` | frozen reward minus a baseline, per sample | once per rollout |
#
# With the ratio $\rho_i = \pi_\theta(a_i)/\pi_{\text{old}}(a_i) = \exp(\log\pi_\theta(a_i) - \texttt{old\_logp}_i)$,
# the loss minimised by one inner step is
#
# $$L(\theta) = -\frac{1}{B}\sum_i \min\big(\rho_i A_i,\ \operatorname{clip}(\rho_i, 1-\epsilon, 1+\epsilon)\,A_i\big)
# \;+\; \beta \sum_a \pi_\theta(a)\,\big(\log\pi_\theta(a) - \log\pi_{\text{ref}}(a)\big).$$
#
# Take the minimum of the two **products**: the sign of $A$ decides which bound can bind.
# The KL term is exact (a sum over all actions) and is measured against the reference,
# not the old policy. `old_logp`, `advantages` and `ref_logp` are constants of the update:
# wrap them in `jax.lax.stop_gradient` so no gradient can flow into them.

# %% nbgrader={"grade": false, "grade_id": "ppo_loss_answer", "locked": false, "schema_version": 3, "solution": true, "task": false}
def ppo_loss(logits, old_logp, actions, advantages, ref_logp, beta=0.1, epsilon=0.2):
    """-mean_i min(rho_i A_i, clip(rho_i, 1-eps, 1+eps) A_i) + beta * KL(pi || pi_ref).

    logits:     [n_actions] current policy parameters (the only trained argument)
    old_logp:   [batch] behaviour-policy log probs of the sampled actions (constant)
    actions:    [batch] int sampled actions
    advantages: [batch] advantages (constant)
    ref_logp:   [n_actions] reference log probs (constant for the whole run)
    Returns a scalar.
    """
    ### BEGIN SOLUTION
    logp = jax.nn.log_softmax(logits)
    old_logp = jax.lax.stop_gradient(old_logp)
    advantages = jax.lax.stop_gradient(advantages)
    ref_logp = jax.lax.stop_gradient(ref_logp)
    ratio = jnp.exp(logp[actions] - old_logp)
    clipped = jnp.clip(ratio, 1.0 - epsilon, 1.0 + epsilon)
    surrogate = jnp.mean(jnp.minimum(ratio * advantages, clipped * advantages))
    kl = jnp.sum(jnp.exp(logp) * (logp - ref_logp))
    return -surrogate + beta * kl
    ### END SOLUTION


# %% [markdown]
# **Predict** (not graded, but write it down *before* running the next cell):
# with $\epsilon = 0.2$, what are the surrogate terms $\min(\rho A, \operatorname{clip}(\rho)A)$ for
# $(\rho, A) = (1.5, 2)$ and for $(\rho, A) = (0.5, -2)$? Which bound of the clip range matters
# in each case?
#
# *My prediction:* 

# %% nbgrader={"grade": false, "grade_id": "experiment_clip_terms", "locked": true, "schema_version": 3, "solution": false, "task": false}
def one_sample_term(loss_fn, ratio, advantage, epsilon):
    """The surrogate term of ONE sample, read off your loss: -loss on a batch of one with beta = 0.

    The batch is built so that pi(a) / pi_old(a) = ratio; with beta = 0 the KL penalty vanishes.
    """
    logits = jnp.array([0.4, -0.3, 0.1])
    logp = jax.nn.log_softmax(logits)
    old_logp = logp[1:2] - jnp.log(ratio)
    loss = loss_fn(logits, old_logp, jnp.array([1]), jnp.array([advantage]), logp, 0.0, epsilon)
    return -float(loss)


worked_terms = [one_sample_term(ppo_loss, 1.5, 2.0, 0.2), one_sample_term(ppo_loss, 0.5, -2.0, 0.2)]
print("clipped surrogate terms for (1.5, 2) and (0.5, -2):", np.round(worked_terms, 6))


# %% nbgrader={"grade": true, "grade_id": "test_clip_named_terms", "locked": true, "points": 1, "schema_version": 3, "solution": false, "task": false}
# test_clip_named_terms: the lesson's worked example: (rho, A) = (1.5, 2) and (0.5, -2) with epsilon 0.2 give [2.4, -1.6]
### BEGIN HIDDEN TESTS
def _diagnose(got, want, mistakes, task, rtol=1e-4, atol=1e-5):
    """If got != want, name the classic mistake it matches; `mistakes()` -> {message: wrong formula's value}."""
    if not grading.matches(got, want, rtol=rtol, atol=atol):
        for message, wrong in mistakes().items():
            grading.check(not grading.matches(got, wrong, rtol=rtol, atol=atol), f"{task}: {message}")
def _term(ratio, advantage, epsilon):
    """Minus the student's ppo_loss on a batch of ONE sample whose ratio is `ratio` (beta = 0, so no KL)."""
    logits = jnp.array([0.4, -0.3, 0.1], jnp.float32)
    logp = jax.nn.log_softmax(logits)
    old_logp = logp[1:2] - jnp.log(jnp.float32(ratio))
    loss = grading.call(ppo_loss, logits, old_logp, jnp.array([1]), jnp.array([advantage], jnp.float32),
                        logp, 0.0, epsilon, task="ppo_loss", forbid=("*",))
    return -loss
got = np.array([_term(1.5, 2.0, 0.2), _term(0.5, -2.0, 0.2)])
_diagnose(got, [2.4, -1.6], lambda: {
    "ratio clipped but the signed min was dropped (negative-advantage case wrong)": [2.4, -1.0],
    "neither term is clipped: use min(rho*A, clip(rho, 1-eps, 1+eps)*A)": [3.0, -1.0],
    "the loss must be MINUS the surrogate (we minimise -surrogate + beta*KL)": [-2.4, 1.6],
}, "ppo_loss", atol=1e-5)
grading.close(got, [2.4, -1.6], "surrogate terms for (rho, A) = (1.5, 2) and (0.5, -2)",
              rtol=0.0, atol=1e-5)
### END HIDDEN TESTS
assert not np.allclose(worked_terms, [2.4, -1.0], atol=1e-5), (
    "ratio clipped but the signed min was dropped (negative-advantage case wrong)")
assert np.allclose(worked_terms, [2.4, -1.6], atol=1e-5), f"expected [2.4, -1.6], got {worked_terms}"


# %% nbgrader={"grade": true, "grade_id": "test_clip_both_signs", "locked": true, "points": 3, "schema_version": 3, "solution": false, "task": false}
# test_clip_both_signs: per-sample terms equal min(rho*A, clip(rho)*A) for both signs of A, ratios below, inside and above the band
### BEGIN HIDDEN TESTS
def _diagnose(got, want, mistakes, task, rtol=1e-4, atol=1e-5):
    """If got != want, name the classic mistake it matches; `mistakes()` -> {message: wrong formula's value}."""
    if not grading.matches(got, want, rtol=rtol, atol=atol):
        for message, wrong in mistakes().items():
            grading.check(not grading.matches(got, wrong, rtol=rtol, atol=atol), f"{task}: {message}")
def _term(ratio, advantage, epsilon):
    """Minus the student's ppo_loss on a batch of ONE sample whose ratio is `ratio` (beta = 0, so no KL)."""
    logits = jnp.array([0.4, -0.3, 0.1], jnp.float32)
    logp = jax.nn.log_softmax(logits)
    old_logp = logp[1:2] - jnp.log(jnp.float32(ratio))
    loss = grading.call(ppo_loss, logits, old_logp, jnp.array([1]), jnp.array([advantage], jnp.float32),
                        logp, 0.0, epsilon, task="ppo_loss", forbid=("*",))
    return -loss
rng = grading.rng("clip_both_signs")
eps = float(rng.uniform(0.1, 0.3))
bands = ((0.3, 1 - eps - 0.03), (1 - eps + 0.03, 1 + eps - 0.03), (1 + eps + 0.03, 2.2))
cases = [(float(rng.uniform(low, high)), sign * float(rng.uniform(0.3, 2.5)))
         for sign in (1.0, -1.0) for low, high in bands for _ in range(2)]
ratios = np.array([c[0] for c in cases])
advs = np.array([c[1] for c in cases])
got = np.array([_term(r, a, eps) for r, a in cases])
clipped = np.clip(ratios, 1 - eps, 1 + eps)
want = np.minimum(ratios * advs, clipped * advs)
_diagnose(got, want, lambda: {
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
grading.close(got, want, f"surrogate terms for ratios {np.round(ratios, 3)} and advantages "
              f"{np.round(advs, 3)} (epsilon {eps:.3f})", rtol=1e-4, atol=1e-5)
### END HIDDEN TESTS
# a ratio inside the band is not clipped, whatever the sign of A
assert abs(one_sample_term(ppo_loss, 1.1, -1.0, 0.2) - (-1.1)) < 1e-5, (
    "ratio 1.1 is inside the band [0.8, 1.2], so with A = -1 the surrogate term must be rho*A = -1.1")


# %% nbgrader={"grade": true, "grade_id": "test_kl_term", "locked": true, "points": 2, "schema_version": 3, "solution": false, "task": false}
# test_kl_term: with every ratio inside the clip band, the loss is -mean(rho*A) + beta*KL(pi || pi_ref): checks the KL penalty
### BEGIN HIDDEN TESTS
def _diagnose(got, want, mistakes, task, rtol=1e-4, atol=1e-5):
    """If got != want, name the classic mistake it matches; `mistakes()` -> {message: wrong formula's value}."""
    if not grading.matches(got, want, rtol=rtol, atol=atol):
        for message, wrong in mistakes().items():
            grading.check(not grading.matches(got, wrong, rtol=rtol, atol=atol), f"{task}: {message}")
def _fresh_batch(rng, ratio_low=0.4, ratio_high=1.8):
    """Fresh logits, reference, actions, advantages (both signs) and old_logp giving chosen ratios."""
    n, batch = 3, 24  # fixed shapes, fresh values (a new shape would recompile every primitive)
    logits = jnp.asarray(rng.normal(size=n), jnp.float32)
    ref_logp = jax.nn.log_softmax(jnp.asarray(rng.normal(size=n), jnp.float32))
    actions = jnp.asarray(rng.integers(0, n, size=batch))
    ratios = rng.uniform(ratio_low, ratio_high, size=batch)
    old_logp = jax.nn.log_softmax(logits)[actions] - jnp.asarray(np.log(ratios), jnp.float32)
    advantages = jnp.asarray(rng.normal(size=batch), jnp.float32)
    return logits, old_logp, actions, advantages, ref_logp
rng = grading.rng("kl_term")
eps = float(rng.uniform(0.15, 0.3))
beta = float(rng.uniform(0.3, 0.8))
logits, old_logp, actions, advantages, ref_logp = _fresh_batch(rng, 1 - eps / 2, 1 + eps / 2)
got = grading.call(ppo_loss, logits, old_logp, actions, advantages, ref_logp, beta, eps,
                   task="ppo_loss", forbid=("*",))
want = grading.reference.ppo_loss(logits, old_logp, actions, advantages, ref_logp, beta, eps)
logp = np.asarray(jax.nn.log_softmax(logits), np.float64)
ref = np.asarray(ref_logp, np.float64)
old = np.asarray(old_logp, np.float64)
a = np.asarray(actions)
surrogate = np.mean(np.exp(logp[a] - old) * np.asarray(advantages, np.float64))
kl = np.sum(np.exp(logp) * (logp - ref))
_diagnose(got, want, lambda: {
    "KL not measured against ref_logp: your penalty matches mean(log pi(a) - old_logp), a KL "
    "estimate against the old behaviour policy; measure KL(pi || pi_ref) against the reference":
        -surrogate + beta * np.mean(logp[a] - old),
    "KL not measured against ref_logp: the KL penalty is missing": -surrogate,
    "KL direction reversed: use KL(pi || pi_ref) = sum_a pi(a) (log pi(a) - log pi_ref(a)), "
    "weighted by the CURRENT policy": -surrogate + beta * np.sum(np.exp(ref) * (ref - logp)),
    "each log-ratio of the KL must be weighted by pi(a)": -surrogate + beta * np.sum(logp - ref),
    "the KL penalty is not multiplied by beta": -surrogate + kl,
}, "ppo_loss")
grading.close(got, want, "ppo_loss with every ratio inside the clip band", rtol=1e-4, atol=1e-5,
              hint="here the surrogate part is -mean(rho*A), so the penalty beta*KL(pi || pi_ref) is off")
### END HIDDEN TESTS
# at the reference, with ratios of 1 and zero advantages, the loss is exactly 0
_logp = jax.nn.log_softmax(jnp.array([0.2, 0.0, -0.2]))
assert float(ppo_loss(jnp.array([0.2, 0.0, -0.2]), _logp[jnp.array([0, 2])], jnp.array([0, 2]),
                      jnp.zeros(2), _logp, 0.5, 0.2)) == 0.0, (
    "at the reference with zero advantages both terms vanish: the loss must be exactly 0.0")


# %% nbgrader={"grade": true, "grade_id": "test_ppo_loss_value_grad", "locked": true, "points": 2, "schema_version": 3, "solution": false, "task": false}
# test_ppo_loss_value_grad: value and gradient w.r.t. logits match the reference on a fresh batch (clipping and KL both active)
### BEGIN HIDDEN TESTS
def _diagnose(got, want, mistakes, task, rtol=1e-4, atol=1e-5):
    """If got != want, name the classic mistake it matches; `mistakes()` -> {message: wrong formula's value}."""
    if not grading.matches(got, want, rtol=rtol, atol=atol):
        for message, wrong in mistakes().items():
            grading.check(not grading.matches(got, wrong, rtol=rtol, atol=atol), f"{task}: {message}")
def _fresh_batch(rng, ratio_low=0.4, ratio_high=1.8):
    """Fresh logits, reference, actions, advantages (both signs) and old_logp giving chosen ratios."""
    n, batch = 3, 24  # fixed shapes, fresh values (a new shape would recompile every primitive)
    logits = jnp.asarray(rng.normal(size=n), jnp.float32)
    ref_logp = jax.nn.log_softmax(jnp.asarray(rng.normal(size=n), jnp.float32))
    actions = jnp.asarray(rng.integers(0, n, size=batch))
    ratios = rng.uniform(ratio_low, ratio_high, size=batch)
    old_logp = jax.nn.log_softmax(logits)[actions] - jnp.asarray(np.log(ratios), jnp.float32)
    advantages = jnp.asarray(rng.normal(size=batch), jnp.float32)
    return logits, old_logp, actions, advantages, ref_logp
rng = grading.rng("ppo_value_grad")
beta, eps = float(rng.uniform(0.05, 0.5)), float(rng.uniform(0.1, 0.3))
args = _fresh_batch(rng) + (beta, eps)
R = grading.reference
got = grading.call(ppo_loss, *args, task="ppo_loss", forbid=("*",))
want, want_grad = jax.value_and_grad(R.ppo_loss)(*args)


def wrong_losses():
    logits, old_logp, actions, advantages, ref_logp = args[:5]
    logp = np.asarray(jax.nn.log_softmax(logits), np.float64)
    a, old = np.asarray(actions), np.asarray(old_logp, np.float64)
    adv = np.asarray(advantages, np.float64)
    ratio = np.exp(logp[a] - old)
    clipped = np.clip(ratio, 1 - eps, 1 + eps)
    terms = np.minimum(ratio * adv, clipped * adv)
    kl = np.sum(np.exp(logp) * (logp - np.asarray(ref_logp, np.float64)))
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


_diagnose(got, want, wrong_losses, "ppo_loss")
grading.close(got, want, "ppo_loss value on a fresh batch", rtol=1e-4, atol=1e-5,
              hint="the clip and KL tests above show which part differs")
got_grad = grading.call(jax.grad(ppo_loss), *args, task="ppo_loss", forbid=("*",))
grading.close(got_grad, want_grad, "gradient of ppo_loss w.r.t. logits",
              rtol=1e-4, atol=1e-5,
              hint="only old_logp, advantages and ref_logp are constants; the ratio and the KL must "
                   "depend on logits")
### END HIDDEN TESTS
_g = jax.grad(ppo_loss)(jnp.array([0.2, 0.0, -0.2]), jnp.log(jnp.array([0.3, 0.3])), jnp.array([0, 1]),
                        jnp.array([1.0, -1.0]), jax.nn.log_softmax(jnp.zeros(3)), 0.1, 0.2)
assert _g.shape == (3,) and bool(jnp.all(jnp.isfinite(_g))), (
    f"jax.grad of ppo_loss w.r.t. the 3 logits must be 3 finite numbers, got {_g}")


# %% nbgrader={"grade": true, "grade_id": "test_ppo_loss_detached", "locked": true, "points": 2, "schema_version": 3, "solution": false, "task": false}
# test_ppo_loss_detached: gradients w.r.t. old_logp and advantages are exactly zero (both are constants of the update)
### BEGIN HIDDEN TESTS
def _fresh_batch(rng, ratio_low=0.4, ratio_high=1.8):
    """Fresh logits, reference, actions, advantages (both signs) and old_logp giving chosen ratios."""
    n, batch = 3, 24  # fixed shapes, fresh values (a new shape would recompile every primitive)
    logits = jnp.asarray(rng.normal(size=n), jnp.float32)
    ref_logp = jax.nn.log_softmax(jnp.asarray(rng.normal(size=n), jnp.float32))
    actions = jnp.asarray(rng.integers(0, n, size=batch))
    ratios = rng.uniform(ratio_low, ratio_high, size=batch)
    old_logp = jax.nn.log_softmax(logits)[actions] - jnp.asarray(np.log(ratios), jnp.float32)
    advantages = jnp.asarray(rng.normal(size=batch), jnp.float32)
    return logits, old_logp, actions, advantages, ref_logp
rng = grading.rng("ppo_detached")
args = _fresh_batch(rng) + (float(rng.uniform(0.05, 0.5)), float(rng.uniform(0.1, 0.3)))
batch = args[1].shape[0]
grad_old, grad_adv = grading.call_raw(jax.grad(ppo_loss, argnums=(1, 3)), *args, task="ppo_loss",
                                      forbid=("*",), convert=False)
grading.equal(grad_adv, np.zeros(batch), "gradient of ppo_loss w.r.t. advantages",
              hint="gradient flows into advantages: wrap them in stop_gradient")
grading.equal(grad_old, np.zeros(batch), "gradient of ppo_loss w.r.t. old_logp",
              hint="gradient flows into old_logp: wrap the behaviour log probs in stop_gradient")
### END HIDDEN TESTS
_go, _ga = jax.grad(ppo_loss, argnums=(1, 3))(jnp.array([0.2, 0.0, -0.2]), jnp.log(jnp.array([0.3, 0.3])),
                                              jnp.array([0, 1]), jnp.array([1.0, -1.0]),
                                              jax.nn.log_softmax(jnp.zeros(3)), 0.1, 0.2)
assert not bool(jnp.any(_ga)), "gradient flows into advantages: wrap them in stop_gradient"
assert not bool(jnp.any(_go)), "gradient flows into old_logp: wrap the behaviour log probs in stop_gradient"
