"""Checks of the assignment ``a1_ppo_objective`` (the PyTorch module's clipped objective and KL penalty, in JAX)."""
from __future__ import annotations

import numpy as np

from .core import Jax, Source, check, close, equal, matches, to_float
from .registry import check as register

A = "a1_ppo_objective"
NB1, NB2 = "01_clipped_objective.ipynb", "02_kl_penalty_and_review.ipynb"

def _surrogate(name: str, scale: str = "", band: str = "epsilon") -> Source:
    """A JAX surrogate with ``ppo_surrogate``'s signature: ``scale * min(rho A, clip(rho, 1 - band,
    1 + band) A)`` in float32 (``clip`` stays a Python bool), so an answer may call it on arrays or
    ``jax.vmap`` / ``jax.jit`` / ``jax.grad`` it."""
    return Source(f'''
def {name}(ratio, advantage, epsilon=0.2, clip=True):
    ratio = jnp.asarray(ratio, jnp.float32)
    advantage = jnp.asarray(advantage, jnp.float32)
    unclipped = ratio * advantage
    if not clip:
        return {scale}unclipped
    return {scale}jnp.minimum(unclipped, jnp.clip(ratio, 1.0 - {band}, 1.0 + {band}) * advantage)
''', name)


#: The grader's own surrogate, handed to the table, the boundary sweep and the cap numbers so that a
#: mistake in Task 1.1 is not charged again there.
TRUSTED_SURROGATE = _surrogate("trusted_surrogate")
#: Another objective with the surrogate's signature (twice the trusted one): a table (or the cap
#: numbers) computed with it differs from one computed with the notebook's own ``ppo_surrogate``, so
#: using the argument shows.
SCALED_SURROGATE = _surrogate("scaled_surrogate", scale="2.0 * ")
#: Another objective whose clip band is twice as wide (epsilon counted twice): scaling the objective
#: does not move the clip boundary, widening the band does, so a sweep that calls it finds another
#: boundary than one that calls the notebook's own ``ppo_surrogate``.
WIDE_SURROGATE = _surrogate("wide_surrogate", band="2.0 * epsilon")

#: The grader's own penalised reward (JAX, float32), handed to the beta sweep.
TRUSTED_PENALIZE = Source('''
def trusted_penalize(reward, beta, kl):
    return (jnp.asarray(reward, jnp.float32)
            - jnp.asarray(beta, jnp.float32) * jnp.asarray(kl, jnp.float32))
''', "trusted_penalize")

#: Another penalty with the same signature (beta counted twice): a sweep that calls it shows it used
#: the argument, not the notebook's own ``penalized_reward``.
SCALED_PENALIZE = Source('''
def scaled_penalize(reward, beta, kl):
    return (jnp.asarray(reward, jnp.float32)
            - 2.0 * jnp.asarray(beta, jnp.float32) * jnp.asarray(kl, jnp.float32))
''', "scaled_penalize")

CASE_R = np.array([1.8, 1.05, 1.8, 0.3, 0.3], np.float32)
CASE_A = np.array([1.0, 1.0, -1.0, -1.0, 1.0], np.float32)
FIVE_UNCLIPPED = [1.8, 1.05, -1.8, -0.3, 0.3]
FIVE_CLIPPED = [1.2, 1.05, -1.8, -0.8, 0.3]


_BUILT: dict = {}


def stand_in(source: Source):
    """The function ``source`` defines, built once per process (the grader's own copy, for expected values)."""
    if source not in _BUILT:
        _BUILT[source] = source.build()
    return _BUILT[source]


def surrogate_np(ratio, advantage, epsilon=0.2, clip=True, source: Source = TRUSTED_SURROGATE) -> np.ndarray:
    """What the stand-in ``source`` returns, as a float32 NumPy array: ``min(rho A, clip(rho, 1 - eps,
    1 + eps) A)`` (or ``rho A`` with ``clip=False``) for :data:`TRUSTED_SURROGATE`, twice that for
    :data:`SCALED_SURROGATE`. The expected values are the stand-in's own outputs, bit for bit."""
    return np.asarray(stand_in(source)(ratio, advantage, epsilon, clip), np.float32)


def penalize_np(reward, beta, kl, source: Source = TRUSTED_PENALIZE) -> np.ndarray:
    """What the stand-in penalty ``source`` returns, as a float32 NumPy array."""
    return np.asarray(stand_in(source)(reward, beta, kl), np.float32)


# ------------------------------------------------------------------------------------------------
# 01: the clipped surrogate


@register("test_ppo_surrogate", task="ppo_surrogate", needs=("ppo_surrogate",), forbid=("clipped_surrogate",),
          assignment=A, notebook=NB1)
