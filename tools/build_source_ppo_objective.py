#!/usr/bin/env python3
"""Generate the nbgrader source notebooks of the ``ppo_objective`` assignment.

The assignment ports the PyTorch module on PPO's clipped objective and KL penalty to JAX. Two
notebooks are written to ``source/ppo_objective/``:

* ``01_clipped_objective.ipynb``: the signed clipped surrogate, the five-case table, the clip
  boundary found by a sweep (exercise 1) and a case where the clip caps a warranted update
  (exercise 3).
* ``02_kl_penalty_and_review.ipynb``: exact categorical KL in log space, the penalised reward, the
  beta sweep (exercise 2), the independent challenge and "check your understanding".

The output is deterministic (fixed cell ids, no outputs, sorted JSON keys), so the committed
notebooks can be compared with a fresh build::

    python tools/build_source_ppo_objective.py          # write the notebooks
    python tools/build_source_ppo_objective.py --check  # exit 1 if the committed files differ

Cell kinds (nbgrader metadata, schema 3): ``given`` (locked, read-only code or text), ``answer``
(autograded solution code between ``### BEGIN SOLUTION``/``### END SOLUTION``), ``tests``
(locked autograder tests with points; hidden part between ``### BEGIN HIDDEN TESTS`` and
``### END HIDDEN TESTS``, placed *before* the visible asserts so the trusted, diagnostic checks decide
first), ``written`` (manually graded markdown whose rubric sits in a solution region and is replaced
by "YOUR ANSWER HERE" in the release) and plain markdown ``predict`` cells the student edits freely.
"""
from __future__ import annotations

import argparse
import sys
import textwrap
from pathlib import Path

import nbformat

ROOT = Path(__file__).resolve().parents[1]
OUT_DIR = ROOT / "source" / "ppo_objective"
NB1 = "01_clipped_objective.ipynb"
NB2 = "02_kl_penalty_and_review.ipynb"

#: Points per graded cell; the headers state these totals and a test checks that they add up.
POINTS = {
    NB1: {"test_ppo_surrogate": 6, "test_surrogate_table": 3, "test_clip_boundary": 4,
          "test_capped_pair": 2, "ex3_explanation": 3},
    NB2: {"test_kl_divergence": 5, "test_penalized_reward": 2, "test_beta_sweep": 3,
          "ex2_discussion": 3, "challenge_answer": 4,
          "cyu_q1": 1, "cyu_q2": 1, "cyu_q3": 1, "cyu_q4": 1, "cyu_q5": 1},
}
TOTAL_POINTS = sum(sum(p.values()) for p in POINTS.values())  # 40
MANUAL = {"ex3_explanation", "ex2_discussion", "challenge_answer", "cyu_q1", "cyu_q2", "cyu_q3",
          "cyu_q4", "cyu_q5"}


def _points(nb: str, manual: bool | None = None) -> int:
    return sum(p for gid, p in POINTS[nb].items() if manual is None or (gid in MANUAL) == manual)


def _src(text: str) -> str:
    return textwrap.dedent(text).strip("\n")


def _meta(grade_id: str, *, grade: bool, solution: bool, locked: bool, points: int | None = None) -> dict:
    meta = {"grade": grade, "grade_id": grade_id, "locked": locked, "schema_version": 3,
            "solution": solution, "task": False}
    if points is not None:
        meta["points"] = points
    return {"nbgrader": meta}


class Builder:
    """Collects cells for one notebook; every cell gets a fixed id."""

    def __init__(self, name: str):
        self.name = name
        self.cells: list = []
        self.ids: set[str] = set()

    def _add(self, cell, cell_id: str):
        if cell_id in self.ids:
            raise ValueError(f"duplicate cell id {cell_id} in {self.name}")
        self.ids.add(cell_id)
        cell["id"] = cell_id
        self.cells.append(cell)

    def text(self, cell_id: str, source: str):
        """Read-only instructions."""
        self._add(nbformat.v4.new_markdown_cell(_src(source), metadata=_meta(
            cell_id, grade=False, solution=False, locked=True)), cell_id)

    def predict(self, cell_id: str, source: str):
        """An ungraded markdown cell the student overwrites with a prediction."""
        self._add(nbformat.v4.new_markdown_cell(_src(source)), cell_id)

    def given(self, cell_id: str, source: str):
        """Read-only code (restored by nbgrader at autograde time)."""
        self._add(nbformat.v4.new_code_cell(_src(source), metadata=_meta(
            cell_id, grade=False, solution=False, locked=True)), cell_id)

    def answer(self, cell_id: str, source: str):
        """Autograded answer cell holding the solution between BEGIN/END SOLUTION."""
        self._add(nbformat.v4.new_code_cell(_src(source), metadata=_meta(
            cell_id, grade=False, solution=True, locked=False)), cell_id)

    def tests(self, cell_id: str, hidden: str, visible: str):
        """Locked autograder-test cell: hidden checks first, then what the student sees."""
        source = "### BEGIN HIDDEN TESTS\n" + _src(hidden) + "\n### END HIDDEN TESTS\n" + _src(visible)
        self._add(nbformat.v4.new_code_cell(source, metadata=_meta(
            cell_id, grade=True, solution=False, locked=True, points=POINTS[self.name][cell_id])), cell_id)

    def written(self, cell_id: str, rubric: str):
        """Manually graded markdown answer; the rubric is stripped from the release."""
        source = "### BEGIN SOLUTION\n" + _src(rubric) + "\n### END SOLUTION"
        self._add(nbformat.v4.new_markdown_cell(source, metadata=_meta(
            cell_id, grade=True, solution=True, locked=False, points=POINTS[self.name][cell_id])), cell_id)

    def notebook(self):
        nb = nbformat.v4.new_notebook()
        nb.nbformat, nb.nbformat_minor = 4, 5
        nb.metadata = {
            "kernelspec": {"display_name": "Python 3 (ipykernel)", "language": "python", "name": "python3"},
            "language_info": {"name": "python"},
        }
        nb.cells = self.cells
        nbformat.validate(nb)
        return nb


SETUP = """
from rlhf_lab import grading
grading.start()
"""

# ---------------------------------------------------------------------------------------------
# Hidden-test building blocks shared by several cells (each test cell stays self-contained).
# ---------------------------------------------------------------------------------------------

TRUSTED_SURROGATE = """
def _trusted_surrogate(ratio, advantage, epsilon=0.2, clip=True):
    # The grader's own surrogate (NumPy, float32), passed in so that a mistake in Task 1 is not
    # charged again here.
    ratio = np.asarray(ratio, np.float32)
    advantage = np.asarray(advantage, np.float32)
    unclipped = ratio * advantage
    if not clip:
        return unclipped
    return np.minimum(unclipped, np.clip(ratio, 1.0 - epsilon, 1.0 + epsilon) * advantage)

_CASE_R = np.array([1.8, 1.05, 1.8, 0.3, 0.3], np.float32)
_CASE_A = np.array([1.0, 1.0, -1.0, -1.0, 1.0], np.float32)
grading.close(_trusted_surrogate(_CASE_R, _CASE_A), [1.2, 1.05, -1.8, -0.8, 0.3], "grader self-check")
"""


