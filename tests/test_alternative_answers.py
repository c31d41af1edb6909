"""Every judged check gives full marks to every correct answer, however it is written.

The answers of ``tests/fixtures/alternative_answers.py`` are written from the task statements in
six styles (NumPy float32, NumPy float64, plain Python loops, JAX with two different reduction
orders, and JAX written with the transforms: ``jax.vmap`` of the grader's stand-in functions,
``jax.jit``, ``jax.lax.scan``, ``.at[...]`` updates). Each check of :data:`rlhf_lab.judging.CHECKS` runs in-process against each
style, on many grader seeds; a check that fails a correct answer on any seed is a grading bug
(an expected value computed in a lower precision than the answer, a tolerance below float32
rounding, an exact comparison where rounding is legal).

The default run uses :data:`FAST_SEEDS`; the ``slow`` run uses :data:`ALL_SEEDS`, 100 grader seeds.
Every seed's check runs for real, but a call it makes with exactly the arguments of an earlier seed
(the lesson's recorded run, the lesson's reward fit: parts of a check that do not depend on the
grader's seed) is answered from that earlier call (:class:`RepeatingStudent`): the answers are pure
functions, so the result is the same, and the fresh part of each seed is what the 100 seeds are for.

Combinations where a NumPy answer is not possible (the check takes ``jax.grad`` of the answer, or
the statement prescribes it) are skipped with the reason; every task has at least three styles.

The classic mistakes of ``alternative_answers.MISTAKES`` (a correct namespace with one wrong answer)
must lose the points of their check on every one of the same seeds, with the message that names them.
"""
from __future__ import annotations

import copy

import numpy as np
import pytest

from fixtures import alternative_answers as alt
from rlhf_lab.judging import CHECKS, core
from rlhf_lab.judging.core import GradingError, Jax, Key, LocalStudent, Source

REF = core.library_reference()
FAST_SEEDS = range(4)  # the fast part: a smoke run; the slow part runs ALL_SEEDS
ALL_SEEDS = range(100)
NAMES = sorted(CHECKS)


def _key(value):
    """A hashable key that is equal for two arguments exactly when a pure function must answer them alike."""
    kind = type(value)
    if kind is np.ndarray:
        return ("nd", value.dtype.str, value.shape, value.tobytes())
    if kind is Jax:
        return ("jax", _key(value.value))
    if kind is Key:
        return ("key", value.seed)
    if kind is Source:
        return ("source", value.name, value.source)
    if kind in (tuple, list):
        return (kind.__name__, *map(_key, value))
    if kind is dict:
        return ("dict", *sorted((k, _key(v)) for k, v in value.items()))
    if value is None or kind in (bool, int, float, str, np.float32, np.float64, np.int32, np.int64, np.bool_):
        return (kind.__name__, repr(value))
    raise TypeError(f"no key for an argument of type {kind.__name__}")


class RepeatingStudent(LocalStudent):
    """A :class:`LocalStudent` that answers a call repeated with identical arguments from the first one.

    One per (check, style) over all seeds. The cached answers are the plain data the first call
    returned, copied for every use; ``value`` and anything whose arguments differ run for real. A
    function a check writes (a :class:`~rlhf_lab.judging.core.Source`, such as the grader's rollout
    update handed to ``run_ppo``) is built once, so its compiled gradient serves every seed.
    """

    def __init__(self, namespace: dict):
        super().__init__(namespace)
        self.answers: dict = {}
        self.built = {}

    def _once(self, key, compute, *args, **kwargs):
        if key not in self.answers:
            self.answers[key] = compute(*args, **kwargs)
        return copy.deepcopy(self.answers[key])

    def call(self, name, *args, **kwargs):
        return self._once(("call", name, _key(args), _key(kwargs)), super().call, name, *args, **kwargs)

    def grad(self, name, argnums, *args, **kwargs):
        return self._once(("grad", name, _key(argnums), _key(args), _key(kwargs)), super().grad, name, argnums,
                          *args, **kwargs)

    def scenario(self, source, needs, *args, **kwargs):
        return self._once(("scenario", _key(source), tuple(needs), _key(args), _key(kwargs)), super().scenario,
                          source, needs, *args, **kwargs)


def _skip_reason(name: str, style: str) -> str | None:
    """Why ``style`` cannot answer the task of ``name`` (None when it can)."""
    if style not in alt.JAX_STYLES and name in alt.NEEDS_JAX:
        return f"{style} is not applicable to {name}: {alt.NEEDS_JAX[name]}"
    return None