def ppo_surrogate(student, rng, ref):
    """Probe blocks below, inside and above the band for both signs of A, with a fresh epsilon."""
    eps = float(rng.choice([rng.uniform(0.08, 0.16), rng.uniform(0.25, 0.4)]))
    n = 16  # every probe block has this size, so JAX compiles each operation only once
    a_pos = rng.uniform(0.5, 2.0, n).astype(np.float32)
    a_neg = -rng.uniform(0.5, 2.0, n).astype(np.float32)
    r_hi = (1 + eps + rng.uniform(0.1, 1.0, n)).astype(np.float32)
    r_lo = ((1 - eps) * rng.uniform(0.1, 0.85, n)).astype(np.float32)
    r_in = (1 + eps * rng.uniform(-0.9, 0.9, n)).astype(np.float32)
    keys = ("hi+", "lo+", "hi-", "lo-", "in+", "in-")
    R = np.concatenate([r_hi, r_lo, r_hi, r_lo, r_in, r_in])
    Adv = np.concatenate([a_pos, a_pos, a_neg, a_neg, a_pos, a_neg])

    def block(x, k):
        return np.asarray(x)[keys.index(k) * n:(keys.index(k) + 1) * n]

    cands = {"unc": R * Adv, "top": np.float32(1 + eps) * Adv, "bot": np.float32(1 - eps) * Adv}
    r = rng.uniform(0.05, 2.5, 6 * n).astype(np.float32)
    a = rng.normal(0.0, 1.5, 6 * n).astype(np.float32)
    want = ref.clipped_surrogate(r, a, eps)
    want_scalar = np.minimum(r * -1.5, np.clip(r, 1 - eps, 1 + eps) * -1.5)

    close(student.call("ppo_surrogate", R, Adv, epsilon=eps, clip=False), cands["unc"],
          "ppo_surrogate(..., clip=False)",
          hint="With clip=False the function must return the plain product ratio * advantage.")
    got = to_float(student.call("ppo_surrogate", R, Adv, epsilon=eps), "ppo_surrogate result")

    def is_(k, c):
        return matches(block(got, k), block(cands[c], k))

    bounds = f"[1 - epsilon, 1 + epsilon] = [{1 - eps:.4f}, {1 + eps:.4f}] (epsilon={eps:.4f} here)"
    diag = ""
    if got.shape != R.shape:
        diag = f"expected one value per ratio ({R.shape}), got shape {got.shape}."
    elif is_("hi+", "unc") and is_("lo+", "unc") and is_("hi-", "unc") and is_("lo-", "unc"):
        diag = ("The ratio is never clipped: with clip=True the objective must stop growing once "
                "ratio > 1 + epsilon for a positive advantage.")
    elif is_("hi+", "unc") and is_("lo+", "bot"):
        diag = ("Used max instead of min: PPO keeps the SMALLER (pessimistic) of ratio*A and "
                "clip(ratio)*A; with max a good action's ratio is rewarded without limit.")
    elif is_("lo+", "bot") and is_("hi-", "top"):
        diag = ("Clipped the ratio but dropped the signed min: returning clip(ratio)*A alone softens "
                "the penalty for a bad action whose ratio grew (ratio 1.8, A=-1 must give -1.8, not "
                "-1.2). Return min(ratio*A, clip(ratio)*A).")
    elif is_("hi-", "top") and is_("lo-", "unc"):
        diag = ("Ratio clipped but the sign of A was dropped: the min must compare the two PRODUCTS "
                "ratio*A and clip(ratio)*A, not the ratios before multiplying by A (for A < 0 the "
                "order flips).")
    elif not (is_("hi+", "top") or is_("hi+", "unc")) or not (is_("lo-", "bot") or is_("lo-", "unc")):
        diag = ("Clip bounds wrong (epsilon not applied symmetrically): the ratio must be clipped to "
                + bounds + ", using the epsilon argument.")
    elif not (is_("in+", "unc") and is_("in-", "unc")):
        diag = ("Inside the clip band [1 - epsilon, 1 + epsilon] the objective must equal ratio * advantage "
                "exactly.")
    check(diag == "", "ppo_surrogate: " + diag)
    close(student.call("ppo_surrogate", CASE_R, CASE_A), FIVE_CLIPPED,
          "ppo_surrogate on the five cases (default epsilon=0.2)")
    close(student.call("ppo_surrogate", r, a, epsilon=eps), want, f"ppo_surrogate on fresh random inputs (epsilon={eps:.4f})")
    close(student.call("ppo_surrogate", r, -1.5, epsilon=eps), want_scalar,
          "ppo_surrogate with a scalar advantage and an array of ratios")


@register("test_surrogate_table", task="surrogate_table", needs=("surrogate_table",), forbid=("clipped_surrogate",),
          assignment=A, notebook=NB1)
