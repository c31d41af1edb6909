"""Generate the nbgrader SOURCE notebooks of the assignment ``ppo_rlhf`` (``source/ppo_rlhf/``).

The notebooks are written from this script so their structure (cell types, nbgrader metadata,
points, hidden-test blocks) is reviewable as code and reproducible byte for byte:

    python tools/build_source_ppo_rlhf.py          # (re)write source/ppo_rlhf/*.ipynb
    python tools/build_source_ppo_rlhf.py --check  # exit 1 if the committed notebooks differ

Generation is deterministic: every cell has a fixed id, and there are no outputs and no execution
counts. Cell kinds (nbgrader terminology):

* ``given``     -- read-only code (locked, restored by nbgrader before autograding);
* ``answer``    -- autograded answer (``### BEGIN SOLUTION`` ... ``### END SOLUTION``);
* ``tests``     -- autograder tests (locked, with points): visible asserts, then a
                   ``### BEGIN HIDDEN TESTS`` block that decides the grade using only the
                   ``rlhf_lab.grading`` primitives on fresh random inputs;
* ``written``   -- manually graded markdown answer (model answer + rubric in a solution region,
                   so neither reaches ``release/``);
* ``predict``   -- an ungraded markdown cell where the student writes a prediction;
* ``md``        -- plain prose.

Notebooks: ``01_losses``, ``02_reward_and_reference``, ``03_rollouts``, ``04_make_it_yours``.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path
from textwrap import dedent

import nbformat

REPO = Path(__file__).resolve().parents[1]
OUT_DIR = REPO / "source" / "ppo_rlhf"
ASSIGNMENT = "ppo_rlhf"

KERNELSPEC = {"display_name": "Python 3 (ipykernel)", "language": "python", "name": "python3"}


# ------------------------------------------------------------------------------------------------
# Cell constructors


def _text(source: str) -> str:
    return dedent(source).strip("\n")


def _meta(grade_id: str, *, grade: bool, solution: bool, locked: bool, points=None) -> dict:
    meta = {
        "grade": grade,
        "grade_id": grade_id,
        "locked": locked,
        "schema_version": 3,
        "solution": solution,
        "task": False,
    }
    if points is not None:
        meta["points"] = points
    return {"nbgrader": meta}


def md(cell_id: str, source: str):
    """Plain prose (students may edit it; it is not graded)."""
    return nbformat.v4.new_markdown_cell(_text(source), id=cell_id)


def predict(cell_id: str, question: str):
    """An ungraded prediction prompt the student answers in place before running an experiment."""
    body = (
        "**Predict** (not graded, but write it down *before* running the next cell):\n"
        + _text(question)
        + "\n\n*My prediction:* "
    )
    return nbformat.v4.new_markdown_cell(body, id=cell_id)


def given(cell_id: str, source: str):
    """Read-only code cell."""
    return nbformat.v4.new_code_cell(
        _text(source), id=cell_id, metadata=_meta(cell_id, grade=False, solution=False, locked=True)
    )


def question(cell_id: str, source: str):
    """Read-only markdown cell (the text of a written question)."""
    return nbformat.v4.new_markdown_cell(
        _text(source), id=cell_id, metadata=_meta(cell_id, grade=False, solution=False, locked=True)
    )


def answer(cell_id: str, source: str):
    """Autograded answer cell; ``source`` contains a ``### BEGIN SOLUTION`` region."""
    text = _text(source)
    assert "### BEGIN SOLUTION" in text and "### END SOLUTION" in text, cell_id
    return nbformat.v4.new_code_cell(
        text, id=cell_id, metadata=_meta(cell_id, grade=False, solution=True, locked=False)
    )


def tests(cell_id: str, points: int, checks: str, visible: str, hidden: str):
    """Autograder test cell: a one-line comment saying what it checks, visible asserts, hidden tests."""
    source = "\n".join(
        [f"# {cell_id}: {checks}", _text(visible), "### BEGIN HIDDEN TESTS", _text(hidden), "### END HIDDEN TESTS"]
    )
    return nbformat.v4.new_code_cell(
        source, id=cell_id, metadata=_meta(cell_id, grade=True, solution=False, locked=True, points=points)
    )


def written(cell_id: str, points: int, model_answer: str, rubric: str):
    """Manually graded markdown answer; model answer and rubric live only in the source."""
    source = "\n".join(
        [
            "### BEGIN SOLUTION",
            "**Model answer.** " + _text(model_answer),
            "",
            f"**Rubric ({points} points).**",
            _text(rubric),
            "### END SOLUTION",
        ]
    )
    return nbformat.v4.new_markdown_cell(
        source, id=cell_id, metadata=_meta(cell_id, grade=True, solution=True, locked=False, points=points)
    )


def grading_start():
    """The locked first code cell of every notebook (the grading contract)."""
    return given("grading_start", "from rlhf_lab import grading\ngrading.start()")


def _points(cell) -> tuple[int, int]:
    """(autograded, manual) points of one cell."""
    meta = cell.get("metadata", {}).get("nbgrader", {})
    if not meta.get("grade"):
        return 0, 0
    pts = int(meta.get("points", 0))
    return (0, pts) if meta.get("solution") else (pts, 0)


def _grade_rows(cells) -> list[str]:
    rows = []
    for cell in cells:
        auto, manual = _points(cell)
        if auto or manual:
            kind = "autograded" if auto else "graded by hand"
            rows.append(f"| `{cell.metadata['nbgrader']['grade_id']}` | {auto or manual} | {kind} |")
    return rows


# Snippets shared by several hidden-test blocks. They are pasted into each cell (not defined once
# in an earlier cell) so every test cell stands on its own and no student cell can rebind them.

DIAGNOSE = '''
def _diagnose(got, want, mistakes, task, rtol=1e-4, atol=1e-5):
    """If got != want, name the classic mistake it matches; `mistakes()` -> {message: wrong formula's value}."""
    if not grading.matches(got, want, rtol=rtol, atol=atol):
        for message, wrong in mistakes().items():
            grading.check(not grading.matches(got, wrong, rtol=rtol, atol=atol), f"{task}: {message}")
'''

ONE_SAMPLE_TERM = '''
def _term(ratio, advantage, epsilon):
    """Minus the student's ppo_loss on a batch of ONE sample whose ratio is `ratio` (beta = 0, so no KL)."""
    logits = jnp.array([0.4, -0.3, 0.1], jnp.float32)
    logp = jax.nn.log_softmax(logits)
    old_logp = logp[1:2] - jnp.log(jnp.float32(ratio))
    loss = grading.call(ppo_loss, logits, old_logp, jnp.array([1]), jnp.array([advantage], jnp.float32),
                        logp, 0.0, epsilon, task="ppo_loss", forbid=("*",))
    return -loss
'''

PPO_BATCH = '''
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
'''

TRUSTED_UPDATE = '''
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
'''

FRESH_UPDATE_INPUTS = '''
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
'''

TRUSTED_RUN = '''
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
'''

NB3_FORBID = (
    'FORBID = ("exact_advantages", "train", "train_core", "make_train", "_rollout_update", '
    '"seed_style_train", "run_lesson", "sweep_grid", "sweep_seeds")'
)


def _hidden(*parts: str) -> str:
    return "\n".join(_text(p) for p in parts)


# ------------------------------------------------------------------------------------------------
# Notebook 1: the preference loss and the signed clipped PPO loss


