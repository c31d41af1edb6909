"""What a notebook's cells call in the student's kernel: ``grading.start()``, ``grading.judge(name)``
and ``grading.reference``.

Nothing here decides a grade. During autograding the hidden region of a test cell, the one line
``grading.judge("<grade id>")``, never runs in the kernel: the grader's judge
(:mod:`rlhf_lab.instructor.grader.judge`) runs the check registered under that grade id in its own
process, asks the kernel only for the outputs of the student's functions (over the wire bridge it
installs, :mod:`rlhf_lab.judging.wire`), computes gradients itself from the program a function
traces to (:mod:`rlhf_lab.judging.program`), and writes the verdict into the cell. The kernel is sandboxed and
gets a build of the library without the functions the notebook asks students to write. So this
module holds no defence against the notebook's own code: a student who rebinds something here
fools only the visible checks of their own notebook.

In a kernel this module is for people running a notebook themselves:

* :func:`start` is the locked first cell of every notebook. It binds :data:`reference`, the
  course library's reference functions the *visible* checks pass to students' functions (for
  example a trusted surrogate handed to a sweep).
* :func:`judge` runs the check in this kernel when the library here has the checks: an
  instructor running a source notebook, and the compile-cache seed build, which runs the source
  notebooks so that the compilations of the checks' shapes are cached for every student. A
  student's build has no checks, and :func:`judge` then says that the grader decides.
"""
from __future__ import annotations

import os
import types

import numpy as np

from . import ppo, reward

__all__ = ["GradingError", "start", "judge", "reference", "rng", "SEEDS"]


class GradingError(AssertionError):
    """Raised when a check fails; the message is written for the student."""


#: The course library's reference functions (every public function of :mod:`rlhf_lab.ppo`, plus
#: ``preference_loss`` and ``fit_reward`` of :mod:`rlhf_lab.reward` where this build has them),
#: bound by :func:`start`; ``None`` before it.
reference: types.SimpleNamespace | None = None

#: The seed of the latest :func:`rng` call per tag (to reproduce a check's fresh inputs).
SEEDS: dict[str, int] = {}


def _references() -> types.SimpleNamespace:
    """Public functions of ``ppo`` and the two reward functions, by name; a build that lacks one
    (the task of an open notebook is removed from a student's build) simply lacks that name."""
    fns = {name: value for name, value in vars(ppo).items()
           if not name.startswith("_") and isinstance(value, types.FunctionType)}
    fns.update({name: getattr(reward, name) for name in ("preference_loss", "fit_reward") if hasattr(reward, name)})
    return types.SimpleNamespace(**fns)


def start() -> None:
    """The first (locked) cell of every notebook: bind :data:`reference`. Idempotent."""
    global reference
    if reference is None:
        reference = _references()


def rng(tag: str = "") -> np.random.Generator:
    """A NumPy generator seeded from the OS at call time (fresh inputs on every run); the seed is
    kept in :data:`SEEDS` under ``tag``."""
    seed = int.from_bytes(os.urandom(8), "little")
    SEEDS[tag] = seed
    return np.random.default_rng(seed)


def _namespace() -> dict:
    """The notebook's namespace (IPython's ``user_ns``)."""
    from IPython import get_ipython

    shell = get_ipython()
    if shell is None:
        raise GradingError("grading.judge runs in a notebook kernel")
    return shell.user_ns


def judge(name: str) -> None:
    """Run the check of the test cell ``name`` here, on this notebook's functions.

    The check (:data:`rlhf_lab.judging.CHECKS`) draws fresh inputs from :func:`rng`, calls the
    notebook's functions directly (:class:`rlhf_lab.judging.core.LocalStudent`), computes the
    expected values with :data:`reference` and raises :class:`GradingError` with its message
    when they differ. In a student's build there are no checks: it raises, saying the grader decides.
    """
    try:
        from . import judging
    except ImportError:
        raise GradingError("the hidden tests are decided by the grader, outside this kernel (this kernel's "
                           "course library has no checks)") from None
    spec = judging.CHECKS.get(name)
    if spec is None:
        raise GradingError(f"no check is registered for the test cell {name!r} (course library out of date?)")
    start()
    try:
        spec.run(judging.core.LocalStudent(_namespace()), rng(name), reference)
    except judging.core.GradingError as exc:
        raise GradingError(str(exc)) from None