def surrogate_table(student, rng, ref):
    """Fresh cases (clipped for sure, and three float32 edge cases that must not diverge), the same cases
    with another surrogate passed in (twice the trusted one: the table must follow the argument), and
    the five cases. ``diverge`` must be boolean, as the statement asks."""
    eps = float(rng.uniform(0.1, 0.35))
    n = 16
    r = rng.uniform(0.2, 2.2, 8 * n)
    r = r[np.abs(np.abs(r - 1.0) - eps) > 1e-3][:n - 3].astype(np.float32)
    a = (rng.choice([-1.0, 1.0], n - 3) * rng.uniform(0.3, 2.0, n - 3)).astype(np.float32)
    r[0], a[0] = 1 + eps + rng.uniform(0.1, 1.0), rng.uniform(0.3, 2.0)       # surely clipped, A > 0
    r[1], a[1] = (1 - eps) * rng.uniform(0.1, 0.85), -rng.uniform(0.3, 2.0)  # surely clipped, A < 0
    # a ratio 4 float32 steps above 1 + eps (A = +1) or below 1 - eps (A = -1) does NOT diverge
    up, down = np.float32(1 + eps), np.float32(1 - eps)
    for _ in range(4):
        up, down = np.nextafter(up, np.float32(2)), np.nextafter(down, np.float32(0))
    r = np.concatenate([r, np.array([up, down, up], np.float32)])
    a = np.concatenate([a, np.array([1.0, -1.0, -1.0], np.float32)])
    unc = surrogate_np(r, a, eps, clip=False).astype(np.float64)
    cl = surrogate_np(r, a, eps).astype(np.float64)
    div = np.abs(unc - cl) > 1e-6
    check(bool(div[0] and div[1] and not div[-3] and not div[-2]), "grader self-check (edge cases)")
    raw = student.call("surrogate_table", r, a, epsilon=eps, surrogate=TRUSTED_SURROGATE)
    out = to_float(raw, "surrogate_table result")
    check(out.shape == (3, n),
          f"surrogate_table must return (unclipped, clipped, diverge) with one entry per input "
          f"case ({n} here), got an array of shape {out.shape}. A table copied from the "
          f"printout does not follow fresh inputs.")
    hint = "Compute the columns from the inputs with the surrogate argument; hard-coded values fail on fresh inputs."
    if matches(out[0], cl) and matches(out[1], unc):
        hint = "The columns are swapped: return (unclipped, clipped, diverge) in that order."
    close(out[0], unc, "unclipped column on fresh inputs", hint=hint)
    close(out[1], cl, "clipped column on fresh inputs", hint=hint)
    edge_hint = ""
    if matches(out[2][-3:-1], [1.0, 1.0]):
        edge_hint = ("At the edge of the clip range the two terms differ by a few 1e-7 (float32 "
                     "rounding, not a clip): use |unclipped - clipped| > DIVERGE_TOL, not an exact comparison.")
    equal(out[2], div, "diverge column on fresh inputs (1 = True)",
          hint=edge_hint or "diverge is |unclipped - clipped| > DIVERGE_TOL = 1e-6.")
    kind = _dtype_kind(raw[2]) if isinstance(raw, (tuple, list)) and len(raw) == 3 else None
    check(kind == "b", f"surrogate_table: diverge must be a boolean array (True where the columns differ), got "
                       f"{_dtype_name(raw[2]) if kind else 'no separate diverge array'}: compare with "
                       f"> DIVERGE_TOL and return the comparison itself, not numbers.")
    # another surrogate passed in (twice the trusted one): the table must follow the argument
    unc2 = surrogate_np(r, a, eps, clip=False, source=SCALED_SURROGATE).astype(np.float64)
    cl2 = surrogate_np(r, a, eps, source=SCALED_SURROGATE).astype(np.float64)
    scaled = to_float(student.call("surrogate_table", r, a, epsilon=eps, surrogate=SCALED_SURROGATE),
                      "surrogate_table result")
    check(scaled.shape == (3, n), f"surrogate_table with another surrogate passed in must have shape (3, {n}), "
                                  f"got {scaled.shape}")
    own = ("The table did not change when another surrogate was passed in: call the surrogate argument, "
           "not ppo_surrogate (the tests pass their own function).")
    check(not matches(scaled[:2], out[:2]), "surrogate_table: " + own)
    close(scaled[:2], np.stack([unc2, cl2]), "unclipped and clipped columns with another surrogate passed in "
          "(twice the clipped objective)", hint=own)
    equal(scaled[2], np.abs(unc2 - cl2) > 1e-6, "diverge column with another surrogate passed in (1 = True)",
          hint="diverge is |unclipped - clipped| > DIVERGE_TOL of the columns the surrogate argument gives.")
    five = to_float(student.call("surrogate_table", CASE_R, CASE_A, surrogate=TRUSTED_SURROGATE),
                    "surrogate_table result")
    check(five.shape == (3, 5), f"surrogate_table of the five cases must have shape (3, 5), got {five.shape}")
    equal(five[2], [1.0, 0.0, 0.0, 1.0, 0.0], "diverge column of the five cases (1 = True)")
    close(five[:2], [FIVE_UNCLIPPED, FIVE_CLIPPED], "unclipped and clipped columns of the five cases")


def _dtype_kind(value) -> str | None:
    """The NumPy dtype kind of an array the student returned (``"b"`` for booleans), or None."""
    try:
        return np.asarray(value).dtype.kind
    except Exception:  # noqa: BLE001 - a ragged nesting has no dtype
        return None


def _dtype_name(value) -> str:
    try:
        return f"dtype {np.asarray(value).dtype}"
    except Exception:  # noqa: BLE001
        return "a value without a dtype"


def boundary_expected(eps: float, adv: float, grid, source: Source = TRUSTED_SURROGATE) -> tuple[float, float]:
    """Trusted sweep with the stand-in ``source``: (the non-diverging grid ratio next to a diverging one,
    that diverging neighbour)."""
    grid = np.asarray(grid, np.float32)
    gap = np.abs(surrogate_np(grid, adv, eps, clip=False, source=source) - surrogate_np(grid, adv, eps, source=source))
    div = gap > 1e-6
    i = int(np.flatnonzero(div[1:] != div[:-1])[0])
    calm, first = (i, i + 1) if not div[i] else (i + 1, i)
    return float(grid[calm]), float(grid[first])


@register("test_clip_boundary", task="clip_boundary", needs=("clip_boundary",), forbid=("clipped_surrogate",),
          assignment=A, notebook=NB1)
