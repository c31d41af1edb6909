# ---
# jupyter:
#   kernelspec:
#     display_name: Python 3 (ipykernel)
#     language: python
#     name: python3
# ---

# %% [markdown] nbgrader={"grade": false, "grade_id": "title", "locked": true, "schema_version": 3, "solution": false, "task": false}
# # a1 · PPO's objective, part 1: the clipped surrogate
#
# PPO updates a policy with an objective that rewards good actions, but only up to a point.
# In this notebook you build that objective in JAX, tabulate how it behaves in five
# situations, locate the exact ratio where the clip starts to bind, and measure what the clip
# takes away from an update that was actually deserved.
#
# **You will be able to** write PPO's signed clipped surrogate, say for each sign of the
# advantage which end of the clip band can bind, and find that end by a sweep.
# **Prerequisites:** Python and NumPy, the idea of a policy gradient (raise the probability of
# actions with a positive advantage), and `jax.numpy` at the level of `jnp.clip` and
# `jnp.minimum`. **Expected time:** about one hour.
#
# **Scope.** Everything here runs on hand-picked numbers. Nothing collects rollouts, fits a
# critic or updates a language model: we check the *mechanics of the objective*, which is the
# part of a PPO step that decides how far one update may push the policy.
#
# Run the cells from top to bottom. Cells marked **Predict** are for you: write down a guess
# before running the experiment below it (not graded, but it is how the surprises stick).
# Every graded piece is a numbered task, **Task 1.1** to **Task 1.5**.

# %% [markdown] nbgrader={"grade": false, "grade_id": "points_part1", "locked": true, "schema_version": 3, "solution": false, "task": false}
# **Points.** This notebook: **18 points**. The whole assignment `a1_ppo_objective` (two notebooks) is worth **46 points**: 31 autograded and 15 graded by hand.
#
# Tasks and the cells that grade them: Task 1.1 `test_ppo_surrogate`, Task 1.2 `test_surrogate_table`, Task 1.3 `test_clip_boundary`, Task 1.4 `test_capped_pair`, Task 1.5 `ex3_explanation`.
#
# | graded cell | points | how |
# |---|---|---|
# | `test_ppo_surrogate` | 6 | autograded |
# | `test_surrogate_table` | 3 | autograded |
# | `test_clip_boundary` | 4 | autograded |
# | `test_capped_pair` | 2 | autograded |
# | `ex3_explanation` | 3 | graded by hand |
#
# Run the notebook top to bottom after restarting the kernel. Visible tests help you; hidden tests on fresh random inputs decide the grade. Validate's "Success! Your notebook passes all the tests." means the visible tests passed, not that you have full marks. Keep the first code cell as it is, and do not delete, move or edit the locked cells (the grader restores them); your own extra cells are fine anywhere, and a harmless line above the first cell (a `%matplotlib` magic, say) is only listed for the instructor, it costs nothing.

# %% nbgrader={"grade": false, "grade_id": "setup_grading", "locked": true, "schema_version": 3, "solution": false, "task": false}
from rlhf_lab import grading
grading.start()

# %% nbgrader={"grade": false, "grade_id": "imports", "locked": true, "schema_version": 3, "solution": false, "task": false}
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


# %% [markdown] nbgrader={"grade": false, "grade_id": "concept_clip", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ## The ratio and the clip
#
# For an action $a$ sampled by the old (behaviour) policy, the **probability ratio**
# $\rho = \pi_\text{new}(a)/\pi_\text{old}(a)$ says how much an update has changed that action's
# probability: $\rho = 1$ means unchanged. The **advantage** $A$ says whether the action was
# better ($A > 0$) or worse ($A < 0$) than expected.
#
# The plain surrogate $\rho A$ keeps paying for larger and larger moves. PPO instead takes the
# smaller of two products,
#
# $$\text{objective}(\rho, A) = \min\big(\rho A,\ \operatorname{clip}(\rho, 1-\varepsilon, 1+\varepsilon)\,A\big),$$
#
# with $\varepsilon = 0.2$ by default. The minimum is taken **after** multiplying by $A$, so
# the sign of the advantage decides which end of the clip range can matter.