def nb01_cells():
    return [
        md("intro_01", """
            # Build step 1: the reward-model loss and the signed PPO loss

            This assignment follows one RLHF run on a *bandit*: one prompt, three possible responses
            (actions), a reward model fitted to pairwise preferences, and a policy trained with PPO.
            Because there are only three actions, every expectation can be summed exactly, so nothing
            you measure is blurred by sampling noise.

            In this notebook you write the two losses everything else is built on.
            """),
        grading_start(),
        given("imports_01", """
            import jax
            import jax.numpy as jnp
            import numpy as np
            """),
        md("pref_intro", r"""
            ## 1. The preference loss

            A linear reward model scores a response with features $x$ as $r(x) = x \cdot w$. Given a
            pair where a labeller preferred `chosen` over `rejected`, the Bradley-Terry model says
            the preference happens with probability $\sigma(m)$ for the margin
            $m = (x_{\text{chosen}} - x_{\text{rejected}}) \cdot w$. Its negative log-likelihood,
            averaged over pairs, is

            $$L(w) = \frac{1}{n}\sum_i \operatorname{softplus}(-m_i), \qquad \operatorname{softplus}(z) = \log(1 + e^z).$$

            `softplus(-m)` equals $-\log\sigma(m)$ but never overflows. Only `w` is trained; the
            feature arrays are data.
            """),
        answer("preference_loss_answer", '''
            def preference_loss(w, chosen, rejected):
                """Bradley-Terry loss: mean_i softplus(-(chosen_i - rejected_i) . w).

                w: [d] reward weights (trained). chosen, rejected: [n_pairs, d] features (fixed data).
                Returns a scalar.
                """
                ### BEGIN SOLUTION
                margin = (chosen - rejected) @ w
                return jnp.mean(jax.nn.softplus(-margin))
                ### END SOLUTION
            '''),
        tests(
            "test_preference_loss", 2,
            "preference_loss matches the reference Bradley-Terry loss (value and gradient) on fresh random pairs",
            visible="""
                # a zero margin costs log 2 per pair
                assert abs(float(preference_loss(jnp.zeros(2), jnp.ones((3, 2)), jnp.zeros((3, 2)))) - np.log(2.0)) < 1e-6, (
                    "with w = 0 every margin is 0, so the loss must be log 2 = 0.6931 (softplus(0), averaged over pairs)")
                """,
            hidden=_hidden(DIAGNOSE, '''
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
                '''),
        ),
        md("ppo_intro", r"""
            ## 2. The signed clipped PPO loss

            Four objects appear in the loss, and each has its own lifetime:

            | name | what it is | changes when |
            |---|---|---|
            | `logits` | the **current** policy $\pi_\theta$ | every inner optimisation step |
            | `old_logp` | log-probabilities of the sampled actions under the **old (behaviour)** policy that collected the batch | once per rollout (frozen while the batch is reused) |
            | `ref_logp` | the **reference** policy $\pi_{\text{ref}}$, all actions | never |
            | `advantages` | frozen reward minus a baseline, per sample | once per rollout |

            With the ratio $\rho_i = \pi_\theta(a_i)/\pi_{\text{old}}(a_i) = \exp(\log\pi_\theta(a_i) - \texttt{old\_logp}_i)$,
            the loss minimised by one inner step is

            $$L(\theta) = -\frac{1}{B}\sum_i \min\big(\rho_i A_i,\ \operatorname{clip}(\rho_i, 1-\epsilon, 1+\epsilon)\,A_i\big)
            \;+\; \beta \sum_a \pi_\theta(a)\,\big(\log\pi_\theta(a) - \log\pi_{\text{ref}}(a)\big).$$

            Take the minimum of the two **products**: the sign of $A$ decides which bound can bind.
            The KL term is exact (a sum over all actions) and is measured against the reference,
            not the old policy. `old_logp`, `advantages` and `ref_logp` are constants of the update:
            wrap them in `jax.lax.stop_gradient` so no gradient can flow into them.
            """),
        answer("ppo_loss_answer", '''
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
            '''),
        predict("predict_clip_terms", r"""
            with $\epsilon = 0.2$, what are the surrogate terms $\min(\rho A, \operatorname{clip}(\rho)A)$ for
            $(\rho, A) = (1.5, 2)$ and for $(\rho, A) = (0.5, -2)$? Which bound of the clip range matters
            in each case?
            """),
        given("experiment_clip_terms", '''
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
            '''),
        tests(
            "test_clip_named_terms", 1,
            "the lesson's worked example: (rho, A) = (1.5, 2) and (0.5, -2) with epsilon 0.2 give [2.4, -1.6]",
            visible="""
                assert not np.allclose(worked_terms, [2.4, -1.0], atol=1e-5), (
                    "ratio clipped but the signed min was dropped (negative-advantage case wrong)")
                assert np.allclose(worked_terms, [2.4, -1.6], atol=1e-5), f"expected [2.4, -1.6], got {worked_terms}"
                """,
            hidden=_hidden(DIAGNOSE, ONE_SAMPLE_TERM, '''
                got = np.array([_term(1.5, 2.0, 0.2), _term(0.5, -2.0, 0.2)])
                _diagnose(got, [2.4, -1.6], lambda: {
                    "ratio clipped but the signed min was dropped (negative-advantage case wrong)": [2.4, -1.0],
                    "neither term is clipped: use min(rho*A, clip(rho, 1-eps, 1+eps)*A)": [3.0, -1.0],
                    "the loss must be MINUS the surrogate (we minimise -surrogate + beta*KL)": [-2.4, 1.6],
                }, "ppo_loss", atol=1e-5)
                grading.close(got, [2.4, -1.6], "surrogate terms for (rho, A) = (1.5, 2) and (0.5, -2)",
                              rtol=0.0, atol=1e-5)
                '''),
        ),
        tests(
            "test_clip_both_signs", 3,
            "per-sample terms equal min(rho*A, clip(rho)*A) for both signs of A, ratios below, inside and above the band",
            visible="""
                # a ratio inside the band is not clipped, whatever the sign of A
                assert abs(one_sample_term(ppo_loss, 1.1, -1.0, 0.2) - (-1.1)) < 1e-5, (
                    "ratio 1.1 is inside the band [0.8, 1.2], so with A = -1 the surrogate term must be rho*A = -1.1")
                """,
            hidden=_hidden(DIAGNOSE, ONE_SAMPLE_TERM, '''
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
                '''),
        ),
        tests(
            "test_kl_term", 2,
            "with every ratio inside the clip band, the loss is -mean(rho*A) + beta*KL(pi || pi_ref): checks the KL penalty",
            visible="""
                # at the reference, with ratios of 1 and zero advantages, the loss is exactly 0
                _logp = jax.nn.log_softmax(jnp.array([0.2, 0.0, -0.2]))
                assert float(ppo_loss(jnp.array([0.2, 0.0, -0.2]), _logp[jnp.array([0, 2])], jnp.array([0, 2]),
                                      jnp.zeros(2), _logp, 0.5, 0.2)) == 0.0, (
                    "at the reference with zero advantages both terms vanish: the loss must be exactly 0.0")
                """,
            hidden=_hidden(DIAGNOSE, PPO_BATCH, '''
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
                '''),
        ),
        tests(
            "test_ppo_loss_value_grad", 2,
            "value and gradient w.r.t. logits match the reference on a fresh batch (clipping and KL both active)",
            visible="""
                _g = jax.grad(ppo_loss)(jnp.array([0.2, 0.0, -0.2]), jnp.log(jnp.array([0.3, 0.3])), jnp.array([0, 1]),
                                        jnp.array([1.0, -1.0]), jax.nn.log_softmax(jnp.zeros(3)), 0.1, 0.2)
                assert _g.shape == (3,) and bool(jnp.all(jnp.isfinite(_g))), (
                    f"jax.grad of ppo_loss w.r.t. the 3 logits must be 3 finite numbers, got {_g}")
                """,
            hidden=_hidden(DIAGNOSE, PPO_BATCH, '''
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
                '''),
        ),
        tests(
            "test_ppo_loss_detached", 2,
            "gradients w.r.t. old_logp and advantages are exactly zero (both are constants of the update)",
            visible="""
                _go, _ga = jax.grad(ppo_loss, argnums=(1, 3))(jnp.array([0.2, 0.0, -0.2]), jnp.log(jnp.array([0.3, 0.3])),
                                                              jnp.array([0, 1]), jnp.array([1.0, -1.0]),
                                                              jax.nn.log_softmax(jnp.zeros(3)), 0.1, 0.2)
                assert not bool(jnp.any(_ga)), "gradient flows into advantages: wrap them in stop_gradient"
                assert not bool(jnp.any(_go)), "gradient flows into old_logp: wrap the behaviour log probs in stop_gradient"
                """,
            hidden=_hidden(PPO_BATCH, '''
                rng = grading.rng("ppo_detached")
                args = _fresh_batch(rng) + (float(rng.uniform(0.05, 0.5)), float(rng.uniform(0.1, 0.3)))
                batch = args[1].shape[0]
                grad_old, grad_adv = grading.call_raw(jax.grad(ppo_loss, argnums=(1, 3)), *args, task="ppo_loss",
                                                      forbid=("*",), convert=False)
                grading.equal(grad_adv, np.zeros(batch), "gradient of ppo_loss w.r.t. advantages",
                              hint="gradient flows into advantages: wrap them in stop_gradient")
                grading.equal(grad_old, np.zeros(batch), "gradient of ppo_loss w.r.t. old_logp",
                              hint="gradient flows into old_logp: wrap the behaviour log probs in stop_gradient")
                '''),
        ),
    ]


# ------------------------------------------------------------------------------------------------
# Notebook 2: fit and freeze the reward, snapshot the reference