def clip_boundary(student, rng, ref):
    """The default grid with fresh advantages and epsilons, fresh grids through and beside 1 +/- epsilon,
    then the default grid with another surrogate passed in (its clip band twice as wide: the boundary
    must follow the argument, so a sweep that calls the notebook's own ppo_surrogate is named)."""
    default = (0.5 + 0.05 * np.arange(31)).astype(np.float32)
    cases = []  # (epsilon, advantage, grid or None for the default, label)
    eps = float(rng.choice([0.05, 0.1, 0.15, 0.25, 0.3, 0.35, 0.4]))
    cases.append((0.2, float(rng.uniform(0.5, 2.0)), None, "the default grid"))
    cases.append((0.2, -float(rng.uniform(0.5, 2.0)), None, "the default grid"))
    cases.append((eps, float(rng.choice([-1, 1]) * rng.uniform(0.5, 2.0)), None, "the default grid"))
    eps = float(rng.uniform(0.05, 0.45))
    for adv in (1.0, -1.0):
        b = 1 + eps if adv > 0 else 1 - eps
        step = float(rng.uniform(0.01, 0.03))
        k = int(rng.integers(3, 13))  # index of 1 +/- epsilon on the grid
        grid = (b + step * (np.arange(16) - k)).astype(np.float32)
        sign = "+" if adv > 0 else "-"
        cases.append((eps, adv * float(rng.uniform(0.5, 3.0)), grid, f"a fresh grid (step {step:.4f}) through 1{sign}epsilon"))
        off = float(rng.uniform(0.25, 0.75))
        grid = (b + step * (np.arange(16) - k - off)).astype(np.float32)
        cases.append((eps, adv * float(rng.uniform(0.5, 3.0)), grid,
                      f"a fresh grid (step {step:.4f}) that does not contain 1{sign}epsilon"))
    for eps_c, adv_c, grid_c, label in cases:
        want, first_div = boundary_expected(eps_c, adv_c, default if grid_c is None else grid_c)
        kw = {"surrogate": TRUSTED_SURROGATE}
        if grid_c is not None:
            kw["ratios"] = grid_c
        got = student.call("clip_boundary", eps_c, adv_c, **kw)
        hint = ""
        if matches(got, first_div):
            hint = ("You returned the first DIVERGING ratio; the boundary is the non-diverging grid "
                    "ratio next to it (at the boundary both terms are equal).")
        elif adv_c < 0 and matches(got, 1 + eps_c, atol=1e-4):
            hint = ("For a negative advantage the clip binds BELOW 1 - epsilon: the diverging region "
                    "is the low ratios, so the boundary is near 1 - epsilon.")
        elif matches(got, (1 + eps_c) if adv_c > 0 else (1 - eps_c)):
            hint = "That is the formula value, but this grid does not contain it: return the grid ratio found by the sweep."
        close(got, want, f"clip_boundary(epsilon={eps_c:.4f}, advantage={adv_c:+.3f}) on {label}", hint=hint, atol=1e-6)
    # another surrogate passed in (the band [1 - 2 epsilon, 1 + 2 epsilon]): the boundary must follow the
    # argument. With epsilon in [0.1, 0.2] both bands lie inside the default grid and their boundaries
    # are at least two grid steps apart, so the notebook's own surrogate gives another grid ratio.
    eps = float(rng.uniform(0.1, 0.2))
    own = ("The boundary did not move when another surrogate was passed in: sweep with the surrogate "
           "argument, not ppo_surrogate (the tests pass their own function).")
    for adv in (float(rng.uniform(0.5, 2.0)), -float(rng.uniform(0.5, 2.0))):
        want, _ = boundary_expected(eps, adv, default, source=WIDE_SURROGATE)
        trusted, _ = boundary_expected(eps, adv, default)
        check(abs(want - trusted) > 0.09, "grader self-check (the wide band's boundary)")
        got = student.call("clip_boundary", eps, adv, surrogate=WIDE_SURROGATE)
        check(not matches(got, trusted), "clip_boundary: " + own)
        close(got, want, f"clip_boundary(epsilon={eps:.4f}, advantage={adv:+.3f}) on the default grid with another "
              f"surrogate passed in (clip band [1 - 2 epsilon, 1 + 2 epsilon])", hint=own, atol=1e-6)


@register("test_capped_pair", task="Task 1.4", needs=("capped_ratio", "capped_advantage", "cap_numbers"),
          assignment=A, notebook=NB1)
def capped_pair(student, rng, ref):
    """The pair: a good action (A > 0) above 1 + epsilon, so the clip lowers its objective. Then
    cap_numbers = (unclipped, clipped, lost) on fresh cases (both signs, inside and outside the band),
    each also with another surrogate passed in (twice the trusted one: the numbers must follow the
    argument, so an answer that calls the notebook's own ppo_surrogate is named)."""
    try:
        values = np.array([student.value("capped_ratio"), student.value("capped_advantage")],
                          dtype=np.float64).reshape(2)
    except Exception:  # noqa: BLE001 - anything that is not two numbers
        values = None
    check(values is not None, "Task 1.4: capped_ratio and capped_advantage must each be one number.")
    check(bool(np.all(np.isfinite(values))), "Task 1.4: the pair must be finite numbers.")
    r, a = float(values[0]), float(values[1])
    check(a > 0, f"Task 1.4 asks for a GOOD action: the advantage must be positive (got {a}).")
    check(r > 1.2, f"Task 1.4: the ratio must lie above 1 + epsilon = 1.2 so the clip can bind (got {r}).")
    c = float(np.asarray(ref.clipped_surrogate(np.float32(r), np.float32(a), 0.2), np.float64))
    check(c < r * a - 1e-6, f"Task 1.4: the clipped objective ({c:.6f}) must be strictly smaller than the "
                            f"unclipped one ({r * a:.6f}).")
    eps = float(rng.uniform(0.1, 0.35))
    cases = [  # (ratio, advantage): capped good action, capped bad action, not capped (both signs, in band)
        (1 + eps + float(rng.uniform(0.1, 1.0)), float(rng.uniform(0.5, 2.5))),
        ((1 - eps) * float(rng.uniform(0.1, 0.85)), -float(rng.uniform(0.5, 2.5))),
        (1 + eps + float(rng.uniform(0.1, 1.0)), -float(rng.uniform(0.5, 2.5))),
        ((1 - eps) * float(rng.uniform(0.1, 0.85)), float(rng.uniform(0.5, 2.5))),
        (1 + eps * float(rng.uniform(-0.9, 0.9)), float(rng.choice([-1, 1]) * rng.uniform(0.5, 2.5))),
    ]
    for ratio, adv in cases:
        ratio, adv = float(np.float32(ratio)), float(np.float32(adv))
        unc = float(surrogate_np(ratio, adv, eps, clip=False))
        cl = float(surrogate_np(ratio, adv, eps))
        want = [unc, cl, unc - cl]
        got = to_float(student.call("cap_numbers", ratio, adv, epsilon=eps, surrogate=TRUSTED_SURROGATE),
                       "cap_numbers result")
        what = f"cap_numbers(ratio={ratio:.4f}, advantage={adv:+.4f}, epsilon={eps:.4f})"
        check(got.shape == (3,), f"{what} must return the three numbers (unclipped, clipped, lost), got an "
                                 f"array of shape {got.shape}.")
        hint = "Compute the numbers from the arguments with the surrogate argument."
        if matches(got, [unc, cl, cl - unc]) and unc != cl:
            hint = "lost is unclipped - clipped (the incentive the clip removes, never negative), not clipped - unclipped."
        elif matches(got, [cl, unc, unc - cl]) and unc != cl:
            hint = "The first two numbers are swapped: return (unclipped, clipped, lost) in that order."
        elif unc != 0 and matches(got, [unc, cl, (unc - cl) / unc]) and unc != cl:
            hint = "lost is the difference unclipped - clipped, not a share of the unclipped objective."
        close(got, want, what, hint=hint, atol=1e-5)
        # another surrogate passed in (twice the trusted one): every number doubles (unclipped != 0 here)
        unc2 = float(surrogate_np(ratio, adv, eps, clip=False, source=SCALED_SURROGATE))
        cl2 = float(surrogate_np(ratio, adv, eps, source=SCALED_SURROGATE))
        scaled = to_float(student.call("cap_numbers", ratio, adv, epsilon=eps, surrogate=SCALED_SURROGATE),
                          "cap_numbers result")
        own = ("The numbers did not change when another surrogate was passed in: call the surrogate argument, "
               "not ppo_surrogate (the tests pass their own function).")
        check(not matches(scaled, got), "cap_numbers: " + own)
        close(scaled, [unc2, cl2, unc2 - cl2], what + " with another surrogate passed in (twice the clipped "
              "objective)", hint=own, atol=1e-5)