def notebook_1():
    b = Builder(NB1)
    b.text("title", f"""
        # PPO's objective, part 1: the clipped surrogate

        PPO updates a policy with an objective that rewards good actions, but only up to a point.
        In this notebook you build that objective in JAX, tabulate how it behaves in five
        situations, locate the exact ratio where the clip starts to bind, and construct a case
        where the clip holds back an update that was actually deserved.

        **Scope.** Everything here runs on hand-picked numbers. Nothing collects rollouts, fits a
        critic or updates a language model: we check the *mechanics of the objective*, which is the
        part of a PPO step that decides how far one update may push the policy.

        **Points:** {_points(NB1)} in this notebook ({_points(NB1, False)} autograded,
        {_points(NB1, True)} graded by hand) out of {TOTAL_POINTS} for the whole assignment
        (notebook 2 holds the other {_points(NB2)}).

        Run the cells from top to bottom. Cells marked **Predict** are for you: write down a guess
        before running the experiment below it (not graded, but it is how the surprises stick).
        """)
    b.given("setup_grading", SETUP)
    b.given("imports", """
        import jax
        import jax.numpy as jnp
        import numpy as np
        import matplotlib.pyplot as plt

        EPSILON = 0.2        # clip range used throughout unless a task says otherwise
        DIVERGE_TOL = 1e-6   # |unclipped - clipped| above this counts as "the clip changed something"

        # The five situations of the table (name, probability ratio, advantage).
        CASE_NAMES = (
            "good action, ratio grew a lot",
            "good action, ratio grew a little",
            "bad action, ratio grew a lot",
            "bad action, ratio shrank a lot",
            "good action, ratio shrank a lot",
        )
        CASE_RATIOS = jnp.array([1.8, 1.05, 1.8, 0.3, 0.3])
        CASE_ADVANTAGES = jnp.array([1.0, 1.0, -1.0, -1.0, 1.0])
        """)
    b.text("concept_clip", r"""
        ## The ratio and the clip

        For an action $a$ sampled by the old (behaviour) policy, the **probability ratio**
        $\rho = \pi_\text{new}(a)/\pi_\text{old}(a)$ says how much an update has changed that action's
        probability: $\rho = 1$ means unchanged. The **advantage** $A$ says whether the action was
        better ($A > 0$) or worse ($A < 0$) than expected.

        The plain surrogate $\rho A$ keeps paying for larger and larger moves. PPO instead takes the
        smaller of two products,

        $$\text{objective}(\rho, A) = \min\big(\rho A,\ \operatorname{clip}(\rho, 1-\varepsilon, 1+\varepsilon)\,A\big),$$

        with $\varepsilon = 0.2$ by default. The minimum is taken **after** multiplying by $A$, so
        the sign of the advantage decides which end of the clip range can matter.
        """)
    b.text("task1_intro", f"""
        ### Task 1: `ppo_surrogate` ({POINTS[NB1]['test_ppo_surrogate']} points)

        Implement `ppo_surrogate(ratio, advantage, epsilon=0.2, clip=True)` with `jax.numpy`:

        * `clip=False` returns the plain product `ratio * advantage`;
        * `clip=True` returns the signed clipped objective above, elementwise;
        * `ratio` and `advantage` may be scalars or arrays that broadcast against each other.

        Write the computation yourself: calling the course library's `clipped_surrogate` (or any
        wrapper around it) earns no points for this task.
        """)
    b.answer("ppo_surrogate", '''
        def ppo_surrogate(ratio, advantage, epsilon=0.2, clip=True):
            """PPO's per-sample surrogate.

            clip=False: ratio * A.
            clip=True:  min(ratio * A, clip(ratio, 1 - epsilon, 1 + epsilon) * A), elementwise.

            Args:
              ratio: probability ratios pi_new(a) / pi_old(a), scalar or array.
              advantage: advantages, broadcastable against ``ratio``.
              epsilon: half-width of the trust region around ratio = 1 (held fixed).
              clip: whether to apply PPO's clip.

            Returns:
              jax array with the broadcast shape (an objective to be maximised).
            """
            ratio = jnp.asarray(ratio, dtype=jnp.float32)
            advantage = jnp.asarray(advantage, dtype=jnp.float32)
            ### BEGIN SOLUTION
            unclipped = ratio * advantage
            if not clip:
                return unclipped
            clipped = jnp.clip(ratio, 1.0 - epsilon, 1.0 + epsilon) * advantage
            return jnp.minimum(unclipped, clipped)
            ### END SOLUTION
        ''')
    b.tests("test_ppo_surrogate", hidden="""
        _rng = grading.rng("ppo_surrogate")
        _eps = float(_rng.choice([_rng.uniform(0.08, 0.16), _rng.uniform(0.25, 0.4)]))
        _TASK = {"task": "ppo_surrogate", "forbid": ("clipped_surrogate",)}
        _n = 16   # every probe block has this size, so JAX compiles each operation only once

        # Probe blocks with a fresh epsilon: above / below / inside the trust region, both signs of A.
        _a_pos = _rng.uniform(0.5, 2.0, _n).astype(np.float32)
        _a_neg = -_rng.uniform(0.5, 2.0, _n).astype(np.float32)
        _r_hi = (1 + _eps + _rng.uniform(0.1, 1.0, _n)).astype(np.float32)
        _r_lo = ((1 - _eps) * _rng.uniform(0.1, 0.85, _n)).astype(np.float32)
        _r_in = (1 + _eps * _rng.uniform(-0.9, 0.9, _n)).astype(np.float32)
        _keys = ("hi+", "lo+", "hi-", "lo-", "in+", "in-")
        _R = np.concatenate([_r_hi, _r_lo, _r_hi, _r_lo, _r_in, _r_in])
        _A = np.concatenate([_a_pos, _a_pos, _a_neg, _a_neg, _a_pos, _a_neg])
        _block = lambda x, k: x[_keys.index(k) * _n:(_keys.index(k) + 1) * _n]

        # Expected values are computed before any student code runs.
        _cands = {"unc": _R * _A, "top": np.float32(1 + _eps) * _A, "bot": np.float32(1 - _eps) * _A}
        _r = _rng.uniform(0.05, 2.5, 6 * _n).astype(np.float32)
        _a = _rng.normal(0.0, 1.5, 6 * _n).astype(np.float32)
        _want = grading.reference.clipped_surrogate(jnp.asarray(_r), jnp.asarray(_a), _eps)
        _want_scalar = np.minimum(_r * -1.5, np.clip(_r, 1 - _eps, 1 + _eps) * -1.5)

        grading.close(grading.call(ppo_surrogate, _R, _A, epsilon=_eps, clip=False, **_TASK), _cands["unc"],
                      "ppo_surrogate(..., clip=False)",
                      hint="With clip=False the function must return the plain product ratio * advantage.")
        _got = grading.call(ppo_surrogate, _R, _A, epsilon=_eps, **_TASK)
        _is = lambda k, c: grading.matches(_block(_got, k), _block(_cands[c], k))
        _bounds = f"[1 - epsilon, 1 + epsilon] = [{1 - _eps:.4f}, {1 + _eps:.4f}] (epsilon={_eps:.4f} here)"
        _diag = ""
        if _is("hi+", "unc") and _is("lo+", "unc") and _is("hi-", "unc") and _is("lo-", "unc"):
            _diag = ("The ratio is never clipped: with clip=True the objective must stop growing once "
                     "ratio > 1 + epsilon for a positive advantage.")
        elif _is("hi+", "unc") and _is("lo+", "bot"):
            _diag = ("Used max instead of min: PPO keeps the SMALLER (pessimistic) of ratio*A and "
                     "clip(ratio)*A; with max a good action's ratio is rewarded without limit.")
        elif _is("lo+", "bot") and _is("hi-", "top"):
            _diag = ("Clipped the ratio but dropped the signed min: returning clip(ratio)*A alone softens "
                     "the penalty for a bad action whose ratio grew (ratio 1.8, A=-1 must give -1.8, not "
                     "-1.2). Return min(ratio*A, clip(ratio)*A).")
        elif _is("hi-", "top") and _is("lo-", "unc"):
            _diag = ("Ratio clipped but the sign of A was dropped: the min must compare the two PRODUCTS "
                     "ratio*A and clip(ratio)*A, not the ratios before multiplying by A (for A < 0 the "
                     "order flips).")
        elif not (_is("hi+", "top") or _is("hi+", "unc")) or not (_is("lo-", "bot") or _is("lo-", "unc")):
            _diag = ("Clip bounds wrong (epsilon not applied symmetrically): the ratio must be clipped to "
                     + _bounds + ", using the epsilon argument.")
        elif not (_is("in+", "unc") and _is("in-", "unc")):
            _diag = "Inside the trust region the objective must equal ratio * advantage exactly."
        grading.check(_diag == "", "ppo_surrogate: " + _diag)

        # The five cases with the default epsilon.
        _CASE_R = np.array([1.8, 1.05, 1.8, 0.3, 0.3], np.float32)
        _CASE_A = np.array([1.0, 1.0, -1.0, -1.0, 1.0], np.float32)
        grading.close(grading.call(ppo_surrogate, _CASE_R, _CASE_A, **_TASK),
                      [1.2, 1.05, -1.8, -0.8, 0.3], "ppo_surrogate on the five cases (default epsilon=0.2)")
        # Fresh random ratios and advantages of both signs against the trusted reference.
        grading.close(grading.call(ppo_surrogate, _r, _a, epsilon=_eps, **_TASK), _want,
                      f"ppo_surrogate on fresh random inputs (epsilon={_eps:.4f})")
        # Broadcasting: one advantage for a whole array of ratios.
        grading.close(grading.call(ppo_surrogate, _r, -1.5, epsilon=_eps, **_TASK), _want_scalar,
                      "ppo_surrogate with a scalar advantage and an array of ratios")
        """, visible="""
        # Visible checks: the five cases of the table.
        np.testing.assert_allclose(ppo_surrogate(CASE_RATIOS, CASE_ADVANTAGES, clip=False),
                                   [1.8, 1.05, -1.8, -0.3, 0.3], atol=1e-6)
        np.testing.assert_allclose(ppo_surrogate(CASE_RATIOS, CASE_ADVANTAGES),
                                   [1.2, 1.05, -1.8, -0.8, 0.3], atol=1e-6)
        print("ppo_surrogate: visible checks passed")
        """)

    b.predict("predict_table", """
        **Predict.** Before running the table: in which of the five cases will the clipped and
        unclipped objectives differ, and which way (up or down)? Write your guess here.

        *My prediction:*
        """)
    b.text("task2_intro", f"""
        ### Task 2: the five-case table ({POINTS[NB1]['test_surrogate_table']} points)

        Implement `surrogate_table(ratios, advantages, epsilon=0.2, surrogate=ppo_surrogate)`. It
        returns a tuple `(unclipped, clipped, diverge)` of three arrays with one entry per case:

        * `unclipped = surrogate(ratios, advantages, epsilon, clip=False)`;
        * `clipped = surrogate(ratios, advantages, epsilon, clip=True)`;
        * `diverge` is a boolean array, `True` where `|unclipped - clipped| > DIVERGE_TOL` (1e-6).
          Use that tolerance, not `!=`: float32 rounding can leave a harmless difference of a few
          1e-7 at the edge of the clip range.

        Call the `surrogate` argument rather than `ppo_surrogate` directly: the tests pass a
        trusted surrogate in, so this task is graded on the table logic alone.
        """)
    b.answer("surrogate_table", '''
        def surrogate_table(ratios, advantages, epsilon=0.2, surrogate=ppo_surrogate):
            """Unclipped objective, clipped objective and where they differ, one entry per case.

            Returns:
              (unclipped, clipped, diverge): arrays of shape [n_cases]; diverge is boolean,
              |unclipped - clipped| > DIVERGE_TOL.
            """
            ### BEGIN SOLUTION
            unclipped = surrogate(ratios, advantages, epsilon, clip=False)
            clipped = surrogate(ratios, advantages, epsilon, clip=True)
            diverge = jnp.abs(unclipped - clipped) > DIVERGE_TOL
            return unclipped, clipped, diverge
            ### END SOLUTION
        ''')
    b.given("show_table", """
        unclipped, clipped, diverge = surrogate_table(CASE_RATIOS, CASE_ADVANTAGES, EPSILON)
        for name, r, a, u, c, d in zip(CASE_NAMES, CASE_RATIOS, CASE_ADVANTAGES, unclipped, clipped, diverge):
            print(f"{name:34s} ratio={float(r):4.2f} A={float(a):+4.1f} "
                  f"unclipped={float(u):+7.4f} clipped={float(c):+7.4f} diverge={bool(d)}")
        """)
    b.tests("test_surrogate_table", hidden=_src(TRUSTED_SURROGATE) + "\n" + _src("""
        _rng = grading.rng("surrogate_table")
        _TASK = {"task": "surrogate_table", "forbid": ("clipped_surrogate",)}
        _eps = float(_rng.uniform(0.1, 0.35))
        _n = 16
        # Fresh ratios kept at least 1e-3 away from the clip edges, advantages of both signs ...
        _r = _rng.uniform(0.2, 2.2, 8 * _n)
        _r = _r[np.abs(np.abs(_r - 1.0) - _eps) > 1e-3][:_n - 3].astype(np.float32)
        _a = (_rng.choice([-1.0, 1.0], _n - 3) * _rng.uniform(0.3, 2.0, _n - 3)).astype(np.float32)
        _r[0], _a[0] = 1 + _eps + _rng.uniform(0.1, 1.0), _rng.uniform(0.3, 2.0)       # surely clipped, A > 0
        _r[1], _a[1] = (1 - _eps) * _rng.uniform(0.1, 0.85), -_rng.uniform(0.3, 2.0)  # surely clipped, A < 0
        # ... plus three edge cases where float32 rounding leaves a gap of a few 1e-7 only: a ratio
        # 4 float32 steps above 1 + eps (A = +1) or below 1 - eps (A = -1) does NOT diverge.
        _up, _down = np.float32(1 + _eps), np.float32(1 - _eps)
        for _k in range(4):
            _up = np.nextafter(_up, np.float32(2)); _down = np.nextafter(_down, np.float32(0))
        _r = np.concatenate([_r, np.array([_up, _down, _up], np.float32)])
        _a = np.concatenate([_a, np.array([1.0, -1.0, -1.0], np.float32)])
        _unc = _trusted_surrogate(_r, _a, _eps, clip=False).astype(np.float64)
        _cl = _trusted_surrogate(_r, _a, _eps).astype(np.float64)
        _div = np.abs(_unc - _cl) > 1e-6
        grading.check(bool(_div[0] and _div[1] and not _div[-3] and not _div[-2]), "grader self-check (edge cases)")
        _out = grading.call(surrogate_table, _r, _a, epsilon=_eps, surrogate=_trusted_surrogate, **_TASK)
        grading.check(_out.shape == (3, _n),
                      f"surrogate_table must return (unclipped, clipped, diverge) with one entry per input "
                      f"case ({_n} here), got an array of shape {_out.shape}. A table copied from the "
                      f"printout does not follow fresh inputs.")
        _hint = ("Compute the columns from the inputs with the surrogate argument; hard-coded values "
                 "fail on fresh inputs.")
        if grading.matches(_out[0], _cl) and grading.matches(_out[1], _unc):
            _hint = "The columns are swapped: return (unclipped, clipped, diverge) in that order."
        grading.close(_out[0], _unc, "unclipped column on fresh inputs", hint=_hint)
        grading.close(_out[1], _cl, "clipped column on fresh inputs", hint=_hint)
        _edge_hint = ""
        if grading.matches(_out[2][-3:-1], [1.0, 1.0]):
            _edge_hint = ("At the edge of the clip range the two terms differ by a few 1e-7 (float32 "
                          "rounding, not a clip): use |unclipped - clipped| > DIVERGE_TOL, not an exact "
                          "comparison.")
        grading.equal(_out[2], _div, "diverge column on fresh inputs (1 = True)",
                      hint=_edge_hint or "diverge is |unclipped - clipped| > DIVERGE_TOL = 1e-6.")
        # The five cases of the module.
        _five = grading.call(surrogate_table, _CASE_R, _CASE_A, surrogate=_trusted_surrogate, **_TASK)
        grading.equal(_five[2], [1.0, 0.0, 0.0, 1.0, 0.0], "diverge column of the five cases (1 = True)")
        grading.close(_five[:2], [[1.8, 1.05, -1.8, -0.3, 0.3], [1.2, 1.05, -1.8, -0.8, 0.3]],
                      "unclipped and clipped columns of the five cases")
        """), visible="""
        # Visible checks (a reference surrogate is passed in, as the hidden tests do).
        _ref = lambda r, a, epsilon=0.2, clip=True: (
            grading.reference.clipped_surrogate(r, a, epsilon) if clip else jnp.asarray(r) * a)
        u, c, d = surrogate_table(CASE_RATIOS, CASE_ADVANTAGES, surrogate=_ref)
        np.testing.assert_allclose(u, [1.8, 1.05, -1.8, -0.3, 0.3], atol=1e-6)
        np.testing.assert_allclose(c, [1.2, 1.05, -1.8, -0.8, 0.3], atol=1e-6)
        assert list(np.asarray(d)) == [True, False, False, True, False], d
        print("surrogate_table: visible checks passed")
        """)
    b.text("read_table", """
        **Reading the table.** The clip changes two rows, and in both it makes the objective
        *flat*: once a good action's ratio is above $1+\\varepsilon$, or a bad action's ratio is
        below $1-\\varepsilon$, moving further earns nothing more. The row "bad action, ratio grew a
        lot" is left alone on purpose: the min keeps the full, more negative $\\rho A$, so an update
        that went the wrong way is never forgiven. The clip restrains overshooting; it never
        weakens a correction.
        """)

    b.text("ex1_intro", f"""
        ## Exercise 1: find the clip boundary by a sweep ({POINTS[NB1]['test_clip_boundary']} points)

        Sweep the ratio over the grid `DEFAULT_RATIOS` = 0.50, 0.55, ..., 2.00 (31 points) with a
        fixed advantage and watch the `diverge` column: for $A > 0$ it is `False` up to the clip
        boundary and `True` beyond it; for $A < 0$ it is `True` below the boundary and `False` from
        it on.

        At the boundary ratio itself both terms are equal (the clip touches but does not bind), so
        the *first* diverging grid ratio for $A = +1$ is 1.25, one step past 1.2. The boundary is
        therefore defined as **the non-diverging grid ratio that sits next to a diverging one**.

        Implement `clip_boundary(epsilon, advantage, ratios=DEFAULT_RATIOS, surrogate=ppo_surrogate)`:

        * `ratios` is an increasing 1-D grid; you may assume `diverge` switches exactly once on it;
        * compute `diverge` on the grid with the `surrogate` argument and `DIVERGE_TOL`;
        * return, as a Python `float`, the grid ratio on the non-diverging side of the switch.

        On the default grid with $\\varepsilon = 0.2$ this gives 1.2 for $A = +1$ (the boundary seen
        from below, where the objective stops rising) and 0.8 for $A = -1$ (the diverging region
        lies below it). The hidden tests use other $\\varepsilon$, both advantage signs and grids
        that do not contain $1 \\pm \\varepsilon$ at all: the answer must come from the sweep, not
        from the formula. The tolerance is what makes this safe on a float32 grid, where
        0.5 + 0.05·14 and 1 + 0.2 may differ in the last bit.
        """)
    b.given("ex1_grid", """
        DEFAULT_RATIOS = 0.5 + 0.05 * jnp.arange(31)   # 0.50, 0.55, ..., 2.00 (float32)
        """)
    b.predict("predict_boundary", """
        **Predict.** With $\\varepsilon = 0.2$ and $A = -1$: which grid ratios will diverge, and
        what will the plot of the clipped objective look like below the boundary? Does the
        boundary move if the advantage is $-2$ instead of $-1$, or if $\\varepsilon = 0.3$?

        *My prediction:*
        """)
    b.answer("clip_boundary", '''
        def clip_boundary(epsilon, advantage, ratios=DEFAULT_RATIOS, surrogate=ppo_surrogate):
            """Grid ratio where the clip starts to bind, found by sweeping ``ratios``.

            Args:
              epsilon: clip range. advantage: a fixed advantage (either sign).
              ratios: increasing 1-D grid of ratios; diverge switches exactly once on it.
              surrogate: function like ppo_surrogate(ratio, advantage, epsilon, clip).

            Returns:
              float: the non-diverging grid ratio adjacent to a diverging one.
            """
            ### BEGIN SOLUTION
            ratios = jnp.asarray(ratios, dtype=jnp.float32)
            gap = jnp.abs(surrogate(ratios, advantage, epsilon, clip=False) - surrogate(ratios, advantage, epsilon, clip=True))
            diverge = np.asarray(gap > DIVERGE_TOL)
            switch = int(np.flatnonzero(diverge[1:] != diverge[:-1])[0])   # change between switch and switch + 1
            i = switch if not diverge[switch] else switch + 1
            return float(ratios[i])
            ### END SOLUTION
        ''')
    b.given("ex1_sweep", """
        for advantage in (1.0, -1.0):
            gap = jnp.abs(ppo_surrogate(DEFAULT_RATIOS, advantage, EPSILON, clip=False)
                          - ppo_surrogate(DEFAULT_RATIOS, advantage, EPSILON))
            diverging = np.asarray(DEFAULT_RATIOS)[np.asarray(gap > DIVERGE_TOL)]
            print(f"A={advantage:+.0f}: diverging grid ratios {diverging.min():.2f} .. {diverging.max():.2f}; "
                  f"boundary = {clip_boundary(EPSILON, advantage):.2f}")

        fig, axes = plt.subplots(1, 2, figsize=(10, 3.6), sharex=True)
        for ax, advantage in zip(axes, (1.0, -1.0)):
            # Both curves are piecewise linear with kinks at 1 +/- epsilon, which lie on the grid.
            ax.plot(DEFAULT_RATIOS, ppo_surrogate(DEFAULT_RATIOS, advantage, EPSILON, clip=False), "--",
                    color="grey", label="unclipped ρA")
            ax.plot(DEFAULT_RATIOS, ppo_surrogate(DEFAULT_RATIOS, advantage, EPSILON), color="C0", lw=2,
                    label="clipped (PPO)")
            ax.axvspan(1 - EPSILON, 1 + EPSILON, color="C2", alpha=0.12, label="trust region [1-ε, 1+ε]")
            boundary = clip_boundary(EPSILON, advantage)
            ax.axvline(boundary, color="C3", ls=":", label=f"boundary found by sweep: {boundary:.2f}")
            ax.set_title(f"advantage A = {advantage:+.0f}")
            ax.set_xlabel("probability ratio ρ = π_new(a)/π_old(a) (dimensionless)")
            ax.set_ylabel("surrogate objective (advantage units)")
            ax.legend(fontsize=8)
        fig.tight_layout()
        """)
    b.tests("test_clip_boundary", hidden=_src(TRUSTED_SURROGATE) + "\n" + _src("""
        _rng = grading.rng("clip_boundary")
        _TASK = {"task": "clip_boundary", "forbid": ("clipped_surrogate",)}
        _DEFAULT = (0.5 + 0.05 * np.arange(31)).astype(np.float32)

        def _expected(eps, adv, grid):
            # Trusted sweep: (the non-diverging grid ratio next to a diverging one, that neighbour).
            grid = np.asarray(grid, np.float32)
            gap = np.abs(_trusted_surrogate(grid, adv, eps, clip=False) - _trusted_surrogate(grid, adv, eps))
            div = gap > 1e-6
            i = int(np.flatnonzero(div[1:] != div[:-1])[0])
            calm, first = (i, i + 1) if not div[i] else (i + 1, i)
            return float(grid[calm]), float(grid[first])

        _cases = []   # (epsilon, advantage, grid or None for the default, label)
        _eps = float(_rng.choice([0.05, 0.1, 0.15, 0.25, 0.3, 0.35, 0.4]))  # on the default grid
        _cases.append((0.2, float(_rng.uniform(0.5, 2.0)), None, "the default grid"))
        _cases.append((0.2, -float(_rng.uniform(0.5, 2.0)), None, "the default grid"))
        _cases.append((_eps, float(_rng.choice([-1, 1]) * _rng.uniform(0.5, 2.0)), None, "the default grid"))
        _eps = float(_rng.uniform(0.05, 0.45))   # fresh epsilon and fresh 16-point grids
        for _adv in (1.0, -1.0):
            _b = 1 + _eps if _adv > 0 else 1 - _eps
            _step = float(_rng.uniform(0.01, 0.03))
            _k = int(_rng.integers(3, 13))              # index of 1 +/- epsilon on the grid
            _grid = (_b + _step * (np.arange(16) - _k)).astype(np.float32)
            _cases.append((_eps, _adv * float(_rng.uniform(0.5, 3.0)), _grid,
                           f"a fresh grid (step {_step:.4f}) through 1{'+' if _adv > 0 else '-'}epsilon"))
            _off = float(_rng.uniform(0.25, 0.75))      # ... and one that misses it
            _grid = (_b + _step * (np.arange(16) - _k - _off)).astype(np.float32)
            _cases.append((_eps, _adv * float(_rng.uniform(0.5, 3.0)), _grid,
                           f"a fresh grid (step {_step:.4f}) that does not contain 1{'+' if _adv > 0 else '-'}epsilon"))

        for _eps_c, _adv_c, _grid_c, _label in _cases:
            _want, _first_div = _expected(_eps_c, _adv_c, _DEFAULT if _grid_c is None else _grid_c)
            _kw = {"surrogate": _trusted_surrogate, **_TASK}
            if _grid_c is not None:
                _kw["ratios"] = _grid_c
            _got = grading.call(clip_boundary, _eps_c, _adv_c, **_kw)
            _hint = ""
            if grading.matches(_got, _first_div):
                _hint = ("You returned the first DIVERGING ratio; the boundary is the non-diverging grid "
                         "ratio next to it (at the boundary both terms are equal).")
            elif _adv_c < 0 and grading.matches(_got, 1 + _eps_c, atol=1e-4):
                _hint = ("For a negative advantage the clip binds BELOW 1 - epsilon: the diverging region "
                         "is the low ratios, so the boundary is near 1 - epsilon.")
            elif grading.matches(_got, (1 + _eps_c) if _adv_c > 0 else (1 - _eps_c)):
                _hint = ("That is the formula value, but this grid does not contain it: return the grid "
                         "ratio found by the sweep.")
            grading.close(_got, _want, f"clip_boundary(epsilon={_eps_c:.4f}, advantage={_adv_c:+.3f}) on {_label}",
                          hint=_hint, atol=1e-6)
        """), visible="""
        # Visible checks on the default grid (a reference surrogate is passed in).
        _ref = lambda r, a, epsilon=0.2, clip=True: (
            grading.reference.clipped_surrogate(r, a, epsilon) if clip else jnp.asarray(r) * a)
        assert abs(clip_boundary(0.2, 1.0, surrogate=_ref) - 1.2) < 1e-6
        assert abs(clip_boundary(0.2, -1.0, surrogate=_ref) - 0.8) < 1e-6
        assert isinstance(clip_boundary(0.2, 1.0, surrogate=_ref), float)
        print("clip_boundary: visible checks passed")
        """)

    b.text("ex3_intro", f"""
        ## Exercise 3: a deserved update that the clip caps anyway ({POINTS[NB1]['test_capped_pair'] + POINTS[NB1]['ex3_explanation']} points)

        Advantages are estimates. Sometimes an action really is much better than expected and a
        large increase of its probability would be right, yet PPO still caps what one step may earn
        for it.

        Set `capped_ratio` and `capped_advantage` to a pair where the advantage is **positive**
        (the action is good), the ratio is **above $1+\\varepsilon$** ($\\varepsilon = 0.2$) and the
        clipped objective is **strictly smaller** than the unclipped one
        ({POINTS[NB1]['test_capped_pair']} points, checked against the library's reference).
        Then explain the trade-off below ({POINTS[NB1]['ex3_explanation']} points).
        """)
    b.predict("predict_capped", """
        **Predict.** For your pair, how much of the unclipped objective will the clip remove?

        *My prediction:*
        """)
    b.answer("capped_pair", """
        ### BEGIN SOLUTION
        capped_ratio = 1.8       # a good action whose probability the update nearly doubled
        capped_advantage = 1.5   # and that really was much better than expected
        ### END SOLUTION
        """)
    b.given("show_capped", """
        u = float(ppo_surrogate(capped_ratio, capped_advantage, EPSILON, clip=False))
        c = float(ppo_surrogate(capped_ratio, capped_advantage, EPSILON))
        print(f"ratio={capped_ratio}, A={capped_advantage}: unclipped {u:.4f}, clipped {c:.4f}, "
              f"the clip removes {u - c:.4f} ({(u - c) / u:.0%} of the incentive)")
        """)
    b.tests("test_capped_pair", hidden="""
        grading.check("capped_ratio" in globals() and "capped_advantage" in globals(),
                      "Exercise 3: define both capped_ratio and capped_advantage.")
        try:
            _pair = np.array([capped_ratio, capped_advantage], dtype=np.float64).reshape(2)
        except Exception:
            _pair = None
        grading.check(_pair is not None, "Exercise 3: capped_ratio and capped_advantage must each be one number.")
        grading.check(bool(np.all(np.isfinite(_pair))), "Exercise 3: the pair must be finite numbers.")
        _r, _a = float(_pair[0]), float(_pair[1])
        grading.check(_a > 0, f"Exercise 3 asks for a GOOD action: the advantage must be positive (got {_a}).")
        grading.check(_r > 1.2, f"Exercise 3: the ratio must lie above 1 + epsilon = 1.2 so the clip can bind (got {_r}).")
        _c = grading.reference.clipped_surrogate(jnp.float32(_r), jnp.float32(_a), 0.2)
        _c = float(np.asarray(_c, np.float64))
        grading.check(_c < _r * _a - 1e-6,
                      f"Exercise 3: the clipped objective ({_c:.6f}) must be strictly smaller than the "
                      f"unclipped one ({_r * _a:.6f}).")
        """, visible="""
        assert capped_advantage > 0 and capped_ratio > 1 + EPSILON
        print("capped pair: visible checks passed")
        """)
    b.text("ex3_question", f"""
        **Explain ({POINTS[NB1]['ex3_explanation']} points).** Using the numbers printed above: what
        does the clip take away from this update, and why does PPO accept that loss rather than
        trust a single advantage estimate? What happens on the next iteration if the action really
        is that good?
        """)
    b.written("ex3_explanation", """
        **Rubric (3 points).**
        - 1 pt: quotes their own printed numbers, e.g. ratio 1.8 and A = 1.5 give unclipped 2.7
          but clipped 1.8, so the step's incentive is capped at (1 + epsilon) A and a third of it is
          removed; beyond 1.2 the objective is flat, so there is no gradient to push further.
        - 1 pt: the reason: advantages are noisy estimates; an overestimated or lucky advantage
          with an unbounded objective could drive one huge, hard-to-undo policy change, and a
          destructive jump costs more than a slightly slower correct one.
        - 1 pt: the cap is per step, not a ceiling on the total change: the next rollout collects
          fresh data with a new old policy (ratio back to 1), so if the advantage stays positive the
          probability keeps rising step after step, just gradually.
        """)
    b.text("end_nb1", """
        Continue with `02_kl_penalty_and_review.ipynb`: the KL penalty, the beta sweep, the
        independent challenge and the review questions.
        """)
    return b.notebook()