# %% [markdown] nbgrader={"grade": false, "grade_id": "task1_intro", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ### Task 1.1: `ppo_surrogate` (6 points)
#
# Implement `ppo_surrogate(ratio, advantage, epsilon=0.2, clip=True)` with `jax.numpy`:
#
# * `clip=False` returns the plain product `ratio * advantage`;
# * `clip=True` returns the signed clipped objective above, elementwise;
# * `ratio` and `advantage` may be scalars or arrays that broadcast against each other.
#
# Write the computation yourself: calling the course library's `clipped_surrogate` (or any
# wrapper around it) earns no points for this task.

# %% nbgrader={"grade": false, "grade_id": "ppo_surrogate", "locked": false, "schema_version": 3, "solution": true, "task": false}
def ppo_surrogate(ratio, advantage, epsilon=0.2, clip=True):
    """PPO's per-sample surrogate.

    clip=False: ratio * A.
    clip=True:  min(ratio * A, clip(ratio, 1 - epsilon, 1 + epsilon) * A), elementwise.

    Args:
      ratio: probability ratios pi_new(a) / pi_old(a), scalar or array.
      advantage: advantages, broadcastable against ``ratio``.
      epsilon: half-width of the clip band [1 - epsilon, 1 + epsilon] around ratio = 1 (held
        fixed). The band is not a trust region: a sample outside it simply stops adding incentive.
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


# %% [markdown]
# **Predict.** Before running the table: in which of the five cases will the clipped and
# unclipped objectives differ, and which way (up or down)? Write your guess here.
#
# *My prediction:*

# %% nbgrader={"grade": true, "grade_id": "test_ppo_surrogate", "locked": true, "points": 6, "schema_version": 3, "solution": false, "task": false}
# test_ppo_surrogate: ppo_surrogate equals min(rho*A, clip(rho)*A) on fresh ratios, advantages and epsilon (both signs, below/inside/above the band, broadcasting)
### BEGIN HIDDEN TESTS
grading.judge("test_ppo_surrogate")
### END HIDDEN TESTS
# Visible checks: the five cases of the table.
np.testing.assert_allclose(ppo_surrogate(CASE_RATIOS, CASE_ADVANTAGES, clip=False),
                           [1.8, 1.05, -1.8, -0.3, 0.3], atol=1e-6,
                           err_msg="clip=False must return ratio * advantage (DESIRED is the expected value)")
np.testing.assert_allclose(ppo_surrogate(CASE_RATIOS, CASE_ADVANTAGES),
                           [1.2, 1.05, -1.8, -0.8, 0.3], atol=1e-6,
                           err_msg="clip=True must return min(ratio*A, clip(ratio)*A) (DESIRED is the expected value)")
print("ppo_surrogate: visible checks passed")


# %% [markdown] nbgrader={"grade": false, "grade_id": "task2_intro", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ### Task 1.2: the five-case table (3 points)
#
# Implement `surrogate_table(ratios, advantages, epsilon=0.2, surrogate=ppo_surrogate)`. It
# returns a tuple `(unclipped, clipped, diverge)` of three arrays with one entry per case:
#
# * `unclipped = surrogate(ratios, advantages, epsilon, clip=False)`;
# * `clipped = surrogate(ratios, advantages, epsilon, clip=True)`;
# * `diverge` is a boolean array, `True` where `|unclipped - clipped| > DIVERGE_TOL` (1e-6).
#   Use that tolerance, not `!=`: float32 rounding can leave a harmless difference of a few
#   1e-7 at the edge of the clip range.
#
# Call the `surrogate` argument rather than `ppo_surrogate` directly: the tests pass a
# trusted surrogate in (and another function with the same signature), so this task is graded on
# the table logic alone. What they pass is a JAX function like `ppo_surrogate`: call it on the
# arrays, or `jax.vmap` / `jax.jit` it if you like (`clip` stays a Python bool).

# %% nbgrader={"grade": false, "grade_id": "surrogate_table", "locked": false, "schema_version": 3, "solution": true, "task": false}
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


# %% nbgrader={"grade": false, "grade_id": "show_table", "locked": true, "schema_version": 3, "solution": false, "task": false}
unclipped, clipped, diverge = surrogate_table(CASE_RATIOS, CASE_ADVANTAGES, EPSILON)
for name, r, a, u, c, d in zip(CASE_NAMES, CASE_RATIOS, CASE_ADVANTAGES, unclipped, clipped, diverge):
    print(f"{name:34s} ratio={float(r):4.2f} A={float(a):+4.1f} "
          f"unclipped={float(u):+7.4f} clipped={float(c):+7.4f} diverge={bool(d)}")

# %% nbgrader={"grade": true, "grade_id": "test_surrogate_table", "locked": true, "points": 3, "schema_version": 3, "solution": false, "task": false}
# test_surrogate_table: surrogate_table returns (unclipped, clipped, diverge) for fresh cases, computed with the surrogate it is given
### BEGIN HIDDEN TESTS
grading.judge("test_surrogate_table")
### END HIDDEN TESTS
# Visible checks (a reference surrogate is passed in, as the hidden tests do).
_ref = lambda r, a, epsilon=0.2, clip=True: (
    grading.reference.clipped_surrogate(r, a, epsilon) if clip else jnp.asarray(r) * a)
u, c, d = surrogate_table(CASE_RATIOS, CASE_ADVANTAGES, surrogate=_ref)
np.testing.assert_allclose(u, [1.8, 1.05, -1.8, -0.3, 0.3], atol=1e-6,
                           err_msg="unclipped column (DESIRED is the expected value)")
np.testing.assert_allclose(c, [1.2, 1.05, -1.8, -0.8, 0.3], atol=1e-6,
                           err_msg="clipped column (DESIRED is the expected value)")
_want = [True, False, False, True, False]
assert [bool(x) for x in np.asarray(d)] == _want, f"diverge column: expected {_want}, got {[bool(x) for x in np.asarray(d)]}"
print("surrogate_table: visible checks passed")

# %% [markdown] nbgrader={"grade": false, "grade_id": "read_table", "locked": true, "schema_version": 3, "solution": false, "task": false}
# **Reading the table.** The clip changes two rows, and in both it makes the objective
# *flat*: once a good action's ratio is above $1+\varepsilon$, or a bad action's ratio is
# below $1-\varepsilon$, moving further earns nothing more. The row "bad action, ratio grew a
# lot" is left alone on purpose: the min keeps the full, more negative $\rho A$, so an update
# that went the wrong way is never forgiven. The clip restrains overshooting; it never
# weakens a correction.

# %% [markdown] nbgrader={"grade": false, "grade_id": "ex1_intro", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ### Task 1.3: find the clip boundary by a sweep (4 points)
#
# Sweep the ratio over the grid `DEFAULT_RATIOS` = 0.50, 0.55, ..., 2.00 (31 points) with a
# fixed advantage and watch the `diverge` column: for $A > 0$ it is `False` up to the clip
# boundary and `True` beyond it; for $A < 0$ it is `True` below the boundary and `False` from
# it on.
#
# At the boundary ratio itself both terms are equal (the clip touches but does not bind), so
# the boundary is defined as **the non-diverging grid ratio that sits next to a diverging one**,
# not the first diverging ratio.
#
# Implement `clip_boundary(epsilon, advantage, ratios=DEFAULT_RATIOS, surrogate=ppo_surrogate)`:
#
# * `ratios` is an increasing 1-D grid; you may assume `diverge` switches exactly once on it;
# * compute `diverge` on the grid with the `surrogate` argument and `DIVERGE_TOL`;
# * return, as a Python `float`, the grid ratio on the non-diverging side of the switch.
#
# The visible test after the sweep checks the default grid with $\varepsilon = 0.2$ for both
# signs of $A$ (make your prediction first). The hidden tests use other $\varepsilon$, both advantage signs and grids
# that do not contain $1 \pm \varepsilon$ at all: the answer must come from the sweep, not
# from the formula. The tolerance is what makes this safe on a float32 grid, where
# 0.5 + 0.05·14 and 1 + 0.2 may differ in the last bit.

# %% nbgrader={"grade": false, "grade_id": "ex1_grid", "locked": true, "schema_version": 3, "solution": false, "task": false}
DEFAULT_RATIOS = 0.5 + 0.05 * jnp.arange(31)   # 0.50, 0.55, ..., 2.00 (float32)


# %% [markdown]
# **Predict.** With $\varepsilon = 0.2$ and $A = -1$: which grid ratios will diverge, and
# what will the plot of the clipped objective look like below the boundary? Does the
# boundary move if the advantage is $-2$ instead of $-1$, or if $\varepsilon = 0.3$?
#
# *My prediction:*

# %% nbgrader={"grade": false, "grade_id": "clip_boundary", "locked": false, "schema_version": 3, "solution": true, "task": false}
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


# %% nbgrader={"grade": false, "grade_id": "ex1_sweep", "locked": true, "schema_version": 3, "solution": false, "task": false}
for advantage in (1.0, -1.0):
    gap = jnp.abs(ppo_surrogate(DEFAULT_RATIOS, advantage, EPSILON, clip=False)
                  - ppo_surrogate(DEFAULT_RATIOS, advantage, EPSILON))
    diverging = np.asarray(DEFAULT_RATIOS)[np.asarray(gap > DIVERGE_TOL)]
    span = (f"{diverging.min():.2f} .. {diverging.max():.2f}" if diverging.size
            else "none (check ppo_surrogate: with clip=True it never differs from clip=False here)")
    print(f"A={advantage:+.0f}: diverging grid ratios {span}; boundary = {clip_boundary(EPSILON, advantage):.2f}")

fig, axes = plt.subplots(1, 2, figsize=(10, 3.6), sharex=True)
for ax, advantage in zip(axes, (1.0, -1.0)):
    # Both curves are piecewise linear with kinks at 1 +/- epsilon, which lie on the grid.
    ax.plot(DEFAULT_RATIOS, ppo_surrogate(DEFAULT_RATIOS, advantage, EPSILON, clip=False), "--",
            color="grey", label="unclipped ρA")
    ax.plot(DEFAULT_RATIOS, ppo_surrogate(DEFAULT_RATIOS, advantage, EPSILON), color="C0", lw=2,
            label="clipped (PPO)")
    ax.axvspan(1 - EPSILON, 1 + EPSILON, color="C2", alpha=0.12, label="clip band [1-ε, 1+ε]")
    boundary = clip_boundary(EPSILON, advantage)
    ax.axvline(boundary, color="C3", ls=":", label=f"boundary found by sweep: {boundary:.2f}")
    ax.set_title(f"advantage A = {advantage:+.0f}")
    ax.set_xlabel("probability ratio ρ = π_new(a)/π_old(a) (dimensionless)")
    ax.set_ylabel("surrogate objective (advantage units)")
    ax.legend(fontsize=8)
fig.tight_layout()

# %% nbgrader={"grade": true, "grade_id": "test_clip_boundary", "locked": true, "points": 4, "schema_version": 3, "solution": false, "task": false}
# test_clip_boundary: clip_boundary finds the grid ratio where the clip starts to bind, for fresh epsilons, both signs of A and other grids
### BEGIN HIDDEN TESTS
grading.judge("test_clip_boundary")
### END HIDDEN TESTS
# Visible checks on the default grid (a reference surrogate is passed in).
_ref = lambda r, a, epsilon=0.2, clip=True: (
    grading.reference.clipped_surrogate(r, a, epsilon) if clip else jnp.asarray(r) * a)
for _adv, _want in ((1.0, 1.2), (-1.0, 0.8)):
    _got = clip_boundary(0.2, _adv, surrogate=_ref)
    assert isinstance(_got, float), f"clip_boundary must return a Python float, got {type(_got).__name__}"
    assert abs(_got - _want) < 1e-6, f"clip_boundary(0.2, {_adv:+.0f}): expected {_want}, got {_got}"
print("clip_boundary: visible checks passed")

# %% [markdown] nbgrader={"grade": false, "grade_id": "ex3_intro", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ### Task 1.4: the numbers of a capped update (2 points)
#
# Advantages are estimates. Sometimes an action really is much better than expected and a
# large increase of its probability would be right, yet PPO still caps what one step may earn
# for it. Here you measure by how much.
#
# 1. Set `capped_ratio` and `capped_advantage` to a pair where the advantage is **positive**
#    (the action is good), the ratio is **above $1+\varepsilon$** ($\varepsilon = 0.2$) and the
#    clipped objective is **strictly smaller** than the unclipped one.
# 2. Implement `cap_numbers(ratio, advantage, epsilon=0.2, surrogate=ppo_surrogate)` returning
#    the three numbers that show the cap, as a tuple `(unclipped, clipped, lost)`:
#    `unclipped = surrogate(ratio, advantage, epsilon, clip=False)`, `clipped` the same with
#    `clip=True`, and `lost = unclipped - clipped`, the incentive the clip removes (0 when the
#    clip does not bind, never negative).
#
# As before, call the `surrogate` argument: the hidden tests pass a trusted one in and check
# `cap_numbers` on fresh ratios, advantages and epsilons, both signs, inside and outside the band.
# Then explain the trade-off (Task 1.5, 3 points).

# %% [markdown]
# **Predict.** For your pair, how much of the unclipped objective will the clip remove?
#
# *My prediction:*

# %% nbgrader={"grade": false, "grade_id": "capped_pair", "locked": false, "schema_version": 3, "solution": true, "task": false}
# Task 1.4, part 1: a good action whose ratio is above 1 + epsilon
### BEGIN SOLUTION
capped_ratio = 1.8       # a good action whose probability the update nearly doubled
capped_advantage = 1.5   # and that really was much better than expected
### END SOLUTION

# %% nbgrader={"grade": false, "grade_id": "cap_numbers", "locked": false, "schema_version": 3, "solution": true, "task": false}
def cap_numbers(ratio, advantage, epsilon=0.2, surrogate=ppo_surrogate):
    """What the clip takes from one sample: (unclipped, clipped, lost).

    unclipped = ratio * A; clipped = min(ratio * A, clip(ratio, 1 - epsilon, 1 + epsilon) * A);
    lost = unclipped - clipped >= 0 (the incentive removed by the clip). ratio, advantage and
    epsilon are scalars; epsilon is held fixed.

    Returns:
      tuple of three scalars (numbers or 0-d arrays).
    """
    ### BEGIN SOLUTION
    unclipped = surrogate(ratio, advantage, epsilon, clip=False)
    clipped = surrogate(ratio, advantage, epsilon, clip=True)
    return unclipped, clipped, unclipped - clipped
    ### END SOLUTION


# %% nbgrader={"grade": false, "grade_id": "show_capped", "locked": true, "schema_version": 3, "solution": false, "task": false}
u, c, lost = cap_numbers(capped_ratio, capped_advantage, EPSILON)
print(f"ratio={capped_ratio}, A={capped_advantage}: unclipped {u:.4f}, clipped {c:.4f}, "
      f"the clip removes {lost:.4f} ({lost / u:.0%} of the incentive)")

# %% nbgrader={"grade": true, "grade_id": "test_capped_pair", "locked": true, "points": 2, "schema_version": 3, "solution": false, "task": false}
# test_capped_pair: the pair has A > 0, a ratio above 1 + epsilon and a clipped objective strictly below the unclipped one; cap_numbers gives (unclipped, clipped, lost) on fresh cases
### BEGIN HIDDEN TESTS
grading.judge("test_capped_pair")
### END HIDDEN TESTS
assert capped_advantage > 0, f"the advantage must be positive (a good action), got {capped_advantage}"
assert capped_ratio > 1 + EPSILON, f"the ratio must lie above 1 + epsilon = {1 + EPSILON}, got {capped_ratio}"
_ref = lambda r, a, epsilon=0.2, clip=True: (
    grading.reference.clipped_surrogate(r, a, epsilon) if clip else jnp.asarray(r) * a)
for _case, _want in (((1.8, 1.0), (1.8, 1.2, 0.6)), ((1.8, -1.0), (-1.8, -1.8, 0.0)), ((1.1, 2.0), (2.2, 2.2, 0.0))):
    _got = cap_numbers(*_case, surrogate=_ref)
    assert len(_got) == 3, f"cap_numbers{_case} must return (unclipped, clipped, lost), got {_got}"
    assert np.allclose(_got, _want, atol=1e-5), f"cap_numbers{_case}: expected {_want}, got {tuple(float(x) for x in _got)}"
print("capped pair: visible checks passed")

# %% [markdown] nbgrader={"grade": false, "grade_id": "ex3_question", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ### Task 1.5: explain the trade-off (3 points, graded by hand)
#
# Using the numbers printed above: what
# does the clip take away from this update, and why does PPO accept that loss rather than
# trust a single advantage estimate? What happens on the next iteration if the action really
# is that good?

# %% [markdown] nbgrader={"grade": true, "grade_id": "ex3_explanation", "locked": false, "points": 3, "schema_version": 3, "solution": true, "task": false}
# ### BEGIN SOLUTION
# **Model answer.** My pair is ratio 1.8 with $A = 1.5$, and the cell printed: unclipped 2.7000,
# clipped 1.8000, the clip removes 0.9000 (33% of the incentive). Past $1 + \varepsilon = 1.2$ the
# clipped term stays at $1.2 \times 1.5 = 1.8 = (1+\varepsilon)A$ whatever the ratio does, so the
# objective is flat there: its slope in the ratio is 0, and this batch offers no reason to raise the
# action's probability any further, however good the action is. A third of what the plain
# surrogate would pay is gone.
#
# PPO gives that up because $A = 1.5$ is a single estimate: in a real run it comes from sampled
# rewards and a learned baseline, so it may be noise or simply too high. If the objective kept
# paying $\rho A$ without limit, one lucky estimate could push the policy a long way in one update,
# and such a jump is hard to take back (the next batch is then sampled from the damaged policy);
# a right step that is only smaller costs a little time, a wrong big one can ruin the run.
#
# The cap holds for one iteration only, because the ratio is measured against the policy that
# sampled the batch. The next rollout is collected from the updated policy, which becomes the new
# old policy, so every ratio starts again at 1. If the action really is that good, its advantage
# comes out positive again and the objective again pays for raising its probability, up to 1.2
# times its new value: iteration after iteration the probability keeps climbing, in bounded steps.
#
# **Rubric (3 points).**
# - 1 pt: quotes their own printed numbers, e.g. ratio 1.8 and A = 1.5 give unclipped 2.7
#   but clipped 1.8, so the step's incentive is capped at (1 + epsilon) A and a third of it is
#   removed; beyond 1.2 the objective is flat, so there is no gradient to push further.
# - 1 pt: the reason: advantages are noisy estimates; an overestimated or lucky advantage
#   with an unbounded objective could drive one huge, hard-to-undo policy change, and a
#   destructive jump costs more than a slightly slower correct one.
# - 1 pt: the cap is per step, not a ceiling on the total change: the next rollout collects
#   fresh data with a new old policy (ratio back to 1), so if the advantage stays positive the
#   probability keeps rising step after step, just gradually.
# ### END SOLUTION

# %% [markdown] nbgrader={"grade": false, "grade_id": "end_nb1", "locked": true, "schema_version": 3, "solution": false, "task": false}
# Continue with `02_kl_penalty_and_review.ipynb`: the KL penalty, the β sweep, the gradients
# of the clip and of the penalty, the independent challenge and the review questions.