# ------------------------------------------------------------------------------------------------
# 02: the KL penalty


@register("test_kl_divergence", task="kl_divergence", needs=("kl_divergence",), forbid=("categorical_kl",),
          assignment=A, notebook=NB2)
def kl_divergence(student, rng, ref):
    """Fresh logits (direction, normalisation, KL(p||p) = 0) and probabilities of about exp(-150) (log space)."""
    import jax

    def fwd(p, q):
        return ref.categorical_kl(jax.nn.log_softmax(p), jax.nn.log_softmax(q))

    rev_msg = ("KL direction reversed: measure KL(policy || reference), weighted by the policy's "
               "probabilities (logits_p), not KL(reference || policy).")
    n = 6  # one shape for every call, so JAX compiles each operation once
    for _ in range(3):
        p = rng.normal(0.0, 1.5, n).astype(np.float32)
        q = rng.normal(0.0, 1.5, n).astype(np.float32)
        want, reversed_ = fwd(p, q), fwd(q, p)
        unnormalised = np.sum(np.exp(p.astype(np.float64)) * (p - q))
        got = student.call("kl_divergence", Jax(p), Jax(q))
        check(not (matches(got, reversed_, rtol=1e-4) and not matches(got, want, rtol=1e-4)), rev_msg)
        hint = ""
        if matches(got, unnormalised, rtol=1e-4):
            hint = "The logits were used as log-probabilities: normalise them with jax.nn.log_softmax first."
        close(got, want, "kl_divergence on fresh random logits", hint=hint, rtol=1e-4, atol=1e-6)
        equal(student.call("kl_divergence", Jax(p), Jax(p)), 0.0, "KL of a distribution with itself",
              hint="log p - log p must cancel exactly; compute both sides the same way.")
    p = rng.normal(0.0, 1.0, n)
    q = rng.normal(0.0, 1.0, n)
    j = int(rng.integers(0, n))
    q_tiny = q.copy()
    q_tiny[j] -= 150.0
    p_tiny = p.copy()
    p_tiny[j] -= 150.0
    log_hint = ("Compute in log space: jax.nn.log_softmax for both arguments. jnp.log(softmax(...)) "
                "gives log(0) = -inf for a tiny probability, and the KL becomes inf or nan.")
    for pp, qq, where in ((p, q_tiny, "the reference"), (p_tiny, q, "the policy")):
        pp, qq = pp.astype(np.float32), qq.astype(np.float32)
        close(student.call("kl_divergence", Jax(pp), Jax(qq)), fwd(pp, qq),
              f"kl_divergence when {where} gives one action a probability of about exp(-150)",
              hint=log_hint, rtol=1e-4, atol=1e-5)


@register("test_penalized_reward", task="penalized_reward", needs=("penalized_reward",),
          forbid=("regularised_objective",), assignment=A, notebook=NB2)
def penalized_reward(student, rng, ref):
    """reward - beta * KL on fresh vectors (sign and beta diagnosed)."""
    n = int(rng.integers(3, 9))
    reward = rng.normal(0.5, 1.0, n)
    kl = rng.uniform(0.0, 3.0, n)
    beta = float(rng.uniform(0.05, 0.9))
    want, added, no_beta = reward - beta * kl, reward + beta * kl, reward - kl
    got = student.call("penalized_reward", Jax(reward.astype(np.float32)), beta, Jax(kl.astype(np.float32)))
    hint = ""
    if matches(got, added):
        hint = "The KL penalty is SUBTRACTED: drifting from the reference must lower the reward."
    elif matches(got, no_beta):
        hint = "beta was ignored: the KL must be multiplied by beta before subtracting it."
    close(got, want, f"penalized_reward on fresh inputs (beta={beta:.4f})", hint=hint, atol=1e-5)


@register("test_beta_sweep", task="beta_sweep", needs=("beta_sweep",), forbid=("regularised_objective",),
          assignment=A, notebook=NB2)
