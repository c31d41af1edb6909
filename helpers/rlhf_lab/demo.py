"""``python -m rlhf_lab.demo`` (``make demo``): the instructor pipeline on the bundled example class.

Steps, all real nbgrader: regenerate ``release/`` (``generate_assignment``), collect
``examples/submissions/`` into ``submitted/``, autograde each student in its own process into
``autograded/``, generate feedback HTML into ``feedback/``, export ``grades.csv``, then print the
grade table per student and per test cell (read back from the gradebook).

By default it runs in the repository (outputs are gitignored). ``--workdir DIR`` copies the course
into DIR first and runs there, leaving the repository untouched.

``--resume`` continues an interrupted run: outputs and the gradebook are kept, and only students
whose run record (``.autograde_runs/``) does not say their nbgrader finished are graded; feedback,
the CSV and the tables then cover everyone.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from .instructor import pipeline


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m rlhf_lab.demo", description=__doc__.split("\n\n")[0])
    parser.add_argument("--workdir", type=Path, help="copy the course here and run on the copy")
    parser.add_argument("--submissions", type=Path,
                        help="folder of <student>/<assignment>/ submissions (default examples/submissions)")
    parser.add_argument("--assignment", action="append", dest="assignments",
                        help="only this assignment (repeatable; default every graded assignment)")
    parser.add_argument("--student", action="append", dest="students", help="only this student (repeatable)")
    parser.add_argument("--db", help="gradebook URL (default sqlite:///<root>/gradebook.db)")
    parser.add_argument("--resume", action="store_true",
                        help="continue an interrupted run: keep outputs, grade only unfinished students")
    args = parser.parse_args(argv)

    pipeline.ensure_venv_on_path()
    root = pipeline.course_root()
    db_url = args.db
    if args.workdir is not None:
        root = pipeline.copy_course(args.workdir, root)
        print(f"course copied to {root}")
        # a copy grades into its own gradebook unless --db says otherwise (never into an inherited
        # $RLHF_COURSE_DB, which may point at the repository's gradebook)
        db_url = db_url or "sqlite:///" + str(root / "gradebook.db")
    subs = (args.submissions or root / "examples" / "submissions").resolve()
    if not subs.is_dir():
        print(f"no submissions folder at {subs}: run tools/make_examples.py first", file=sys.stderr)
        return 2

    def progress(run):
        status = "ok" if run.ok else f"FAILED: {run.reason}"
        print(f"  autograded {run.assignment:<14} {run.student:<28} {run.seconds:6.1f} s  {status}", flush=True)
        for note in run.notes:
            print(f"      note: {note}", flush=True)

    start = time.perf_counter()
    print(f"course root {root}\ngradebook   {db_url or pipeline.default_db_url(root)}\nsubmissions {subs}")
    print("generate -> collect -> autograde (one nbgrader process per student) -> feedback -> export")
    resume = dict(fresh=False, force=False, regenerate=not _gradebook_has(root, db_url, args.assignments)) \
        if args.resume else {}
    result = pipeline.run_class(subs, root=root, db_url=db_url, names=args.assignments,
                                students=args.students, progress=progress, **resume)
    total = time.perf_counter() - start
    for (sid, a), why in sorted(result.collected.problems.items()):
        print(f"  not collected: {sid}/{a}: {why}")
    print()
    print(pipeline.format_tables(result.grades, result.runs))
    print()
    n_fb = sum(len(v) for v in result.feedback.values())
    print(f"feedback: {n_fb} student/assignment folders under {root / 'feedback'}")
    print(f"csv:      {result.csv_path}")
    print(f"report:   {root / pipeline.REPORT_NAME}")
    steps = ", ".join(f"{k} {v:.1f} s" for k, v in result.seconds.items())
    print(f"time:     {total:.1f} s in all ({steps})")
    return 0


def _gradebook_has(root: Path, db_url: str | None, names) -> bool:
    """Whether the gradebook already records every assignment to grade (else it must be generated)."""
    from nbgrader.api import Gradebook

    try:
        with Gradebook(db_url or pipeline.default_db_url(root), pipeline.COURSE_ID) as gb:
            for name in names or pipeline.graded_assignments(root):
                gb.find_assignment(name)
        return True
    except Exception:  # noqa: BLE001 - no gradebook yet, or an assignment missing from it
        return False


if __name__ == "__main__":
    sys.exit(main())