def nb02_cells():
    return [
        md("intro_02", """
            # Build step 2: fit and freeze the reward, snapshot the reference

            Before any policy update, two things are fixed for the whole run: the **reward model**
            (fitted once to preferences, then frozen) and the **reference policy** (a copy of the
            starting policy that the KL penalty compares against). Here you build both.

            This notebook uses the course library's `preference_loss`, so a slip in notebook 1 does
            not carry over.
            """),
        grading_start(),
        given("imports_02", """
            import jax
            import jax.numpy as jnp
            import numpy as np
            import matplotlib.pyplot as plt
            from rlhf_lab import preference_loss
            from rlhf_lab.reward import LESSON_FEATURES, LESSON_CHOSEN, LESSON_REJECTED
            """),
        md("data_02", """
            ## 1. The preference data

            Each of the three actions has two features (rows of `LESSON_FEATURES`):
            action 0 is `[1, 0]`, action 1 is `[0, 1]`, action 2 is `[-1, -1]`. Labellers compared
            three pairs and preferred 0 over 1, 0 over 2, and 1 over 2 (`LESSON_CHOSEN`,
            `LESSON_REJECTED` hold the action indices).

            Fit $w$ by plain gradient descent from $w_0 = 0$:
            $w_{k+1} = w_k - \\text{lr}\\,\\nabla L(w_k)$, using `preference_loss` on the chosen and
            rejected feature rows. The lesson uses 100 steps at learning rate 0.1. The per-action
            rewards are then `features @ w`, frozen with `jax.lax.stop_gradient`.
            """),
        answer("fit_reward_answer", '''
            def fit_reward_model(features, chosen_idx, rejected_idx, steps=100, learning_rate=0.1):
                """Fit a linear reward model to preference pairs by gradient descent, then freeze it.

                features: [n_actions, d]; chosen_idx, rejected_idx: [n_pairs] action indices.
                w starts at zeros(d); each step is w <- w - learning_rate * grad preference_loss(w).
                Returns (weights [d], rewards [n_actions] = features @ weights, frozen).
                """
                ### BEGIN SOLUTION
                features = jnp.asarray(features, jnp.float32)
                chosen = features[jnp.asarray(chosen_idx)]
                rejected = features[jnp.asarray(rejected_idx)]
                grad_fn = jax.jit(jax.grad(lambda w: preference_loss(w, chosen, rejected)))
                w = jnp.zeros(features.shape[1], jnp.float32)
                for _ in range(steps):
                    w = w - learning_rate * grad_fn(w)
                return w, jax.lax.stop_gradient(features @ w)
                ### END SOLUTION
            '''),
        predict("predict_rewards", """
            which action will get the highest reward, and which the lowest? Will action 1 end up
            closer to action 0 or to action 2?
            """),
        given("fit_lesson_rewards", """
            reward_w, rewards = fit_reward_model(LESSON_FEATURES, LESSON_CHOSEN, LESSON_REJECTED)
            print("reward weights:", np.asarray(reward_w))
            print("frozen per-action rewards:", np.asarray(rewards))
            """),
        given("plot_rewards", """
            fig, ax = plt.subplots(figsize=(5, 3))
            ax.bar([f"action {a}" for a in range(len(rewards))], np.asarray(rewards), color="#1f77b4")
            ax.axhline(0.0, color="black", linewidth=0.8)
            ax.set_xlabel("action")
            ax.set_ylabel("learned reward (reward-model score units)")
            ax.set_title("Frozen rewards after 100 steps at lr 0.1")
            plt.show()
            """),
        tests(
            "test_fit_reward_lesson", 2,
            "100 steps at lr 0.1 on the lesson's preferences give the recorded rewards [1.9811294, 0.327278, -2.3084073]",
            visible="""
                np.testing.assert_allclose(np.asarray(rewards), [1.9811294, 0.327278, -2.3084073], atol=1e-5,
                                           err_msg="the lesson's fitted rewards (100 steps, learning rate 0.1, w from 0)")
                """,
            hidden='''
                R = grading.reference
                features = np.array([[1.0, 0.0], [0.0, 1.0], [-1.0, -1.0]], np.float32)
                chosen_idx, rejected_idx = np.array([0, 0, 1]), np.array([1, 2, 2])
                want = R.fit_reward(features, chosen_idx, rejected_idx, steps=100, learning_rate=0.1)
                grading.close(rewards, want.rewards, "rewards fitted on the lesson's preferences", rtol=1e-5, atol=1e-5)
                grading.close(rewards, [1.9811294, 0.327278, -2.3084073], "the lesson's recorded rewards",
                              rtol=0.0, atol=1e-5)
                grading.close(reward_w, want.weights, "reward weights fitted on the lesson's preferences",
                              rtol=1e-5, atol=1e-5)
                # a short fit on the lesson's data through the grader (delegation to fit_reward is caught here)
                out = grading.call_raw(fit_reward_model, features, chosen_idx, rejected_idx, steps=7,
                                       learning_rate=0.1, task="fit_reward_model",
                                       forbid=("fit_reward", "_fit", "lesson_rewards", "_lesson_rewards_np"),
                                       convert=False)
                grading.check(isinstance(out, (tuple, list)) and len(out) == 2,
                              "fit_reward_model must return the pair (weights, rewards)")
                short = R.fit_reward(features, chosen_idx, rejected_idx, steps=7, learning_rate=0.1)
                grading.close(out[1], short.rewards, "rewards after 7 steps on the lesson's data", rtol=1e-4, atol=1e-5,
                              hint="run exactly `steps` gradient-descent steps from w = 0")
                ''',
        ),
        tests(
            "test_fit_reward_fresh", 2,
            "on fresh random preference data, steps and learning rate, weights and rewards match the reference fit",
            visible="""
                _w, _r = fit_reward_model(np.eye(3, 2, dtype=np.float32), np.array([0]), np.array([1]), steps=1,
                                          learning_rate=1.0)
                np.testing.assert_allclose(np.asarray(_w), [0.5, -0.5], atol=1e-6,  # one step from w = 0
                                           err_msg="one gradient step from w = 0: w <- w - learning_rate * grad")
                """,
            hidden='''
                R = grading.reference
                rng = grading.rng("fit_reward_fresh")
                n, d, pairs = 3, 2, 3  # the lesson's shapes, fresh values
                features = rng.normal(size=(n, d)).astype(np.float32)
                chosen_idx = rng.integers(0, n, size=pairs)
                rejected_idx = (chosen_idx + rng.integers(1, n, size=pairs)) % n
                steps, lr = int(rng.integers(6, 12)), float(rng.uniform(0.2, 0.6))
                out = grading.call_raw(fit_reward_model, features, chosen_idx, rejected_idx, steps=steps,
                                       learning_rate=lr, task="fit_reward_model",
                                       forbid=("fit_reward", "_fit", "lesson_rewards", "_lesson_rewards_np"),
                                       convert=False)
                grading.check(isinstance(out, (tuple, list)) and len(out) == 2,
                              "fit_reward_model must return the pair (weights, rewards)")
                want = R.fit_reward(features, chosen_idx, rejected_idx, steps=steps, learning_rate=lr)
                if not grading.matches(out[0], want.weights, rtol=1e-4, atol=1e-5):
                    for message, wrong in {
                        "the steps argument was ignored (100 steps were run)":
                            R.fit_reward(features, chosen_idx, rejected_idx, steps=100, learning_rate=lr).weights,
                        "the learning_rate argument was ignored (0.1 was used)":
                            R.fit_reward(features, chosen_idx, rejected_idx, steps=steps, learning_rate=0.1).weights,
                        "one gradient step too few": R.fit_reward(features, chosen_idx, rejected_idx, steps=steps - 1,
                                                                  learning_rate=lr).weights,
                    }.items():
                        grading.check(not grading.matches(out[0], wrong, rtol=1e-4, atol=1e-5),
                                      "fit_reward_model: " + message)
                grading.close(out[0], want.weights, f"weights after {steps} steps at lr {lr:.3f} on fresh data",
                              rtol=1e-4, atol=1e-5, hint="gradient DESCENT on preference_loss from w = 0")
                grading.close(out[1], want.rewards, "per-action rewards on fresh data", rtol=1e-4, atol=1e-5,
                              hint="the rewards are features @ w for every action")
                ''',
        ),
        md("reference_02", """
            ## 2. Snapshot the reference

            The reference policy is the starting policy, frozen. In JAX, arrays are immutable, but
            policy parameters often live in NumPy buffers that an optimiser updates **in place**
            (`theta -= lr * grad`). A reference that shares memory with those parameters would drift
            with them, and the KL penalty would quietly measure distance to the *current* policy.

            Write `snapshot_reference(policy_logits)`: return the reference log-probabilities
            `log_softmax(policy_logits)` as an independent NumPy array (float32), without modifying
            the argument.
            """),
        answer("snapshot_reference_answer", '''
            def snapshot_reference(policy_logits):
                """Frozen reference log-probs: log_softmax(policy_logits) as an independent NumPy copy.

                policy_logits: [n_actions] (may be a NumPy array updated in place later).
                Returns [n_actions] float32 NumPy array that shares no memory with the argument.
                """
                ### BEGIN SOLUTION
                return np.array(jax.nn.log_softmax(jnp.asarray(policy_logits, jnp.float32)), dtype=np.float32, copy=True)
                ### END SOLUTION
            '''),
        predict("predict_reference", """
            the next cell takes three in-place gradient-like steps on `theta` after the snapshot.
            Should `ref_logp` change? What would the KL to the reference read if it did?
            """),
        given("reference_experiment", """
            theta = np.array([0.2, 0.0, -0.2], dtype=np.float32)
            ref_logp = snapshot_reference(theta)
            ref_before = ref_logp.copy()
            for _ in range(3):
                theta += np.float32(0.3) * np.asarray(rewards)  # in-place updates of the policy parameters
            print("policy logits after updates:", theta)
            print("reference unchanged:", bool(np.array_equal(ref_logp, ref_before)), ref_logp)
            """),
        tests(
            "test_reference_snapshot", 2,
            "the reference equals log_softmax of fresh logits, leaves them untouched, and does not move when they are updated in place",
            visible="""
                assert np.array_equal(ref_logp, ref_before), (
                    "the reference changed when theta was updated in place: return an independent copy")
                np.testing.assert_allclose(ref_logp, jax.nn.log_softmax(jnp.array([0.2, 0.0, -0.2])), atol=1e-6,
                                           err_msg="the reference is log_softmax of the initial logits [0.2, 0.0, -0.2]")
                """,
            hidden='''
                rng = grading.rng("reference_snapshot")
                n = 3  # the lesson's number of actions, fresh values
                policy = rng.normal(size=n).astype(np.float32)
                original = policy.copy()
                snap = grading.call_raw(snapshot_reference, policy, task="snapshot_reference", forbid=("*",),
                                        convert=False)
                grading.equal(policy, original, "policy logits after snapshot_reference",
                              hint="snapshot_reference must not modify the policy parameters: return an independent copy")
                x = original.astype(np.float64)
                grading.close(snap, x - (np.max(x) + np.log(np.sum(np.exp(x - np.max(x))))),
                              "reference log-probabilities", rtol=1e-5, atol=1e-5, hint="return log_softmax(policy_logits)")
                frozen = np.array(snap, dtype=np.float64, copy=True)
                policy += rng.normal(size=n).astype(np.float32)  # later in-place optimiser steps
                policy *= np.float32(3.0)
                grading.equal(snap, frozen, "reference after in-place updates of the policy logits",
                              hint="the reference moved with the policy: it shares memory with the parameters, "
                                   "return an independent copy")
                ''',
        ),
    ]


