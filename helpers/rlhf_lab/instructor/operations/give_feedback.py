"""``python -m rlhf_lab.instructor.operations.give_feedback ASSIGNMENT``: write feedback and return it to students.

Runs ``nbgrader generate_feedback`` (the course's filters: no hidden test, "awaiting grading"
instead of 0) and ``nbgrader release_feedback`` into the exchange, for every student of the
assignment. A notebook with a written answer nobody has graded yet is **held back**: its page is
not written, so it cannot be released, and the command lists it. Grade those answers in Formgrader
(Manual Grading, with ``guides/<assignment>.md`` open beside it) and run the command again;
``--release-pending`` hands them out now, saying "awaiting grading" where a score is missing.

Each page works offline: its math is typeset by the MathJax installed with the course
(``jupyter-server-mathjax``; JupyterLab's copy when the page is opened there, else the file on this
machine), the only script its Content-Security-Policy lets run, and long lines of outputs and
tracebacks wrap, so a diagnosis is never cut off (``grader/html_safety.py``, ``FeedbackExporter``).

Options: ``--no-release`` writes ``feedback/`` only (to read it first); ``--db`` another gradebook.
"""
from __future__ import annotations

import argparse
import sys

from . import exchange
from ..classrun import pipeline
from ..course import PipelineError, ensure_venv_on_path, graded_assignments


def give_feedback(assignment: str, root=None, db_url: str | None = None, release_pending: bool = False,
                  release: bool = True) -> dict:
    """Generate (holding back notebooks awaiting hand grading) and release feedback of ``assignment``.

    Returns ``{"written": {student: [html]}, "held": {student: [notebook]}, "released": bool,
    "refused": {student: [reasons]}}``: a student whose feedback folder holds a link, a FIFO or
    another file that is not plain (:func:`.exchange.unsafe_feedback`) is not released, and the
    others are.
    """
    if assignment not in graded_assignments(root):
        raise ValueError(f"assignment must be one of {graded_assignments(root)}, got {assignment!r}")
    if not isinstance(release, bool):
        raise TypeError(f"release must be True or False, got {release!r}")
    written = pipeline.feedback(assignment, root, db_url, release_pending=release_pending)
    held = {} if release_pending else pipeline.held_feedback(assignment, root, db_url)
    refused: dict = exchange.unsafe_feedback(assignment, root) if not release else {}
    if release and written:
        exchange.release_feedback(assignment, root, db_url, refused=refused)
    return {"written": written, "held": held, "released": bool(release and written), "refused": refused}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m rlhf_lab.instructor.operations.give_feedback",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("assignment")
    parser.add_argument("--release-pending", action="store_true",
                        help="also hand out notebooks whose written answers are not graded yet")
    parser.add_argument("--no-release", action="store_true", help="write feedback/ but do not release it")
    parser.add_argument("--db", help="gradebook URL (default the course's)")
    args = parser.parse_args(argv)
    ensure_venv_on_path()
    try:
        out = give_feedback(args.assignment, db_url=args.db, release_pending=args.release_pending,
                            release=not args.no_release)
    except (ValueError, PipelineError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    pages = sum(len(v) for v in out["written"].values())
    where = "released to the exchange" if out["released"] else "not released"
    print(f"{args.assignment}: feedback for {len(out['written'])} students ({pages} notebooks), {where}")
    for sid, nbs in sorted(out["held"].items()):
        print(f"  held, awaiting hand grading: {sid}: {', '.join(nbs)}")
    for sid, reasons in sorted(out["refused"].items()):
        print(f"  NOT released, files that are not plain: {'; '.join(reasons)}")
    if out["held"]:
        print("grade those answers in Formgrader (Manual Grading) and run this again, or pass --release-pending")
    return 0


if __name__ == "__main__":
    sys.exit(main())