def beta_sweep(student, rng, ref):
    """Penalised reward and consumed share for fresh beta grids (fraction, not percentage; consumed, not
    kept), then with another penalty passed in (``reward - 2 beta kl``: the sweep must call its argument)."""
    m = 5
    for _ in range(3):
        betas = np.sort(rng.uniform(0.001, 2.0, m))
        kl = float(rng.uniform(0.01, 3.0))
        reward = float(rng.uniform(0.5, 3.0))
        pen = reward - betas * kl
        share = betas * kl / reward
        got = to_float(student.call("beta_sweep", reward, kl, betas.astype(np.float32), penalize=TRUSTED_PENALIZE),
                       "beta_sweep result")
        check(got.shape == (2, m), f"beta_sweep must return (penalised, share), each with one entry per beta "
                                   f"({m} here); got an array of shape {got.shape}.")
        what = f"beta_sweep(reward={reward:.4f}, kl={kl:.4f}, {m} fresh betas)"
        close(got[0], pen, what + ": penalised rewards", atol=1e-5)
        hint = ""
        if matches(got[1], 100 * share, rtol=1e-4):
            hint = "Return the share as a fraction (0.198), not a percentage (19.8)."
        elif matches(got[1], pen / reward, rtol=1e-4):
            hint = "That is the share KEPT; the share CONSUMED is beta * kl / reward."
        close(got[1], share, what + ": share of the raw reward consumed", hint=hint, rtol=1e-4, atol=1e-6)
    # another penalty passed in (beta counted twice): the penalised column must follow the argument
    want2 = penalize_np(reward, betas.astype(np.float32), kl, source=SCALED_PENALIZE).astype(np.float64)
    got2 = to_float(student.call("beta_sweep", reward, kl, betas.astype(np.float32), penalize=SCALED_PENALIZE),
                    "beta_sweep result")
    check(got2.shape == (2, m), f"beta_sweep with another penalty passed in must have shape (2, {m}), got {got2.shape}")
    own = ("The penalised rewards did not change when another penalty was passed in: call the penalize "
           "argument, not penalized_reward (the tests pass their own function).")
    check(not matches(got2[0], got[0]), "beta_sweep: " + own)
    close(got2[0], want2, f"beta_sweep(reward={reward:.4f}, kl={kl:.4f}) with another penalty passed in "
          "(reward - 2 beta kl)", hint=own, atol=1e-5)



# ------------------------------------------------------------------------------------------------
# 02: the gradients of the clip and of the KL

#: The grader's own surrogate with the library's signature, in JAX (differentiable).
TRUSTED_JAX_SURROGATE = Source('''
def trusted_jax_surrogate(ratio, advantage, epsilon=0.2):
    return jnp.minimum(ratio * advantage, jnp.clip(ratio, 1.0 - epsilon, 1.0 + epsilon) * advantage)
''', "trusted_jax_surrogate")

#: The grader's own KL(p || q) of two logit vectors, in JAX.
TRUSTED_JAX_KL = Source('''
def trusted_jax_kl(logits_p, logits_q):
    lp = jax.nn.log_softmax(jnp.asarray(logits_p, jnp.float32))
    lq = jax.nn.log_softmax(jnp.asarray(logits_q, jnp.float32))
    return jnp.sum(jnp.exp(lp) * (lp - lq))
''', "trusted_jax_kl")

#: A different objective term with the same signature (twice the trusted one): a loss, or gradients,
#: that follow it use the argument.
SCALED_JAX_SURROGATE = Source('''
def scaled_jax_surrogate(ratio, advantage, epsilon=0.2):
    return 2.0 * jnp.minimum(ratio * advantage, jnp.clip(ratio, 1.0 - epsilon, 1.0 + epsilon) * advantage)
''', "scaled_jax_surrogate")

#: A different KL with the same signature (twice the trusted one): a loss that follows it calls its
#: ``kl`` argument, not the notebook's own ``kl_divergence``.
SCALED_JAX_KL = Source('''
def scaled_jax_kl(logits_p, logits_q):
    lp = jax.nn.log_softmax(jnp.asarray(logits_p, jnp.float32))
    lq = jax.nn.log_softmax(jnp.asarray(logits_q, jnp.float32))
    return 2.0 * jnp.sum(jnp.exp(lp) * (lp - lq))
''', "scaled_jax_kl")


def _fresh_ratios(rng, eps, n):
    """n ratios at least 0.02 away from the kinks 1 +/- eps, with advantages of both signs."""
    r = rng.uniform(0.2, 2.2, 8 * n)
    r = r[(np.abs(r - (1 + eps)) > 0.02) & (np.abs(r - (1 - eps)) > 0.02)][:n]
    a = rng.choice([-1.0, 1.0], n) * rng.uniform(0.3, 2.0, n)
    r[0], a[0] = 1 + eps + rng.uniform(0.1, 1.0), rng.uniform(0.3, 2.0)       # clipped, A > 0
    r[1], a[1] = (1 - eps) * rng.uniform(0.1, 0.85), -rng.uniform(0.3, 2.0)  # clipped, A < 0
    r[2], a[2] = 1 + eps + rng.uniform(0.1, 1.0), -rng.uniform(0.3, 2.0)     # not clipped: bad action grew
    r[3], a[3] = 1 + eps * rng.uniform(-0.8, 0.8), rng.choice([-1.0, 1.0]) * rng.uniform(0.3, 2.0)  # in band
    mid = (eps + 0.2) / 2  # between this epsilon and the default 0.2: decides whether epsilon was used
    r[4], a[4] = 1 + mid, rng.uniform(0.3, 2.0)
    r[5], a[5] = 1 - mid, -rng.uniform(0.3, 2.0)
    return r.astype(np.float32), a.astype(np.float32)


@register("test_surrogate_gradients", task="Task 2.5", needs=("surrogate_gradients",), assignment=A,
          notebook=NB2)