# ------------------------------------------------------------------------------------------------
# Notebook 3: rollouts with frozen old log probs, the recorded numbers, the 3-panel figure


def nb03_cells():
    return [
        md("intro_03", """
            # Build step 3: collect rollouts, reuse each batch, reach the recorded numbers

            One **rollout** samples a batch of actions from the current policy, freezes what the
            batch needs (the behaviour log-probabilities and the advantages), and then takes
            several inner gradient steps on that same batch. The next rollout samples a fresh batch
            from the updated policy. The reference and the reward never change.

            This notebook gives you the course library's `ppo_loss`, the lesson's frozen rewards and
            the reference logits, so earlier mistakes do not carry over.
            """),
        grading_start(),
        given("imports_03", """
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
            """),
        md("rollout_03", r"""
            ## 1. One rollout

            Write `rollout_update(logits, draw_key, rewards, ref_logp, *, batch_size, epochs, beta,
            epsilon, learning_rate)`:

            1. `old_logp_all = log_softmax(logits)` is the behaviour policy of this batch;
            2. sample `batch_size` actions with `jax.random.categorical(draw_key, old_logp_all, shape=(batch_size,))`;
            3. freeze `old_logp = old_logp_all[actions]` and the advantages
               $A_i = r(a_i) - \sum_a \pi_{\text{old}}(a)\,r(a)$ (the exact baseline);
            4. take `epochs` steps `logits <- logits - learning_rate * grad` with
               `_, grad = ppo_step(logits, old_logp, actions, advantages, ref_logp, beta, epsilon)`;
            5. return the new logits.

            Nothing in steps 1 to 3 is recomputed inside the inner loop, and the KL is always
            measured against `ref_logp`.
            """),
        answer("rollout_update_answer", '''
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
            '''),
        tests(
            "test_rollout_update_fresh", 3,
            "on fresh random logits, rewards, reference and key, one rollout update equals the reference procedure",
            visible="""
                _new = rollout_update(jnp.asarray(init_logits), jax.random.key(0), rewards,
                                      jax.nn.log_softmax(jnp.asarray(init_logits)), batch_size=32, epochs=2, beta=0.2,
                                      epsilon=0.2, learning_rate=0.15)
                assert np.shape(_new) == (3,) and bool(np.all(np.isfinite(np.asarray(_new)))), (
                    f"rollout_update must return the 3 updated logits (finite numbers), got {_new}")
                """,
            hidden=_hidden(TRUSTED_UPDATE, FRESH_UPDATE_INPUTS, NB3_FORBID, '''
                rng = grading.rng("rollout_update_fresh")
                inputs, hyper = _fresh_update_inputs(rng, epochs=3)
                rewards_before, ref_before = inputs[2].copy(), inputs[3].copy()
                got = grading.call(rollout_update, jnp.asarray(inputs[0]), *inputs[1:], task="rollout_update",
                                   forbid=FORBID, **hyper)
                grading.equal(inputs[3], ref_before, "ref_logp after rollout_update", hint="the reference must never change")
                grading.equal(inputs[2], rewards_before, "rewards after rollout_update", hint="the reward is frozen")
                _check_update(got, inputs, hyper, ["recompute_old", "kl_to_old", "no_baseline", "batch_mean_baseline",
                                                   "recompute_advantages", "sample_reference", "one_step"])
                '''),
        ),
        tests(
            "test_old_logp_frozen", 2,
            "starting at the reference with 3 inner steps: old log probs stay frozen across the inner steps (ratios move away from 1)",
            visible="""
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
                """,
            hidden=_hidden(TRUSTED_UPDATE, FRESH_UPDATE_INPUTS, NB3_FORBID, '''
                rng = grading.rng("old_logp_frozen")
                # at the reference the old policy and the reference coincide, so only the inner-loop freezing matters
                inputs, hyper = _fresh_update_inputs(rng, epochs=3, start_at_reference=True)
                got = grading.call(rollout_update, jnp.asarray(inputs[0]), *inputs[1:], task="rollout_update",
                                   forbid=FORBID, **hyper)
                _check_update(got, inputs, hyper, ["recompute_old", "recompute_advantages", "one_step"])
                '''),
        ),
        tests(
            "test_kl_against_reference", 2,
            "with one inner step and a reference far from the policy, the KL term pulls towards ref_logp, not the old policy; the reference is unchanged",
            visible="""
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
                """,
            hidden=_hidden(TRUSTED_UPDATE, FRESH_UPDATE_INPUTS, NB3_FORBID, '''
                rng = grading.rng("kl_against_reference")
                # one inner step: frozen and recomputed old log probs agree, so only the KL anchor matters
                inputs, hyper = _fresh_update_inputs(rng, epochs=1, beta_range=(0.5, 1.0))
                ref_before = inputs[3].copy()
                got = grading.call(rollout_update, jnp.asarray(inputs[0]), *inputs[1:], task="rollout_update",
                                   forbid=FORBID, **hyper)
                grading.equal(inputs[3], ref_before, "ref_logp after rollout_update", hint="the reference must never change")
                _check_update(got, inputs, hyper, ["kl_to_old", "no_baseline", "batch_mean_baseline", "sample_reference"])
                '''),
        ),
        md("loop_03", """
            ## 2. The loop

            Write `run_ppo(rewards, init_logits, *, iterations=40, batch_size=128, epochs=3, beta=0.2,
            epsilon=0.2, learning_rate=0.15, seed=11, update=rollout_update)`:

            * the reference is `log_softmax(init_logits)`, computed once;
            * start from `key = jax.random.key(seed)`; before each rollout split it,
              `key, draw = jax.random.split(key)`, and pass `draw` to `update`;
            * after each rollout record the **exact** expected reward and the exact KL to the
              reference (use the library's `expected_reward` and `categorical_kl`) and the action
              probabilities.

            Return a dict with `reward` `[T]`, `kl` `[T]`, `probs` `[T, n]`, `final_logits` `[n]`,
            `ref_logp` `[n]` and `initial_reward` (the reference's expected reward). The `update`
            argument lets the grader test the loop on its own.
            """),
        answer("run_ppo_answer", '''
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
            '''),
        tests(
            "test_loop", 2,
            "run_ppo chains rollouts: one fresh subkey per rollout, a fixed reference, each output fed into the next rollout, exact reward and KL recorded",
            visible="""
                _out = run_ppo(rewards, init_logits, iterations=2, batch_size=8, epochs=1)
                assert len(_out["reward"]) == 2 and len(_out["kl"]) == 2 and np.shape(_out["probs"]) == (2, 3), (
                    "with iterations=2, run_ppo must record one reward, one KL and one probability row per rollout")
                """,
            hidden=_hidden(NB3_FORBID, '''
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
                '''),
        ),
        predict("predict_run", """
            over 40 rollouts, which action gains probability? Does the KL to the reference rise,
            fall or stay flat, and will the final reward reach the best single action's reward
            (about 1.98)?
            """),
        given("run_lesson_03", """
            run = run_ppo(rewards, init_logits)
            print("Reward initial/final and final KL:", run["initial_reward"], run["reward"][-1], run["kl"][-1])
            """),
        tests(
            "test_recorded_numbers", 3,
            "your pipeline reproduces the recorded run (0.28191882 / 1.9185448 / 0.7824773) and a fresh short run matches the reference procedure",
            visible="""
                assert abs(run["initial_reward"] - 0.28191882) < 1e-5, f"initial reward {run['initial_reward']}, expected 0.28191882"
                assert abs(run["reward"][-1] - 1.9185448) < 1e-5, f"final reward {run['reward'][-1]}, expected 1.9185448"
                assert abs(run["kl"][-1] - 0.7824773) < 1e-5, f"final KL {run['kl'][-1]}, expected 0.7824773"
                """,
            hidden=_hidden(TRUSTED_UPDATE, TRUSTED_RUN, NB3_FORBID, '''
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
                '''),
        ),
        given("plot_03", """
            view = SimpleNamespace(clip_frac=np.zeros(len(run["reward"])), **run)  # clip_frac is not plotted
            fig = three_panel_figure(view, rewards, beta=0.2)
            plt.show()
            """),
        md("read_03", """
            **Reading the figure.** Panel (a) is the exact expected learned reward after each rollout
            (reward-model score units), panel (b) the exact KL to the fixed reference (nats), panel
            (c) the reference and final action probabilities with the analytic optimum marked. Reward
            and KL rise together: probability moves to action 0, which the reward model scores
            highest, and moving away from the reference costs KL. The panels have different units;
            never add their heights. Everything here is a synthetic bandit, not a measure of human
            approval.
            """),
    ]