def _grade(name: str, style: str, seeds) -> list[str]:
    """The failures (seed and the student's message) of the check ``name`` on ``style``'s answers."""
    check = CHECKS[name]
    failures = []
    student = RepeatingStudent(alt.namespace(style, check.assignment))
    for seed in seeds:
        try:
            check.run(student, np.random.default_rng(seed), REF)
        except GradingError as err:
            failures.append(f"seed {seed}: {err}")
    return failures


def _require_full_marks(name: str, style: str, seeds) -> None:
    reason = _skip_reason(name, style)
    if reason:
        pytest.skip(reason)
    failures = _grade(name, style, seeds)
    assert not failures, (f"{name} fails a correct {style} answer on {len(failures)} of {len(seeds)} grader "
                          f"seeds; first failures:\n" + "\n".join(failures[:3]))


@pytest.mark.parametrize("style", alt.STYLES)
@pytest.mark.parametrize("name", NAMES)
def test_correct_answers_get_full_marks(name, style):
    _require_full_marks(name, style, FAST_SEEDS)


@pytest.mark.slow
@pytest.mark.parametrize("style", alt.STYLES)
@pytest.mark.parametrize("name", NAMES)
def test_correct_answers_get_full_marks_on_100_seeds(name, style):
    _require_full_marks(name, style, ALL_SEEDS)


def test_every_check_is_answered_by_every_style_that_can():
    """No check is left out: each one has a JAX answer in every JAX style, and every NumPy skip has a reason."""
    for name, check in CHECKS.items():
        for style in alt.STYLES:
            ns = alt.namespace(style, check.assignment)
            missing = [n for n in check.needs if n not in ns]
            if _skip_reason(name, style) is None:
                assert not missing, f"{style} answers of {check.assignment} lack {missing} for {name}"
    assert set(alt.NEEDS_JAX) <= set(CHECKS), sorted(set(alt.NEEDS_JAX) - set(CHECKS))


def test_the_styles_really_differ():
    """The float32 and float64 answers round differently (else the suite would test one answer five times)."""
    scores = np.random.default_rng(0).normal(size=(4, 7)).astype(np.float32)
    outs = {s: np.asarray(alt.namespace(s, "a3_ppo_sequences")["whiten"](scores, np.ones_like(scores)), np.float64)
            for s in alt.STYLES}
    assert outs["np32"].dtype == np.float64 and not np.array_equal(outs["np32"], outs["np64"])
    assert np.allclose(outs["np32"], outs["np64"], atol=1e-5)


def test_every_task_has_three_styles_including_numpy64_loops_and_transforms():
    """At least three styles answer each check; NumPy float64 and loops unless a skip reason says why not."""
    for name in NAMES:
        styles = [s for s in alt.STYLES if _skip_reason(name, s) is None]
        assert len(styles) >= 3 and "jax_vmap" in styles, (name, styles)
        assert {"np64", "loop"} <= set(styles) or name in alt.NEEDS_JAX, (name, styles)


def _mistake_escapes(key: str, seeds) -> list[str]:
    """The seeds on which the mistake ``key`` keeps its points or is told with another message."""
    name, _assignment, message, _replace = alt.MISTAKES[key]
    student = RepeatingStudent(alt.mistake_namespace(key))
    escapes = []
    for seed in seeds:
        try:
            CHECKS[name].run(student, np.random.default_rng(seed), REF)
        except GradingError as err:
            if message is not None and message not in str(err):
                escapes.append(f"seed {seed}: told {str(err)[:300]!r}")
        except Exception as exc:  # noqa: BLE001 - the grader reports an answer's exception and gives 0
            if message is not None:
                escapes.append(f"seed {seed}: raised {type(exc).__name__}: {exc}"[:300])
        else:
            escapes.append(f"seed {seed}: full marks")
    return escapes


def _require_caught(key: str, seeds) -> None:
    escapes = _mistake_escapes(key, seeds)
    assert not escapes, (f"{key!r} is not caught by {alt.MISTAKES[key][0]} with {alt.MISTAKES[key][2]!r} on "
                         f"{len(escapes)} of {len(seeds)} grader seeds:\n" + "\n".join(escapes[:3]))


@pytest.mark.parametrize("key", sorted(alt.MISTAKES))
def test_classic_mistakes_lose_points(key):
    _require_caught(key, FAST_SEEDS)


@pytest.mark.slow
@pytest.mark.parametrize("key", sorted(alt.MISTAKES))
def test_classic_mistakes_lose_points_on_100_seeds(key):
    _require_caught(key, ALL_SEEDS)