def surrogate_gradients(student, rng, ref):
    """d term_i / d ratio_i on fresh cases and a fresh epsilon: exactly 0 where the clip binds, A elsewhere;
    then with another surrogate passed in (twice the trusted one: the gradients must follow the argument)."""
    n = 12
    eps = float(rng.choice([rng.uniform(0.1, 0.15), rng.uniform(0.26, 0.35)]))  # away from the default 0.2
    r, a = _fresh_ratios(rng, eps, n)
    lo, hi = 1 - eps, 1 + eps
    bound = ((a > 0) & (r > hi)) | ((a < 0) & (r < lo))
    want = np.where(bound, 0.0, a.astype(np.float64))
    got = to_float(student.call("surrogate_gradients", Jax(r), Jax(a), epsilon=eps, surrogate=TRUSTED_JAX_SURROGATE),
                   "surrogate_gradients result")
    check(got.shape == (n,), f"surrogate_gradients must return one gradient per case ({n} here), got an array "
                             f"of shape {got.shape}.")
    hint = ""
    if matches(got, surrogate_np(r, a, eps)):
        hint = "Those are the objective values; return their derivatives with respect to the ratio (jax.grad)."
    elif matches(got, a):
        hint = ("Every case got its advantage: the terms where the clip binds must have gradient exactly 0 "
                "(differentiate surrogate(ratio, advantage, epsilon), with the epsilon argument).")
    elif matches(got, want / n):
        hint = ("Divided by the number of cases: differentiate each term with respect to its own ratio "
                "(jax.vmap(jax.grad(...)) or the gradient of the SUM), not the mean.")
    elif matches(got, -want):
        hint = "The sign is flipped: return d term / d ratio of the objective (to be maximised), not of a loss."
    close(got, want, f"surrogate_gradients on fresh cases (epsilon={eps:.4f})", hint=hint, atol=1e-5)
    equal(got[bound], np.zeros(int(bound.sum())), "gradient where the clip binds (fresh cases)",
          hint="Where the clip binds the clipped product is constant in the ratio: its gradient is exactly 0.")
    # another surrogate passed in (twice the trusted one): every gradient doubles (at least two are A != 0)
    scaled = to_float(student.call("surrogate_gradients", Jax(r), Jax(a), epsilon=eps, surrogate=SCALED_JAX_SURROGATE),
                      "surrogate_gradients result")
    own = ("The gradients did not change when another surrogate was passed in: differentiate the surrogate "
           "argument, not clipped_surrogate or ppo_surrogate (the tests pass their own function).")
    check(not matches(scaled, got), "surrogate_gradients: " + own)
    close(scaled, 2.0 * want, f"surrogate_gradients with another surrogate passed in (twice the clipped objective, "
          f"epsilon={eps:.4f})", hint=own, atol=1e-5)


def _trusted_loss(logits, old_logp, actions, advantages, ref_logits, beta, epsilon, scale=1.0):
    import jax
    import jax.numpy as jnp

    logp = jax.nn.log_softmax(logits)
    ratio = jnp.exp(logp[actions] - old_logp)
    terms = jnp.minimum(ratio * advantages, jnp.clip(ratio, 1 - epsilon, 1 + epsilon) * advantages)
    lr = jax.nn.log_softmax(ref_logits)
    return -scale * jnp.mean(terms) + beta * jnp.sum(jnp.exp(logp) * (logp - lr))


def _batch(rng, n, size, eps, all_clipped):
    """A fresh batch: logits, old log-probabilities of the sampled actions, actions, advantages, reference logits."""
    import jax
    import jax.numpy as jnp

    for _ in range(200):
        logits = rng.normal(0.0, 1.2, n).astype(np.float32)
        old_logits = (logits + rng.normal(0.0, 1.0, n)).astype(np.float32)
        ratio_all = np.exp(np.asarray(jax.nn.log_softmax(jnp.asarray(logits)))
                           - np.asarray(jax.nn.log_softmax(jnp.asarray(old_logits))))
        far = np.flatnonzero((ratio_all > 1 + eps + 0.05) | (ratio_all < 1 - eps - 0.05))
        if all_clipped and (len(far) < 2 or not ((ratio_all[far] > 1).any() and (ratio_all[far] < 1).any())):
            continue
        actions = rng.choice(far if all_clipped else np.arange(n), size).astype(np.int32)
        r = ratio_all[actions]
        if all_clipped:
            adv = np.where(r > 1, 1.0, -1.0) * rng.uniform(0.3, 2.0, size)  # the side where the clip binds
        else:
            adv = rng.choice([-1.0, 1.0], size) * rng.uniform(0.3, 2.0, size)
            near = (np.abs(r - (1 + eps)) < 0.01) | (np.abs(r - (1 - eps)) < 0.01)
            if near.any():
                continue
        old_logp = np.asarray(jax.nn.log_softmax(jnp.asarray(old_logits)))[actions]
        ref_logits = rng.normal(0.0, 1.5, n).astype(np.float32)
        return logits, old_logp.astype(np.float32), actions, adv.astype(np.float32), ref_logits
    raise RuntimeError("grader self-check: no batch found")


@register("test_clipped_kl_loss", task="Task 2.6", needs=("clipped_kl_loss",), forbid=("categorical_kl",),
          assignment=A, notebook=NB2)