# ------------------------------------------------------------------------------------------------
# Notebook 4: make it yours


def nb04_cells():
    return [
        md("intro_04", """
            # Make it yours

            Short experiments that probe the pieces you built: both clipping directions, why a
            baseline does not bias the gradient, KL at the reference, detaching behaviour
            information in a new setting, and the analytic optimum of the regularised objective.
            The trained run comes from the course library (`seed_style_train`, the lesson's own loop),
            so this notebook does not depend on your earlier answers.
            """),
        grading_start(),
        given("imports_04", """
            import jax
            import jax.numpy as jnp
            import numpy as np
            import matplotlib.pyplot as plt
            from rlhf_lab import lesson_rewards
            from rlhf_lab.lesson import seed_style_train

            rewards = lesson_rewards()                                      # frozen rewards, [3]
            lesson_run = seed_style_train()                                 # the library's run of the lesson loop
            ref_logp = jax.nn.log_softmax(jnp.array([0.2, 0.0, -0.2]))      # fixed reference, [3]
            final_logp = jax.nn.log_softmax(lesson_run["final_logits"])     # trained policy, [3]
            """),
        md("clip_04", r"""
            ## 1. Both clipping directions

            Write `signed_clip_terms(ratios, advantages, epsilon)` returning the per-sample terms
            $\min(\rho A, \operatorname{clip}(\rho, 1-\epsilon, 1+\epsilon)A)$ for arrays of ratios and
            advantages (do not call the library's PPO functions).
            """),
        predict("predict_clip_04", r"""
            for $(\rho, A) = (1.5, 2)$ the unclipped product is 3. For $(0.5, -2)$ it is $-1$. What
            will the two clipped terms be, and why does the *negative* advantage pick the more
            negative product?
            """),
        answer("signed_clip_terms_answer", '''
            def signed_clip_terms(ratios, advantages, epsilon):
                """Per-sample signed clipped surrogate: min(rho * A, clip(rho, 1-eps, 1+eps) * A), same shape as ratios."""
                ### BEGIN SOLUTION
                ratios = jnp.asarray(ratios)
                advantages = jnp.asarray(advantages)
                return jnp.minimum(ratios * advantages, jnp.clip(ratios, 1.0 - epsilon, 1.0 + epsilon) * advantages)
                ### END SOLUTION
            '''),
        given("experiment_clip_04", """
            terms = signed_clip_terms(np.array([1.5, 0.5]), np.array([2.0, -2.0]), 0.2)
            print("Clipped surrogate terms:", np.asarray(terms))
            """),
        tests(
            "test_clip_directions", 2,
            "the terms for (1.5, 2) and (0.5, -2) are [2.4, -1.6], and fresh ratios of both advantage signs match min(rho*A, clip(rho)*A)",
            visible="""
                np.testing.assert_allclose(np.asarray(terms), [2.4, -1.6], atol=1e-6,
                                           err_msg="signed clipped terms for (rho, A) = (1.5, 2) and (0.5, -2)")
                """,
            hidden=_hidden(DIAGNOSE, '''
                FORBID = ("clipped_surrogate", "ppo_loss")
                named = grading.call(signed_clip_terms, np.array([1.5, 0.5]), np.array([2.0, -2.0]), 0.2,
                                     task="signed_clip_terms", forbid=FORBID)
                _diagnose(named, [2.4, -1.6], lambda: {
                    "ratio clipped but the signed min was dropped (negative-advantage case wrong)": [2.4, -1.0],
                    "neither term is clipped: use min(rho*A, clip(rho, 1-eps, 1+eps)*A)": [3.0, -1.0],
                }, "signed_clip_terms", atol=1e-6)
                grading.close(named, [2.4, -1.6], "terms for (1.5, 2) and (0.5, -2)", rtol=0.0, atol=1e-6)
                rng = grading.rng("clip_directions")
                eps = float(rng.uniform(0.1, 0.3))
                ratios = np.concatenate([rng.uniform(0.3, 1 - eps - 0.02, 4), rng.uniform(1 - eps + 0.02, 1 + eps - 0.02, 4),
                                         rng.uniform(1 + eps + 0.02, 2.5, 4)])
                advs = np.tile([1.0, -1.0], 6) * rng.uniform(0.2, 3.0, 12)
                got = grading.call(signed_clip_terms, ratios, advs, eps, task="signed_clip_terms", forbid=FORBID)
                clipped = np.clip(ratios, 1 - eps, 1 + eps)
                want = np.minimum(ratios * advs, clipped * advs)
                _diagnose(got, want, lambda: {
                    "ratio clipped but the signed min was dropped (negative-advantage case wrong)":
                        np.minimum(ratios, clipped) * advs,
                    "only the clipped product is used: the min with rho*A is missing": clipped * advs,
                    "the clip range ignores the epsilon argument": np.minimum(ratios * advs, np.clip(ratios, 0.8, 1.2) * advs),
                }, "signed_clip_terms")
                grading.close(got, want, f"terms for fresh ratios and advantages of both signs (epsilon {eps:.3f})",
                              rtol=1e-5, atol=1e-5)
                '''),
        ),
        md("baseline_04", r"""
            ## 2. The baseline cancels, exactly

            The score-function gradient of the expected reward can use any constant baseline $c$:

            $$\nabla_\theta \sum_a \pi(a) r(a) = \sum_a \pi(a)\,\nabla_\theta\log\pi(a)\,\big(r(a) - c\big),$$

            because $\sum_a \pi(a)\nabla_\theta\log\pi(a) = \nabla_\theta \sum_a \pi(a) = 0$. With three actions
            we can enumerate the sum instead of trusting a noisy sample.

            Write `score_terms(logits, rewards, baseline)` returning the `[n_actions, n_params]`
            matrix whose row $a$ is $\pi(a)\,(r(a) - c)\,\nabla_\theta\log\pi(a)$ (hint:
            `jax.jacrev(jax.nn.log_softmax)(logits)` has row $a$ equal to $\nabla_\theta\log\pi(a)$).
            The enumerated gradient is the sum of the rows.
            """),
        predict("predict_baseline", """
            as the baseline c moves from -3 to 3, will the enumerated gradient (sum of rows) change?
            Will the variance of a one-sample estimate change?
            """),
        answer("score_terms_answer", '''
            def score_terms(logits, rewards, baseline):
                """Rows pi(a) (r(a) - c) grad_theta log pi(a) for every action a: shape [n_actions, n_params]."""
                ### BEGIN SOLUTION
                probs = jax.nn.softmax(logits)
                score = jax.jacrev(jax.nn.log_softmax)(logits)
                return probs[:, None] * (rewards - baseline)[:, None] * score
                ### END SOLUTION
            '''),
        given("experiment_baseline", """
            probe = jnp.array([0.3, -0.2, 0.1])
            probe_probs = np.asarray(jax.nn.softmax(probe))
            exact = np.asarray(jax.grad(lambda z: jnp.sum(jax.nn.softmax(z) * rewards))(probe))
            baselines = np.linspace(-3.0, 3.0, 13)
            rows = [np.asarray(score_terms(probe, rewards, c)) for c in baselines]
            enumerated = np.array([r.sum(axis=0) for r in rows])
            # variance of the one-sample estimate g(a) = grad log pi(a) (r(a) - c), a ~ pi, summed over components
            variance = np.array([np.sum(r**2 / probe_probs[:, None]) - np.sum(r.sum(axis=0) ** 2) for r in rows])
            print("largest |enumerated - exact| over all baselines:", np.abs(enumerated - exact).max())

            fig, (ax_g, ax_v) = plt.subplots(1, 2, figsize=(11, 3.5))
            for j in range(3):
                ax_g.plot(baselines, enumerated[:, j], label=f"enumerated, logit {j}")
                ax_g.axhline(exact[j], color="black", linestyle=":", linewidth=0.8)
            ax_g.set_xlabel("baseline c (reward-model score units)")
            ax_g.set_ylabel("gradient component (score units per logit unit)")
            ax_g.set_title("Enumerated gradient vs c (dotted: exact)")
            ax_g.legend(fontsize="small")
            ax_v.plot(baselines, variance, color="#d62728")
            ax_v.axvline(float(jnp.sum(jax.nn.softmax(probe) * rewards)), color="grey", linestyle="--",
                         label="c = expected reward")
            ax_v.set_xlabel("baseline c (reward-model score units)")
            ax_v.set_ylabel("variance of one-sample estimate (score units per logit unit)²")
            ax_v.set_title("The baseline changes the variance, not the mean")
            ax_v.legend(fontsize="small")
            plt.show()
            """),
        tests(
            "test_score_terms", 2,
            "for fresh logits, rewards and several baselines the rows equal pi(a)(r(a)-c)(e_a - pi) and sum to the exact reward gradient",
            visible="""
                np.testing.assert_allclose(enumerated, np.tile(exact, (len(baselines), 1)), atol=1e-6,
                                           err_msg="for every baseline c the summed score terms must equal the exact "
                                                   "reward gradient (a baseline changes the variance, not the mean)")
                """,
            hidden=_hidden(DIAGNOSE, '''
                R = grading.reference
                rng = grading.rng("score_terms")
                n = 3  # the lesson's number of actions, fresh values
                for _ in range(3):
                    logits = jnp.asarray(rng.normal(size=n), jnp.float32)
                    rewards_fresh = jnp.asarray(rng.normal(scale=2.0, size=n), jnp.float32)
                    c = float(rng.normal(scale=3.0))
                    got = grading.call(score_terms, logits, rewards_fresh, c, task="score_terms",
                                       forbid=("enumerated_baseline_gradient", "exact_reward_gradient"))
                    p = np.exp(np.asarray(jax.nn.log_softmax(logits), np.float64))
                    r = np.asarray(rewards_fresh, np.float64)
                    score = np.eye(n) - p[None, :]
                    want = (p * (r - c))[:, None] * score
                    _diagnose(got, want, lambda: {
                        "the baseline c is not subtracted from the rewards": (p * r)[:, None] * score,
                        "each row must be weighted by the probability pi(a)": (r - c)[:, None] * score,
                        "rows and columns are swapped: row a holds action a's contribution": want.T,
                    }, "score_terms")
                    grading.close(got, want, f"score terms for baseline c = {c:.3f}", rtol=1e-4, atol=1e-5)
                    grading.close(got.sum(axis=0), R.exact_reward_gradient(logits, rewards_fresh),
                                  "sum of the score terms (the enumerated gradient)", rtol=1e-4, atol=1e-5)
                '''),
        ),
        md("kl_04", r"""
            ## 3. KL at the reference

            Write `exact_kl(logp, ref_logp)` $= \sum_a \pi(a)(\log\pi(a) - \log\pi_{\text{ref}}(a))$ from
            log-probabilities, then compute `zero_kl` (the reference against itself) and `final_kl`
            (the trained policy `final_logp` against `ref_logp`).
            """),
        predict("predict_kl", """
            is `zero_kl` exactly 0.0, or only approximately? Is `final_kl` larger, and roughly how
            large (the lesson printed the final KL earlier)?
            """),
        answer("exact_kl_answer", '''
            def exact_kl(logp, ref_logp):
                """KL(pi || pi_ref) = sum_a exp(logp_a) (logp_a - ref_logp_a), in nats. logp, ref_logp: [n]."""
                ### BEGIN SOLUTION
                return jnp.sum(jnp.exp(logp) * (logp - ref_logp))
                ### END SOLUTION
            '''),
        answer("kl_values_answer", '''
            # define zero_kl (reference vs itself) and final_kl (final_logp vs ref_logp) as Python floats
            ### BEGIN SOLUTION
            zero_kl = float(exact_kl(ref_logp, ref_logp))
            final_kl = float(exact_kl(final_logp, ref_logp))
            ### END SOLUTION
            print("Reference/final KL:", zero_kl, final_kl)
            '''),
        tests(
            "test_zero_kl", 2,
            "KL at the reference is exactly 0.0, the trained policy's KL is larger (0.7824773), exact_kl matches the reference KL on fresh pairs",
            visible="""
                assert zero_kl == 0.0 and final_kl > zero_kl, (
                    f"KL of the reference against itself must be exactly 0.0 and the trained policy's larger; "
                    f"got zero_kl = {zero_kl}, final_kl = {final_kl}")
                """,
            hidden=_hidden(DIAGNOSE, '''
                R = grading.reference
                FORBID = ("categorical_kl", "regularised_objective", "ppo_loss")
                grading.equal(zero_kl, 0.0, "zero_kl, the KL of the reference to itself",
                              hint="sum_a pi(a) (log pi(a) - log pi(a)) is exactly zero")
                grading.close(final_kl, 0.7824773192405701, "final_kl of the trained policy (nats)", rtol=0.0, atol=1e-5)
                grading.check(bool(np.asarray(final_kl, np.float64) > np.asarray(zero_kl, np.float64)),
                              "the trained policy's KL must be larger than the KL at the reference")
                rng = grading.rng("zero_kl")
                n = 3  # the lesson's number of actions, fresh values
                for _ in range(3):
                    logp = jax.nn.log_softmax(jnp.asarray(rng.normal(size=n), jnp.float32))
                    ref = jax.nn.log_softmax(jnp.asarray(rng.normal(size=n), jnp.float32))
                    grading.equal(grading.call(exact_kl, ref, ref, task="exact_kl", forbid=FORBID), 0.0,
                                  "exact_kl of a fresh reference against itself",
                                  hint="compute it from log-probabilities so the difference is exactly zero")
                    got = grading.call(exact_kl, logp, ref, task="exact_kl", forbid=FORBID)
                    lp, rp = np.asarray(logp, np.float64), np.asarray(ref, np.float64)
                    _diagnose(got, R.categorical_kl(logp, ref), lambda: {
                        "KL direction reversed: weight by the CURRENT policy, KL(pi || pi_ref)":
                            np.sum(np.exp(rp) * (rp - lp)),
                        "each log-ratio must be weighted by pi(a)": np.sum(lp - rp),
                    }, "exact_kl")
                    grading.close(got, R.categorical_kl(logp, ref), "exact_kl on a fresh pair", rtol=1e-5, atol=1e-6)
                '''),
        ),
        md("transfer_04", r"""
            ## 4. Transfer: several prompts, detached behaviour information

            Real RLHF batches hold many prompts. Write `multi_prompt_ppo_loss(logits, old_logp,
            actions, advantages, ref_logp, beta, epsilon)` for `P` prompts at once: `logits` and
            `ref_logp` are `[P, n]`, `old_logp`, `actions` and `advantages` are `[P, B]` (action
            `actions[p, i]` was sampled for prompt `p`). The loss is minus the signed clipped
            surrogate averaged over all `P * B` samples, plus `beta` times the exact KL averaged over
            prompts. Write it yourself (no library PPO functions), and make sure `old_logp` and
            `advantages` stay constants. Then compute the gradients of *your* loss with respect to
            them on the given batch.
            """),
        given("transfer_batch", """
            # P = 4 prompts that share the lesson's three actions; B = 8 sampled actions per prompt
            _rng = np.random.default_rng(5)
            P, B = 4, 8
            batch_ref = np.tile(np.asarray(ref_logp), (P, 1))                                      # [P, 3]
            batch_logits = np.asarray(lesson_run["final_logits"]) + 0.1 * _rng.normal(size=(P, 3))  # [P, 3]
            batch_actions = np.stack([_rng.choice(3, size=B, p=np.exp(row)) for row in batch_ref])  # [P, B]
            batch_old = np.take_along_axis(batch_ref, batch_actions, axis=1)                       # [P, B]
            batch_adv = np.asarray(rewards)[batch_actions] - np.exp(batch_ref) @ np.asarray(rewards)[:, None]
            """),
        answer("multi_prompt_loss_answer", '''
            def multi_prompt_ppo_loss(logits, old_logp, actions, advantages, ref_logp, beta, epsilon):
                """PPO loss for P prompts: -mean over P*B samples of the signed clipped term + beta * mean_p KL_p.

                logits, ref_logp: [P, n]; old_logp, actions, advantages: [P, B]. Returns a scalar.
                """
                ### BEGIN SOLUTION
                logp = jax.nn.log_softmax(logits, axis=-1)
                old_logp = jax.lax.stop_gradient(old_logp)
                advantages = jax.lax.stop_gradient(advantages)
                ref_logp = jax.lax.stop_gradient(ref_logp)
                ratio = jnp.exp(jnp.take_along_axis(logp, actions, axis=1) - old_logp)
                clipped = jnp.clip(ratio, 1.0 - epsilon, 1.0 + epsilon)
                surrogate = jnp.mean(jnp.minimum(ratio * advantages, clipped * advantages))
                kl = jnp.mean(jnp.sum(jnp.exp(logp) * (logp - ref_logp), axis=-1))
                return -surrogate + beta * kl
                ### END SOLUTION
            '''),
        answer("behaviour_grads_answer", '''
            # define old_grad, adv_grad: gradients of YOUR loss w.r.t. old_logp and advantages on the given batch
            # (batch_logits, batch_old, batch_actions, batch_adv, batch_ref) with beta = epsilon = 0.2
            ### BEGIN SOLUTION
            old_grad, adv_grad = jax.grad(multi_prompt_ppo_loss, argnums=(1, 3))(
                batch_logits, batch_old, batch_actions, batch_adv, batch_ref, 0.2, 0.2)
            ### END SOLUTION
            print("Behaviour log probs and advantages detached:", not np.any(old_grad), not np.any(adv_grad))
            '''),
        tests(
            "test_transfer_value", 2,
            "on fresh prompts the loss and its gradient w.r.t. logits equal the single-prompt reference loss averaged over prompts",
            visible="""
                assert np.shape(multi_prompt_ppo_loss(batch_logits, batch_old, batch_actions, batch_adv, batch_ref,
                                                      0.2, 0.2)) == (), "the loss must be one number (a scalar)"
                """,
            hidden=_hidden(DIAGNOSE, '''
                R = grading.reference
                rng = grading.rng("transfer_value")
                P, n, B = 4, 3, 8  # the shapes of the given batch, fresh values
                logits = jnp.asarray(rng.normal(size=(P, n)), jnp.float32)
                ref = jax.nn.log_softmax(jnp.asarray(rng.normal(size=(P, n)), jnp.float32), axis=-1)
                actions = jnp.asarray(rng.integers(0, n, size=(P, B)))
                old = (jnp.take_along_axis(jax.nn.log_softmax(logits, axis=-1), actions, axis=1)
                       - jnp.asarray(np.log(rng.uniform(0.4, 1.8, size=(P, B))), jnp.float32))
                adv = jnp.asarray(rng.normal(size=(P, B)), jnp.float32)
                beta, eps = float(rng.uniform(0.1, 0.6)), float(rng.uniform(0.1, 0.3))
                args = (logits, old, actions, adv, ref, beta, eps)

                per_prompt = jax.vmap(R.ppo_loss, in_axes=(0, 0, 0, 0, 0, None, None))
                want, want_grad = jax.jit(jax.value_and_grad(
                    lambda z: jnp.mean(per_prompt(z, old, actions, adv, ref, beta, eps))))(logits)
                got = grading.call(multi_prompt_ppo_loss, *args, task="multi_prompt_ppo_loss", forbid=("ppo_loss",))


                def wrong_losses():
                    kls = np.asarray(R.categorical_kl(jax.nn.log_softmax(logits, axis=-1), ref), np.float64)
                    return {
                        "the KL is summed over prompts: average it over prompts": float(want) + beta * (kls.sum() - kls.mean()),
                        "the KL penalty is missing": float(want) - beta * kls.mean(),
                    }


                _diagnose(got, want, wrong_losses, "multi_prompt_ppo_loss")
                grading.close(got, want, "several-prompt loss on fresh prompts", rtol=1e-4, atol=1e-5,
                              hint="gather logp[p, actions[p, i]] per prompt, average the signed clipped terms over all "
                                   "samples and the exact KL over prompts")
                got_grad = grading.call(jax.grad(multi_prompt_ppo_loss), *args, task="multi_prompt_ppo_loss",
                                        forbid=("ppo_loss",))
                grading.close(got_grad, want_grad, "gradient w.r.t. logits", rtol=1e-4, atol=1e-5)
                '''),
        ),
        tests(
            "test_transfer_detached", 2,
            "gradients of your several-prompt loss w.r.t. old_logp and advantages are exactly zero on fresh inputs",
            visible="""
                assert not np.any(adv_grad), "gradient flows into advantages: wrap them in stop_gradient"
                assert not np.any(old_grad), "gradient flows into old_logp: wrap the behaviour log probs in stop_gradient"
                """,
            hidden='''
                rng = grading.rng("transfer_detached")
                P, n, B = 4, 3, 8  # the shapes of the given batch, fresh values
                logits = jnp.asarray(rng.normal(size=(P, n)), jnp.float32)
                ref = jax.nn.log_softmax(jnp.asarray(rng.normal(size=(P, n)), jnp.float32), axis=-1)
                actions = jnp.asarray(rng.integers(0, n, size=(P, B)))
                old = (jnp.take_along_axis(jax.nn.log_softmax(logits, axis=-1), actions, axis=1)
                       - jnp.asarray(np.log(rng.uniform(0.4, 1.8, size=(P, B))), jnp.float32))
                adv = jnp.asarray(rng.normal(size=(P, B)), jnp.float32)
                grad_old, grad_adv = grading.call_raw(jax.grad(multi_prompt_ppo_loss, argnums=(1, 3)), logits, old,
                                                      actions, adv, ref, float(rng.uniform(0.1, 0.6)),
                                                      float(rng.uniform(0.1, 0.3)), task="multi_prompt_ppo_loss",
                                                      forbid=("ppo_loss",), convert=False)
                grading.equal(grad_adv, np.zeros((P, B)), "gradient w.r.t. advantages",
                              hint="gradient flows into advantages: wrap them in stop_gradient")
                grading.equal(grad_old, np.zeros((P, B)), "gradient w.r.t. old_logp",
                              hint="gradient flows into old_logp: wrap the behaviour log probs in stop_gradient")
                ''',
        ),
        md("optimum_04", r"""
            ## 5. Challenge: the analytic optimum bounds the regularised objective

            For a finite action set, the policy maximising $J(\pi) = \mathbb E_\pi[r] - \beta\,\mathrm{KL}(\pi\Vert\pi_{\text{ref}})$
            is $\pi^*(a) \propto \pi_{\text{ref}}(a)\,e^{r(a)/\beta}$. Computing $e^{r/\beta}$ directly overflows
            for small $\beta$ (try $\beta = 10^{-3}$). Work in log space instead: $\log\pi^*(a)$ differs from
            $\log\pi_{\text{ref}}(a) + r(a)/\beta$ only by a constant that makes the probabilities sum to one.

            Write `analytic_optimum(ref_logp, rewards, beta)` (log-probabilities, computed in log space)
            and `regularised_objective(logp, rewards, ref_logp, beta)`, then evaluate $J$ for the
            reference, the trained policy and the optimum at $\beta = 0.2$.
            """),
        predict("predict_optimum", """
            order the three objective values (reference, trained, optimum). Should forty sampled PPO
            rollouts reach the optimum exactly? Why or why not?
            """),
        answer("analytic_optimum_answer", '''
            def analytic_optimum(ref_logp, rewards, beta):
                """log pi*(a) = log_softmax(ref_logp + rewards / beta), computed in log space. Shapes [n]."""
                ### BEGIN SOLUTION
                return jax.nn.log_softmax(jnp.asarray(ref_logp) + jnp.asarray(rewards) / beta)
                ### END SOLUTION
            '''),
        answer("regularised_objective_answer", '''
            def regularised_objective(logp, rewards, ref_logp, beta):
                """J(pi) = sum_a pi(a) r(a) - beta * KL(pi || pi_ref), from log-probabilities. Returns a scalar."""
                ### BEGIN SOLUTION
                probs = jnp.exp(logp)
                return jnp.sum(probs * rewards) - beta * jnp.sum(probs * (logp - ref_logp))
                ### END SOLUTION
            '''),
        answer("objective_values_answer", '''
            # define optimum_logp and the floats objective_reference, objective_trained, objective_optimum (beta = 0.2)
            ### BEGIN SOLUTION
            optimum_logp = analytic_optimum(ref_logp, rewards, 0.2)
            objective_reference = float(regularised_objective(ref_logp, rewards, ref_logp, 0.2))
            objective_trained = float(regularised_objective(final_logp, rewards, ref_logp, 0.2))
            objective_optimum = float(regularised_objective(optimum_logp, rewards, ref_logp, 0.2))
            ### END SOLUTION
            print("Regularised objective reference/trained/optimum:", objective_reference, objective_trained,
                  objective_optimum)
            '''),
        tests(
            "test_optimum_log_space", 2,
            "analytic_optimum equals log_softmax(ref_logp + r/beta) on fresh inputs, including beta = 1e-3 where exp(r/beta) overflows",
            visible="""
                assert bool(np.all(np.isfinite(np.asarray(analytic_optimum(ref_logp, rewards, 1e-3))))), (
                    "NaN or inf for beta = 0.001: exp(r / beta) overflows; compute it in log space")
                """,
            hidden=_hidden(DIAGNOSE, '''
                R = grading.reference
                rng = grading.rng("optimum_log_space")
                n = 3  # the lesson's number of actions, fresh values
                for beta in (float(rng.uniform(0.1, 1.0)), 1e-3):
                    ref = jax.nn.log_softmax(jnp.asarray(rng.normal(size=n), jnp.float32))
                    r = rng.normal(scale=1.5, size=n)
                    r[int(rng.integers(0, n))] = 3.0  # r / beta = 3000 when beta = 1e-3: exp overflows even in float64
                    r = jnp.asarray(r, jnp.float32)
                    got = grading.call(analytic_optimum, ref, r, beta, task="analytic_optimum",
                                       forbid=("optimal_logp", "regularised_objective"))
                    grading.check(bool(np.all(np.isfinite(got))),
                                  f"analytic_optimum returned NaN or inf for beta = {beta:g}: exp(r / beta) overflows "
                                  "(or a probability underflows to log 0); compute it in log space, "
                                  "log_softmax(ref_logp + rewards / beta)")
                    want = R.optimal_logp(ref, r, beta)
                    _diagnose(got, want, lambda: {
                        "return log-probabilities, not probabilities": np.exp(np.asarray(want, np.float64)),
                        "the rewards must be divided by beta": jax.nn.log_softmax(ref + r),
                        "the reference is missing: pi* is proportional to pi_ref(a) exp(r(a) / beta)":
                            jax.nn.log_softmax(r / beta),
                    }, "analytic_optimum")
                    grading.close(got, want, f"optimum log-probabilities for beta = {beta:g}", rtol=1e-4, atol=1e-4)
                '''),
        ),
        tests(
            "test_optimum_bound", 2,
            "regularised_objective matches the reference; the optimum's objective is >= the trained, reference and random policies' (lesson values and fresh inputs with beta = 1e-3)",
            visible="""
                assert objective_optimum >= objective_trained - 1e-5 and objective_optimum >= objective_reference - 1e-5, (
                    "the optimum's regularised objective must be >= the trained and the reference policy's")
                """,
            hidden='''
                R = grading.reference
                FORBID = ("optimal_logp", "regularised_objective")
                grading.close([objective_reference, objective_trained, objective_optimum],
                              [0.28191882371902466, 1.7620493173599243, 1.7987911701202393],
                              "regularised objective of reference / trained / optimum", rtol=0.0, atol=1e-5)
                rng = grading.rng("optimum_bound")
                n = 3  # the lesson's number of actions, fresh values
                for beta in (float(rng.uniform(0.1, 1.0)), 1e-3):
                    ref = jax.nn.log_softmax(jnp.asarray(rng.normal(size=n), jnp.float32))
                    r = jnp.asarray(rng.normal(scale=1.5, size=n), jnp.float32)
                    policies = [ref] + [jax.nn.log_softmax(jnp.asarray(rng.normal(scale=2.0, size=n), jnp.float32))
                                        for _ in range(5)]
                    for logp in policies:
                        grading.close(grading.call(regularised_objective, logp, r, ref, beta, task="regularised_objective",
                                                   forbid=FORBID),
                                      R.regularised_objective(logp, r, ref, beta),
                                      f"regularised objective of a fresh policy (beta = {beta:g})", rtol=1e-4, atol=1e-5,
                                      hint="J = sum_a pi(a) r(a) - beta * sum_a pi(a) (log pi(a) - log pi_ref(a))")
                    optimum = grading.call(analytic_optimum, ref, r, beta, task="analytic_optimum", forbid=FORBID)
                    grading.check(bool(np.all(np.isfinite(optimum))),
                                  f"analytic_optimum is not finite for beta = {beta:g}: compute it in log space")
                    best = float(R.regularised_objective(jnp.asarray(optimum, jnp.float32), r, ref, beta))
                    for k, logp in enumerate(policies):
                        other = float(R.regularised_objective(logp, r, ref, beta))
                        grading.check(best >= other - 1e-4,
                                      f"the optimum's objective {best:.6f} is below policy {k}'s {other:.6f} "
                                      f"(beta = {beta:g}): the optimum is not the maximiser")
                ''',
        ),
        md("diagnose_04", """
            ## 6. Diagnose the result
            """),
        question("diagnose_question", """
            A classmate's run prints ratios that are exactly 1.0 on every inner step, a clip fraction
            of 0 throughout, and a reward curve that still rises. In a second project the learned
            reward keeps rising while an independent human evaluation gets worse. For each case,
            say what you suspect and one concrete check you would run to confirm it (2 points).
            """),
        written(
            "diagnose_answer", 2,
            model_answer="""
                Ratios of exactly 1 on every inner step mean the behaviour log probs are recomputed from
                the current parameters after each step (or taken through the same parameters), so
                `old_logp` is not frozen at collection time. The update collapses to a plain
                policy-gradient step and clipping can never engage. Check: store `old_logp` when the
                batch is sampled and assert it is identical across all inner epochs; print the ratio
                after the second inner step, which must differ from 1. Reward rising while an
                independent evaluation falls suggests reward exploitation (over-optimising a weak reward
                model), not alignment: check the KL to the reference, inspect high-reward samples by
                hand, and evaluate on held-out human judgments with the reward model version fixed.
                """,
            rubric="""
                - 1 point: recomputed (not frozen) old log probs as the cause of ratio = 1, with a check
                  such as asserting `old_logp` is unchanged across inner epochs or that the ratio moves
                  off 1 after the first step.
                - 1 point: reward hacking / exploitation of the learned reward (not "training worked"),
                  with a check such as held-out human evaluation, inspecting top-reward samples, or
                  watching the KL to the reference.
                """,
        ),
        md("understanding_04", """
            ## 7. Check your understanding
            """),
        question("understanding_q1", """
            **Q1.** Name the four objects with different lifetimes in this lesson (current policy, old
            behaviour policy, reference policy, reward model) and say when each one changes. What goes
            wrong if the KL is measured against the old policy instead of the reference? (2 points)
            """),
        written(
            "understanding_a1", 2,
            model_answer="""
                The current policy changes on every inner optimiser step. The old behaviour policy is a
                snapshot taken when a batch is sampled; its log probs (and the advantages) stay fixed
                while that batch is reused and refresh at the next rollout. The reference policy and the
                reward model are fixed for the whole run. If the KL is taken against the old policy, the
                anchor moves every rollout: the penalty only limits the step size and no longer keeps
                the policy near the reference, so the policy can drift arbitrarily far over many
                rollouts while the reported "KL" stays small.
                """,
            rubric="""
                - 1 point: all four lifetimes correct (current: each step; old: per rollout; reference
                  and reward: whole run).
                - 1 point: KL against the old policy removes the anchor to the reference (the penalty
                  becomes a per-rollout step-size limit, cumulative drift is unpenalised).
                """,
        ),
        question("understanding_q2", """
            **Q2.** Why must the minimum be taken over the products $\\rho A$ and
            $\\operatorname{clip}(\\rho)A$ rather than over the ratios? And why does the analytic optimum
            bound the trained policy's regularised objective without implying that forty PPO rollouts
            reach it? (2 points)
            """),
        written(
            "understanding_a2", 2,
            model_answer="""
                Multiplying by a negative advantage flips the order of the two products, so the minimum
                of the products picks the lower clip bound for $A < 0$ and the upper bound for $A > 0$;
                a minimum over ratios ignores the sign and, for negative advantages, removes the
                pessimistic term (the worked example gives $-1$ instead of $-1.6$). The optimum
                $\\pi^* \\propto \\pi_{\\text{ref}} e^{r/\\beta}$ maximises $J$ over all policies, so no policy,
                trained or not, can exceed it; but PPO only takes finite, clipped steps on sampled
                batches, so after forty rollouts a gap remains (1.7620 vs 1.7988 here).
                """,
            rubric="""
                - 1 point: the sign of A reverses which product is smaller / which bound binds; a min over
                  ratios is wrong for negative advantages.
                - 1 point: the optimum is a global maximiser of J (an upper bound), while sampled, clipped,
                  finitely many updates need not reach it.
                """,
        ),
        md("explorer_04", """
            ## 8. Play: the live explorer

            Move β and ε and watch reward, KL and the action probabilities respond. The explorer
            re-runs the compiled trainer for every slider value (it is not graded and is skipped
            while autograding).
            """),
        predict("predict_explorer", """
            if you lower β from 0.2 to 0.05, what happens to the final KL and the final reward? What
            about a much smaller ε?
            """),
        given("explorer_cell", """
            import os

            if os.environ.get("NBGRADER_EXECUTION"):
                print("The live explorer is skipped while autograding.")
            else:
                try:
                    from rlhf_lab.explorer import explore
                except ImportError as err:
                    print(f"The live explorer is not available in this installation: {err}")
                else:
                    try:
                        explore()
                    except Exception as err:  # the explorer is optional: never break the notebook
                        print(f"The live explorer could not start: {type(err).__name__}: {err}")
            """),
    ]