def notebook_2():
    b = Builder(NB2)
    b.text("title", f"""
        # PPO's objective, part 2: the KL penalty against a reference policy

        The clip limits one update. Many small updates in the same direction can still carry the
        policy far from where it started, so RLHF adds a second brake: a penalty proportional to
        the KL divergence between the current policy and a frozen **reference policy** (usually
        the instruction-tuned model before RLHF began).

        **Points:** {_points(NB2)} in this notebook ({_points(NB2, False)} autograded,
        {_points(NB2, True)} graded by hand) out of {TOTAL_POINTS} for the whole assignment
        (notebook 1 holds the other {_points(NB1)}).

        As before, write a guess in each **Predict** cell before running the experiment under it.
        """)
    b.given("setup_grading", SETUP)
    b.given("imports", """
        import jax
        import jax.numpy as jnp
        import numpy as np
        import matplotlib.pyplot as plt

        # A four-action toy: the current policy and two frozen references, as logits.
        LOGITS_POLICY = jnp.array([2.0, 0.5, 0.1, -1.0])
        LOGITS_REF_CLOSE = jnp.array([1.8, 0.6, 0.0, -0.9])   # a reference close to the policy
        LOGITS_REF_FAR = jnp.array([-1.0, 2.0, 1.5, 0.8])     # a reference far from it
        RAW_REWARD = 1.0
        BETA = 0.1
        """)
    b.text("concept_kl", r"""
        ## The penalised reward

        $$r_\text{penalised} = r - \beta\,\mathrm{KL}(\pi \,\|\, \pi_\text{ref}),\qquad
        \mathrm{KL}(\pi\,\|\,\pi_\text{ref}) = \sum_a \pi(a)\,\big(\log\pi(a) - \log\pi_\text{ref}(a)\big)\ \text{nats}.$$

        The direction matters: the sum is weighted by the **current policy** $\pi$, so the penalty
        is large when the policy puts probability where the reference puts little. $\beta > 0$ sets
        the exchange rate between reward and drift.
        """)
    b.text("task4_intro", f"""
        ### Task 4: `kl_divergence` ({POINTS[NB2]['test_kl_divergence']} points)

        Implement `kl_divergence(logits_p, logits_q)` = KL(p ‖ q) exactly for two categorical
        distributions given by 1-D logits: `logits_p` is the current policy, `logits_q` the
        reference. Return a scalar in nats.

        Work in **log space**: get log-probabilities with `jax.nn.log_softmax`, not
        `jnp.log(jax.nn.softmax(...))`. The latter turns a tiny probability into `log(0) = -inf` and
        the KL into `inf` or `nan`; the hidden tests include such a case. Implement it yourself
        (the library's `categorical_kl` is off limits for this task).
        """)
    b.answer("kl_divergence", '''
        def kl_divergence(logits_p, logits_q):
            """Exact KL(p || q) = sum_a p(a) (log p(a) - log q(a)) in nats.

            Args:
              logits_p: [n] logits of the current policy (the distribution doing the weighting).
              logits_q: [n] logits of the frozen reference.

            Returns:
              scalar jax array, >= 0, exactly 0 when the two distributions are equal.
            """
            ### BEGIN SOLUTION
            logp = jax.nn.log_softmax(jnp.asarray(logits_p, dtype=jnp.float32))
            ref_logp = jax.nn.log_softmax(jnp.asarray(logits_q, dtype=jnp.float32))
            return jnp.sum(jnp.exp(logp) * (logp - ref_logp))
            ### END SOLUTION
        ''')
    b.tests("test_kl_divergence", hidden="""
        _rng = grading.rng("kl_divergence")
        _TASK = {"task": "kl_divergence", "forbid": ("categorical_kl",)}
        _ls = jax.nn.log_softmax

        def _fwd(p, q):
            return grading.reference.categorical_kl(_ls(p), _ls(q))

        _rev_msg = ("KL direction reversed: measure KL(policy || reference), weighted by the policy's "
                    "probabilities (logits_p), not KL(reference || policy).")
        _n = 6   # one shape for every call, so JAX compiles each operation once
        for _trial in range(3):
            _p = jnp.asarray(_rng.normal(0.0, 1.5, _n), jnp.float32)
            _q = jnp.asarray(_rng.normal(0.0, 1.5, _n), jnp.float32)
            _want, _reversed = _fwd(_p, _q), _fwd(_q, _p)
            _unnormalised = jnp.sum(jnp.exp(_p) * (_p - _q))
            _got = grading.call(kl_divergence, _p, _q, **_TASK)
            _wrong_dir = grading.matches(_got, _reversed, rtol=1e-4) and not grading.matches(_got, _want, rtol=1e-4)
            grading.check(not _wrong_dir, _rev_msg)
            _hint = ""
            if grading.matches(_got, _unnormalised, rtol=1e-4):
                _hint = "The logits were used as log-probabilities: normalise them with jax.nn.log_softmax first."
            grading.close(_got, _want, f"kl_divergence on fresh random logits", hint=_hint,
                          rtol=1e-4, atol=1e-6)
            grading.equal(grading.call(kl_divergence, _p, _p, **_TASK), 0.0,
                          "KL of a distribution with itself",
                          hint="log p - log p must cancel exactly; compute both sides the same way.")
        # Log space: one action with a vanishingly small probability under the reference, then
        # under the policy (exp(-150) underflows to 0 in float32).
        _p = _rng.normal(0.0, 1.0, _n)
        _q = _rng.normal(0.0, 1.0, _n)
        _j = int(_rng.integers(0, _n))
        _q_tiny = _q.copy(); _q_tiny[_j] -= 150.0
        _p_tiny = _p.copy(); _p_tiny[_j] -= 150.0
        _log_hint = ("Compute in log space: jax.nn.log_softmax for both arguments. jnp.log(softmax(...)) "
                     "gives log(0) = -inf for a tiny probability, and the KL becomes inf or nan.")
        for _pp, _qq, _where in ((_p, _q_tiny, "the reference"), (_p_tiny, _q, "the policy")):
            _pp = jnp.asarray(_pp, jnp.float32); _qq = jnp.asarray(_qq, jnp.float32)
            _want = _fwd(_pp, _qq)
            grading.close(grading.call(kl_divergence, _pp, _qq, **_TASK), _want,
                          f"kl_divergence when {_where} gives one action a probability of about exp(-150)",
                          hint=_log_hint, rtol=1e-4, atol=1e-5)
        """, visible="""
        # Visible checks: the module's two numbers, and KL(p || p) = 0.
        np.testing.assert_allclose(kl_divergence(LOGITS_POLICY, LOGITS_REF_CLOSE), 0.0072039, atol=1e-6)
        np.testing.assert_allclose(kl_divergence(LOGITS_POLICY, LOGITS_REF_FAR), 1.9827589, atol=1e-6)
        assert float(kl_divergence(LOGITS_POLICY, LOGITS_POLICY)) == 0.0
        print("kl_divergence: visible checks passed")
        """)
    b.text("task5_intro", f"""
        ### Task 5: `penalized_reward` ({POINTS[NB2]['test_penalized_reward']} points)

        Implement `penalized_reward(reward, beta, kl)` = `reward - beta * kl`. It must work for
        scalars and for arrays that broadcast (for example one `beta` and arrays of rewards and KLs).
        """)
    b.answer("penalized_reward", '''
        def penalized_reward(reward, beta, kl):
            """reward - beta * KL(policy || reference); beta > 0 is held fixed, shapes broadcast."""
            ### BEGIN SOLUTION
            return jnp.asarray(reward, dtype=jnp.float32) - beta * jnp.asarray(kl, dtype=jnp.float32)
            ### END SOLUTION
        ''')
    b.tests("test_penalized_reward", hidden="""
        _rng = grading.rng("penalized_reward")
        _TASK = {"task": "penalized_reward", "forbid": ("regularised_objective",)}
        _n = int(_rng.integers(3, 9))
        _reward = _rng.normal(0.5, 1.0, _n)
        _kl = _rng.uniform(0.0, 3.0, _n)
        _beta = float(_rng.uniform(0.05, 0.9))
        _want, _added, _no_beta = _reward - _beta * _kl, _reward + _beta * _kl, _reward - _kl
        _got = grading.call(penalized_reward, jnp.asarray(_reward, jnp.float32), _beta,
                            jnp.asarray(_kl, jnp.float32), **_TASK)
        _hint = ""
        if grading.matches(_got, _added):
            _hint = "The KL penalty is SUBTRACTED: drifting from the reference must lower the reward."
        elif grading.matches(_got, _no_beta):
            _hint = "beta was ignored: the KL must be multiplied by beta before subtracting it."
        grading.close(_got, _want, f"penalized_reward on fresh inputs (beta={_beta:.4f})", hint=_hint, atol=1e-5)
        """, visible="""
        np.testing.assert_allclose(penalized_reward(1.0, 0.1, 0.0072039), 0.99928, atol=1e-5)
        np.testing.assert_allclose(penalized_reward(1.0, 0.1, 1.9827589), 0.80172, atol=1e-5)
        print("penalized_reward: visible checks passed")
        """)
    b.predict("predict_kl", """
        **Predict.** Look at the three sets of logits. Roughly how large is the KL to the close
        reference, and to the far one? With β = 0.1 and a raw reward of 1.0, how much reward does
        each keep?

        *My prediction:*
        """)
    b.given("show_kl", """
        kl_close = float(kl_divergence(LOGITS_POLICY, LOGITS_REF_CLOSE))
        kl_far = float(kl_divergence(LOGITS_POLICY, LOGITS_REF_FAR))
        print(f"KL(policy || close reference) = {kl_close:.7f} nats")
        print(f"KL(policy || far reference)   = {kl_far:.7f} nats")
        print(f"raw reward {RAW_REWARD}; penalised with beta={BETA}: "
              f"close {float(penalized_reward(RAW_REWARD, BETA, kl_close)):.5f}, "
              f"far {float(penalized_reward(RAW_REWARD, BETA, kl_far)):.5f}")

        actions = np.arange(4)
        fig, ax = plt.subplots(figsize=(6.5, 3.4))
        for k, (label, logits) in enumerate((("current policy", LOGITS_POLICY),
                                             ("close reference", LOGITS_REF_CLOSE),
                                             ("far reference", LOGITS_REF_FAR))):
            ax.bar(actions + (k - 1) * 0.27, jax.nn.softmax(logits), width=0.27, label=label)
        ax.set_xticks(actions)
        ax.set_xlabel("action index")
        ax.set_ylabel("probability (dimensionless)")
        ax.set_title("The policy and the two references")
        ax.legend()
        fig.tight_layout()
        """)
    b.text("read_kl", """
        The raw reward is the same in both cases; only the drift differs. The close reference costs
        almost nothing, the far one removes about a fifth of the reward. In a full RLHF run this
        term is charged at every step, so sustained drift turns into a steady pull back towards
        the reference.
        """)

    b.text("ex2_intro", f"""
        ## Exercise 2: how sensitive is the penalty to β? ({POINTS[NB2]['test_beta_sweep'] + POINTS[NB2]['ex2_discussion']} points)

        Implement `beta_sweep(reward, kl, betas, penalize=penalized_reward)` returning a tuple
        `(penalised, share)` of two arrays, one entry per β:

        * `penalised[i] = penalize(reward, betas[i], kl)`;
        * `share[i] = betas[i] * kl / reward`, the **fraction** of the raw reward the penalty
          consumes (0.198 means 19.8 %; `reward` is positive here).

        As in notebook 1, call the `penalize` argument: the tests pass a trusted one in
        ({POINTS[NB2]['test_beta_sweep']} points). Then discuss the result
        ({POINTS[NB2]['ex2_discussion']} points).
        """)
    b.predict("predict_beta", """
        **Predict.** For the far reference (KL ≈ 1.98 nats) and β in {0.01, 0.1, 0.5, 1.0}: from
        which β on does the penalty eat more than half of a raw reward of 1.0? Can the penalised
        reward become negative?

        *My prediction:*
        """)
    b.answer("beta_sweep", '''
        def beta_sweep(reward, kl, betas, penalize=penalized_reward):
            """Penalised reward and the share of the raw reward consumed, for each beta.

            Args:
              reward: positive raw reward (scalar). kl: KL(policy || reference) in nats (scalar).
              betas: 1-D array of KL coefficients.
              penalize: function like penalized_reward(reward, beta, kl).

            Returns:
              (penalised, share): arrays of shape [len(betas)]; share = beta * kl / reward (a fraction).
            """
            ### BEGIN SOLUTION
            betas = jnp.asarray(betas, dtype=jnp.float32)
            penalised = penalize(reward, betas, kl)
            share = betas * kl / reward
            return penalised, share
            ### END SOLUTION
        ''')
    b.given("show_beta", """
        BETAS = jnp.array([0.01, 0.1, 0.5, 1.0])
        penalised, share = beta_sweep(RAW_REWARD, kl_far, BETAS)
        for beta, pen, sh in zip(BETAS, penalised, share):
            print(f"beta={float(beta):5.2f}: penalised reward {float(pen):+.5f}, penalty consumes {float(sh):7.2%} of the raw reward")

        fig, (ax_r, ax_s) = plt.subplots(1, 2, figsize=(10, 3.6))
        ax_r.plot(BETAS, penalised, "o-", label="penalised reward")
        ax_r.axhline(RAW_REWARD, color="grey", ls="--", label="raw reward")
        ax_r.axhline(0.0, color="black", lw=0.6)
        ax_r.set_xscale("log")
        ax_r.set_xlabel("KL coefficient β (dimensionless, log scale)")
        ax_r.set_ylabel("reward (reward-model units)")
        ax_r.set_title(f"far reference, KL = {kl_far:.3f} nats")
        ax_r.legend()
        ax_s.plot(BETAS, 100 * share, "o-", color="C3")
        ax_s.axhline(100, color="grey", ls="--", label="the whole raw reward")
        ax_s.set_xscale("log")
        ax_s.set_xlabel("KL coefficient β (dimensionless, log scale)")
        ax_s.set_ylabel("share of raw reward consumed (%)")
        ax_s.legend()
        fig.tight_layout()
        """)
    b.tests("test_beta_sweep", hidden="""
        _rng = grading.rng("beta_sweep")
        _TASK = {"task": "beta_sweep", "forbid": ("regularised_objective",)}

        def _trusted_penalize(reward, beta, kl):
            return np.float32(reward) - np.asarray(beta, np.float32) * np.float32(kl)

        _m = 5
        for _trial in range(3):
            _betas = np.sort(_rng.uniform(0.001, 2.0, _m))
            _kl = float(_rng.uniform(0.01, 3.0))
            _reward = float(_rng.uniform(0.5, 3.0))
            _pen = _reward - _betas * _kl
            _share = _betas * _kl / _reward
            _got = grading.call(beta_sweep, _reward, _kl, _betas.astype(np.float32),
                                penalize=_trusted_penalize, **_TASK)
            grading.check(_got.shape == (2, _m),
                          f"beta_sweep must return (penalised, share), each with one entry per beta "
                          f"({_m} here); got an array of shape {_got.shape}.")
            _what = f"beta_sweep(reward={_reward:.4f}, kl={_kl:.4f}, {_m} fresh betas)"
            grading.close(_got[0], _pen, _what + ": penalised rewards", atol=1e-5)
            _hint = ""
            if grading.matches(_got[1], 100 * _share, rtol=1e-4):
                _hint = "Return the share as a fraction (0.198), not a percentage (19.8)."
            elif grading.matches(_got[1], _pen / _reward, rtol=1e-4):
                _hint = "That is the share KEPT; the share CONSUMED is beta * kl / reward."
            grading.close(_got[1], _share, _what + ": share of the raw reward consumed", hint=_hint,
                          rtol=1e-4, atol=1e-6)
        """, visible="""
        # Visible checks with the far reference's KL (a reference penalize is passed in).
        _pen, _share = beta_sweep(1.0, 1.9827589, jnp.array([0.01, 0.1, 0.5, 1.0]),
                                  penalize=lambda r, b, k: r - b * k)
        np.testing.assert_allclose(_pen, [0.980172, 0.801724, 0.008621, -0.982759], atol=1e-5)
        np.testing.assert_allclose(_share, [0.019828, 0.198276, 0.991379, 1.982759], atol=1e-5)
        print("beta_sweep: visible checks passed")
        """)
    b.text("ex2_question", f"""
        **Discuss ({POINTS[NB2]['ex2_discussion']} points).** Quote the shares you printed. In a real
        RLHF run, what does a team gain by choosing a larger β, and what does it give up?
        """)
    b.written("ex2_discussion", """
        **Rubric (3 points).**
        - 1 pt: quotes the numbers: for KL about 1.98 nats, beta 0.01 / 0.1 / 0.5 / 1.0 consume
          about 2 % / 20 % / 99 % / 198 % of a raw reward of 1.0 (penalised 0.980 / 0.802 / 0.009 /
          -0.983): the cost grows linearly in beta and at beta = 1 drifting costs more than the whole
          reward is worth.
        - 1 pt: larger beta buys safety: the policy is held near the reference, which preserves
          general capabilities and instruction following, limits reward hacking of an imperfect
          reward model, and keeps training stable.
        - 1 pt: larger beta costs improvement: the policy can move less, so it collects less of the
          reward (slower learning, a lower reward ceiling; the optimum sits closer to the
          reference); too small a beta lets it drift and exploit the reward model. The choice is a
          trade-off, often tuned or adapted to a KL target.
        """)

    b.text("challenge_intro", f"""
        ## Independent challenge ({POINTS[NB2]['challenge_answer']} points, graded by hand)

        A teammate says: *"PPO's clipping means the policy can never make a large change even when a
        large change is warranted, so RLHF with PPO is fundamentally too conservative to work."*

        Evaluate the claim using the clipped-objective behaviour you verified in notebook 1 (quote
        the numbers). Is it right, partly right, or wrong, and why?
        """)
    b.written("challenge_answer", """
        **Rubric (4 points).**
        - 1 pt: identifies what the clip bounds: the incentive of ONE update step relative to the
          old policy that collected the batch (ratio measured against pi_old), not the total change
          over training.
        - 1 pt: uses the verified case: ratio 1.8, A = +1 gives unclipped 1.8 but clipped 1.2; the
          objective is flat beyond 1 + epsilon, so one step cannot profit from pushing further.
        - 1 pt: explains accumulation: PPO runs many iterations; each new rollout resets the ratio
          to 1 with a new old policy, so a consistent positive advantage keeps moving the
          probability up, step by step, to a large total change. The clip trades per-step
          aggressiveness for stability against noisy or overestimated advantages.
        - 1 pt: notes the asymmetry: ratio 1.8 with A = -1 keeps the full -1.8 (not -1.2), so the
          clip never softens the correction of a bad update; conclusion: the claim confuses a
          per-step bound with a ceiling on total change (at most "slower", not "cannot work").
        """)

    b.text("cyu_intro", f"""
        ## Check your understanding ({sum(POINTS[NB2][f'cyu_q{i}'] for i in range(1, 6))} points, 1 each, graded by hand)

        Answer each question in two or three sentences in the cell below it.
        """)
    questions = [
        ("This assignment verifies two formulas of PPO and leaves the rest of a PPO iteration out. "
         "What does it leave out, and which two pieces does it verify?",
         """
         Full credit: names what a full PPO iteration needs and is not run here (rollouts from a live
         policy, a reward model scoring them, a value function / critic for the advantage, many
         iterations of weight updates on a real model: too expensive for a CPU toy) and the two
         verified pieces: the clipped surrogate objective and the KL penalty against a frozen
         reference policy, the two formulas that keep PPO's updates safe.
         """),
        ("Write the clipped surrogate objective. What does ε control, and what range of ratios does "
         "ε = 0.2 give?",
         """
         Full credit: objective = min(ratio * A, clip(ratio, 1 - eps, 1 + eps) * A); epsilon is the
         half-width of the trust region around ratio = 1 (no change); with epsilon = 0.2 the ratio
         is clipped to [0.8, 1.2] inside the clipped term before multiplying by the advantage.
         """),
        ("For ratio 1.8 and advantage +1, what are the unclipped and clipped objectives, and why do "
         "they differ?",
         """
         Full credit: unclipped 1.8, clipped 1.2. The ratio exceeds 1 + epsilon = 1.2, so the clipped
         term caps it at 1.2 before multiplying by the positive advantage and the min picks 1.2: one
         step gets no extra reward for pushing a good action's probability further.
         """),
        ("For ratio 1.8 and advantage −1, work out both terms and the minimum. What does the result "
         "say about the clip's asymmetry?",
         """
         Full credit: clip(1.8, 0.8, 1.2) = 1.2, clipped term 1.2 * -1 = -1.2; unclipped 1.8 * -1 =
         -1.8; min(-1.8, -1.2) = -1.8, the unclipped value, so the clip has no effect. The clip never
         softens the incentive to correct an update that raised a bad action's probability; it only
         caps over-pushing in a direction that already improved things.
         """),
        ("Compare the penalised rewards for the close and the far reference at β = 0.1. What does the "
         "comparison show?",
         """
         Full credit: close reference KL about 0.0072 nats gives 0.99928, nearly the raw 1.0; far
         reference KL about 1.98 nats gives 0.80172, about a fifth of the reward lost. The same raw
         reward is penalised in proportion to how far the policy has drifted from the frozen
         reference (linear in KL at fixed beta).
         """),
    ]
    for i, (question, rubric) in enumerate(questions, start=1):
        b.text(f"cyu_q{i}_text", f"**Q{i}.** {question}")
        b.written(f"cyu_q{i}", "**Rubric (1 point).** " + _src(rubric))
    return b.notebook()


def build() -> dict:
    """Return ``{filename: NotebookNode}`` for the assignment (deterministic)."""
    return {NB1: notebook_1(), NB2: notebook_2()}


def render(nb) -> str:
    return nbformat.writes(nb) + "\n"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="compare with the committed notebooks, write nothing")
    args = parser.parse_args(argv)
    stale = []
    for name, nb in build().items():
        path = OUT_DIR / name
        text = render(nb)
        if args.check:
            if not path.exists() or path.read_text(encoding="utf-8") != text:
                stale.append(str(path.relative_to(ROOT)))
        else:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text, encoding="utf-8")
            print(f"wrote {path.relative_to(ROOT)}")
    if stale:
        print("out of date (run tools/build_source_ppo_objective.py):", ", ".join(stale), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
