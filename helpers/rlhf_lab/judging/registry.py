"""The checks of every graded test cell, by the cell's grade id.

A test cell's hidden region is one line, ``grading.judge("<grade_id>")``; :data:`CHECKS` maps that
grade id to a :class:`Check`, whose ``run(student, rng, ref)`` raises
:class:`~rlhf_lab.judging.core.GradingError` with a message for the student, or returns ``None``
(full points). ``rng`` is a fresh NumPy generator (seeded by the grader at run time, so the inputs
cannot be predicted); ``ref`` holds the reference implementations of the library (a private copy
when the check runs in a kernel).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

#: Library functions a task may not delegate to; ``"*"`` forbids the whole library.
ALL = ("*",)


@dataclass(frozen=True)
class Check:
    """One hidden test: its grade id, the code that decides it, and what it touches."""

    name: str
    run: Callable
    task: str
    needs: tuple[str, ...]
    forbid: tuple[str, ...] = ()
    assignment: str = ""
    notebook: str = ""


CHECKS: dict[str, Check] = {}


def check(name: str, *, task: str, needs: tuple[str, ...], forbid: tuple[str, ...] = (),
          assignment: str, notebook: str):
    """Register the decorated ``run(student, rng, ref)`` as the check of the test cell ``name``."""
    def register(run: Callable) -> Callable:
        if name in CHECKS:
            raise ValueError(f"two checks are registered for the test cell {name!r}")
        CHECKS[name] = Check(name=name, run=run, task=task, needs=tuple(needs), forbid=tuple(forbid),
                             assignment=assignment, notebook=notebook)
        return run
    return register