# ------------------------------------------------------------------------------------------------
# Assembly


NOTEBOOKS = {
    "01_losses.ipynb": nb01_cells,
    "02_reward_and_reference.ipynb": nb02_cells,
    "03_rollouts.ipynb": nb03_cells,
    "04_make_it_yours.ipynb": nb04_cells,
}


def _totals(cell_lists: dict) -> tuple[int, int]:
    auto = manual = 0
    for cells in cell_lists.values():
        for cell in cells:
            a, m = _points(cell)
            auto, manual = auto + a, manual + m
    return auto, manual


def points_cell(name: str, cells, totals: tuple[int, int]):
    """Markdown cell stating this notebook's points and the assignment total (computed from metadata)."""
    auto_all, manual_all = totals
    here = sum(sum(_points(c)) for c in cells)
    lines = [
        f"**Points.** This notebook: **{here} points**. The whole assignment `{ASSIGNMENT}` (four "
        f"notebooks) is worth **{auto_all + manual_all} points**: {auto_all} autograded and "
        f"{manual_all} graded by hand.",
        "",
        "| graded cell | points | how |",
        "|---|---|---|",
        *_grade_rows(cells),
        "",
        "Run the notebook top to bottom after restarting the kernel. Visible tests help you; hidden "
        "tests on fresh random inputs decide the grade. Keep the first code cell as it is.",
    ]
    return md(f"points_{name[:2]}", "\n".join(lines))