def clipped_kl_loss(student, rng, ref):
    """The loss and its jax.grad on a fresh mixed batch; on a fresh all-clipped batch the gradient is beta * grad KL."""
    import jax
    import jax.numpy as jnp

    n, size = 5, 12
    eps = float(rng.uniform(0.1, 0.3))
    beta = float(rng.uniform(0.05, 0.5))
    kw = {"epsilon": eps, "surrogate": TRUSTED_JAX_SURROGATE, "kl": TRUSTED_JAX_KL}

    def trusted(batch, scale=1.0, b=beta):
        args = [jnp.asarray(x) for x in batch] + [b, eps]
        return (float(_trusted_loss(*args, scale=scale)),
                np.asarray(jax.grad(_trusted_loss)(*args, scale=scale), np.float64))

    def ask(batch, **extra):
        lg, old, act, adv, rl = batch
        args = (Jax(lg), Jax(old), Jax(act), Jax(adv), Jax(rl), beta)
        value = student.call("clipped_kl_loss", *args, **{**kw, **extra})
        grad = student.grad("clipped_kl_loss", 0, *args, **{**kw, **extra})
        return to_float(value, "clipped_kl_loss result"), to_float(grad, "jax.grad of clipped_kl_loss")

    mixed = _batch(rng, n, size, eps, all_clipped=False)
    want_v, want_g = trusted(mixed)
    got_v, got_g = ask(mixed)
    check(got_v.shape == (), f"clipped_kl_loss must return a scalar loss, got an array of shape {got_v.shape}.")
    lg, old, act, adv, rl = (jnp.asarray(x) for x in mixed)
    lp = jax.nn.log_softmax(lg)
    sur = lambda ratio: jnp.mean(jnp.minimum(ratio * adv, jnp.clip(ratio, 1 - eps, 1 + eps) * adv))
    kl_pq = float(jnp.sum(jnp.exp(lp) * (lp - jax.nn.log_softmax(rl))))
    lq = jax.nn.log_softmax(rl)
    kl_qp = float(jnp.sum(jnp.exp(lq) * (lq - lp)))
    s = float(sur(jnp.exp(lp[act] - old)))
    hint = ""
    if matches(got_v, s + beta * kl_pq, rtol=1e-4):
        hint = "The loss is MINUS the surrogate (gradient descent minimises it): -mean(surrogate) + beta * KL."
    elif matches(got_v, -s - beta * kl_pq, rtol=1e-4):
        hint = "The KL penalty is ADDED to the loss (the loss is minimised): -mean(surrogate) + beta * KL."
    elif matches(got_v, -s, rtol=1e-4):
        hint = "The KL term is missing: add beta * kl(logits, ref_logits)."
    elif matches(got_v, -s + kl_pq, rtol=1e-4):
        hint = "beta was ignored: the KL must be multiplied by beta."
    elif matches(got_v, -s + beta * kl_qp, rtol=1e-4):
        hint = "KL direction reversed: call kl(logits, ref_logits), KL(policy || reference)."
    elif matches(got_v, -size * s + beta * kl_pq, rtol=1e-4):
        hint = "The surrogate is summed over the batch; PPO takes its MEAN."
    elif matches(got_v, -float(sur(jnp.exp(lg[act] - old))) + beta * kl_pq, rtol=1e-4):
        hint = ("The ratio was built from raw logits: use log_softmax(logits)[actions] - old_logp (old_logp "
                "holds log-probabilities).")
    elif matches(got_v, -float(sur(lp[act] - old)) + beta * kl_pq, rtol=1e-4):
        hint = "The ratio is exp(log pi(a) - old_logp), not the difference of the log-probabilities itself."
    close(got_v, want_v, f"clipped_kl_loss on a fresh batch (beta={beta:.4f}, epsilon={eps:.4f})", hint=hint,
          rtol=1e-4, atol=1e-5)
    close(got_g, want_g, "jax.grad of clipped_kl_loss with respect to logits on a fresh batch", rtol=1e-4, atol=1e-5)

    scaled_v, _ = trusted(mixed, scale=2.0)
    got_scaled, _ = ask(mixed, surrogate=SCALED_JAX_SURROGATE)
    close(got_scaled, scaled_v, "clipped_kl_loss with another surrogate passed in",
          hint="Call the surrogate argument (and the kl argument): the tests pass their own functions in.",
          rtol=1e-4, atol=1e-5)
    # another KL passed in (twice the trusted one): the penalty must follow the kl argument
    doubled_v, _ = trusted(mixed, b=2.0 * beta)
    lg, old, act, adv, rl = mixed
    got_kl = to_float(student.call("clipped_kl_loss", Jax(lg), Jax(old), Jax(act), Jax(adv), Jax(rl), beta,
                                   **{**kw, "kl": SCALED_JAX_KL}), "clipped_kl_loss result")
    own = ("The loss did not change when another kl was passed in: call the kl argument, not kl_divergence "
           "(the tests pass their own function).")
    check(not matches(got_kl, got_v, rtol=1e-4, atol=1e-5), "clipped_kl_loss: " + own)
    close(got_kl, doubled_v, "clipped_kl_loss with another kl passed in (twice the KL)", hint=own,
          rtol=1e-4, atol=1e-5)

    clipped = _batch(rng, n, size, eps, all_clipped=True)
    lg, old, act, adv, rl = (jnp.asarray(x) for x in clipped)
    zero_v, zero_g = trusted(clipped, b=0.0)
    check(bool(np.all(zero_g == 0.0)), "grader self-check (every term clipped)")
    kl_grad = beta * np.asarray(jax.grad(lambda l: jnp.sum(jnp.exp(jax.nn.log_softmax(l))
                                                           * (jax.nn.log_softmax(l) - jax.nn.log_softmax(rl))))(lg))
    _, got_g = ask(clipped)
    hint = ""
    if matches(got_g, np.zeros_like(kl_grad), atol=1e-7):
        hint = ("The gradient vanished: with every term clipped the surrogate's gradient is 0, but the loss must "
                "still carry beta * grad KL.")
    elif matches(got_g, kl_grad / beta, rtol=1e-4):
        hint = "beta was ignored: the KL gradient must be multiplied by beta."
    close(got_g, kl_grad, f"jax.grad of clipped_kl_loss on a fresh batch where every term is clipped "
                          f"(expected beta * grad KL, beta={beta:.4f})", hint=hint, rtol=1e-4, atol=1e-6)