def build_notebooks() -> dict[str, nbformat.NotebookNode]:
    """All source notebooks of the assignment, keyed by file name (deterministic)."""
    cell_lists = {name: make() for name, make in NOTEBOOKS.items()}
    totals = _totals(cell_lists)
    out = {}
    for name, cells in cell_lists.items():
        cells = [cells[0], points_cell(name, cells, totals), *cells[1:]]
        nb = nbformat.v4.new_notebook(cells=cells)
        nb.metadata = {"kernelspec": dict(KERNELSPEC), "language_info": {"name": "python"}}
        nbformat.validate(nb)
        out[name] = nb
    return out


def render(nb) -> str:
    """The exact text written to disk for one notebook."""
    return nbformat.writes(nb, version=4) + "\n"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if the committed notebooks differ")
    parser.add_argument("--out", type=Path, default=OUT_DIR, help="output folder (default: source/ppo_rlhf)")
    args = parser.parse_args(argv)
    notebooks = build_notebooks()
    stale = []
    for name, nb in notebooks.items():
        path = args.out / name
        text = render(nb)
        if args.check:
            if not path.exists() or path.read_text(encoding="utf-8") != text:
                stale.append(name)
        else:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text, encoding="utf-8")
    if args.check and stale:
        print("out of date (run tools/build_source_ppo_rlhf.py):", ", ".join(stale), file=sys.stderr)
        return 1
    if not args.check:
        print(f"wrote {len(notebooks)} notebooks to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
