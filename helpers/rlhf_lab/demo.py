"""``python -m rlhf_lab.demo`` (``make demo``): one week of the class, on the bundled example students.

Steps, all real nbgrader, the way a class runs:

1. ``generate_assignment`` (``release/`` and the gradebook), then the roster
   ``examples/roster.csv`` through ``nbgrader db student import`` (names in Formgrader and the CSV);
2. ``release_assignment`` into the course's exchange (``<root>/exchange`` or ``$RLHF_EXCHANGE``);
3. every bundled student (``examples/submissions/<student>/<assignment>/``) hands in through
   nbgrader's own submit, as that student (``nbgrader submit --student``), from a folder of
   their own; then ``collect`` copies the latest submission of each into ``submitted/``;
4. autograde each student in its own process into ``autograded/``, generate feedback HTML into
   ``feedback/`` (notebooks with written answers still waiting for a human are held back unless
   ``--release-pending-feedback``), ``release_feedback`` into the exchange, export ``grades.csv``;
5. print the grade table per student and per test cell (read back from the gradebook).

By default it runs in the repository (outputs are gitignored). ``--workdir DIR`` copies the course
into DIR first and runs there, leaving the repository untouched. Only the bundled students'
earlier submissions are removed from the exchange; anyone else's stay.

``--resume`` continues an interrupted run: outputs and the gradebook are kept, and only students
whose run record (``.autograde_runs/``) does not say their nbgrader finished are graded; feedback,
the CSV and the tables then cover everyone.
"""
from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from pathlib import Path

from .instructor.classrun import pipeline


def _incomplete_note(csv_path) -> str:
    """How many rows of grades.csv are incomplete (its ``pending_manual_points``), as a note; "" when none."""
    import csv

    with open(csv_path, newline="", encoding="utf-8") as fh:
        rows = list(csv.DictReader(fh))
    waiting = sum(1 for r in rows if float(r.get("pending_manual_points") or 0) > 0)
    if not waiting:
        return ""
    return (f" ({waiting} of {len(rows)} scores still wait for hand grading: column pending_manual_points; "
            "`make lms-export` leaves them blank)")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m rlhf_lab.demo", description=__doc__.split("\n\n")[0])
    parser.add_argument("--workdir", type=Path, help="copy the course here and run on the copy")
    parser.add_argument("--submissions", type=Path,
                        help="folder of <student>/<assignment>/ submissions (default examples/submissions)")
    parser.add_argument("--assignment", action="append", dest="assignments",
                        help="only this assignment (repeatable; default every graded assignment)")
    parser.add_argument("--student", action="append", dest="students", help="only this student (repeatable)")
    parser.add_argument("--db", help="gradebook URL (default sqlite:///<root>/gradebook.db)")
    parser.add_argument("--roster", type=Path, help="roster CSV to import (default examples/roster.csv)")
    parser.add_argument("--resume", action="store_true",
                        help="continue an interrupted run: keep outputs, grade only unfinished students")
    parser.add_argument("--release-pending-feedback", action="store_true",
                        help="also write and release feedback for notebooks whose written answers are "
                             "not graded yet (they say 'awaiting grading')")
    args = parser.parse_args(argv)

    from .instructor.operations import exchange, roster

    pipeline.ensure_venv_on_path()
    root = pipeline.course_root()
    db_url = args.db
    if args.workdir is not None:
        root = pipeline.copy_course(args.workdir, root)
        print(f"course copied to {root}")
        # a copy grades into its own gradebook and exchange unless told otherwise (never into an
        # inherited $RLHF_COURSE_DB / $RLHF_EXCHANGE, which may be the repository's)
        db_url = db_url or "sqlite:///" + str(root / "gradebook.db")
    ex_root = (root / "exchange") if args.workdir is not None else exchange.exchange_root(root)
    try:  # before anything is cleaned or generated: a refused exchange changes nothing
        # a system folder is used only when it already exists (an administrator made it the exchange)
        exchange.ensure_exchange(path=ex_root, allow_system=ex_root.is_dir())
    except exchange.ExchangeError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    subs = (args.submissions or root / "examples" / "submissions").resolve()
    if not subs.is_dir():
        print(f"no submissions folder at {subs}: run tools/make_examples.py first", file=sys.stderr)
        return 2
    db_url = db_url or pipeline.default_db_url(root)
    names = args.assignments or pipeline.graded_assignments(root)

    def progress(run):
        status = "ok" if run.ok else f"FAILED: {run.reason}"
        print(f"  autograded {run.assignment:<16} {run.student:<28} {run.seconds:6.1f} s  {status}", flush=True)
        for note in run.notes:
            print(f"      note: {note}", flush=True)

    start = time.perf_counter()
    print(f"course root {root}\ngradebook   {db_url}\nexchange    {ex_root}\nsubmissions {subs}")
    print("generate -> roster -> release -> students submit -> collect -> autograde (one nbgrader process "
          "per student) -> feedback -> export")
    steps = {}
    resume = args.resume and bool(pipeline.already_submitted(root, names, args.students).collected) \
        and _gradebook_has(root, db_url, names)
    if not resume:
        pipeline.check_config(root, db_url)
        pipeline.clean_outputs(root)
        t = time.perf_counter()
        pipeline.generate(root, pipeline.assignments(root), db_url)
        steps["generate"] = time.perf_counter() - t
        t = time.perf_counter()
        roster_file = (args.roster or root / "examples" / "roster.csv").resolve()
        roster.import_roster(roster_file, root, db_url)
        print(f"roster:     {len(roster.gradebook_students(root, db_url))} students imported from {roster_file.name} "
              "(nbgrader db student import)")
        steps["roster"] = time.perf_counter() - t
        t = time.perf_counter()
        try:
            problems = hand_in(subs, names, args.students, root, db_url, ex_root)
        except exchange.ExchangeError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
        steps["exchange"] = time.perf_counter() - t
        for why in problems:
            print(f"  not submitted: {why}")
    result = pipeline.run_class(None, root=root, db_url=db_url, names=names, students=args.students,
                                progress=progress, fresh=False, regenerate=False, force=not resume,
                                release_pending_feedback=args.release_pending_feedback)
    t = time.perf_counter()
    released = 0
    for a in names:
        if result.feedback.get(a):
            exchange.release_feedback(a, root, db_url, ex_root)
            released += len(result.feedback[a])
    steps["release feedback"] = time.perf_counter() - t
    total = time.perf_counter() - start
    for (sid, a), why in sorted(result.collected.problems.items()):
        print(f"  not collected: {sid}/{a}: {why}")
    print()
    print(pipeline.format_tables(result.grades, result.runs))
    print()
    n_fb = sum(len(files) for v in result.feedback.values() for files in v.values())
    held = {a: pipeline.held_feedback(a, root, db_url) for a in names}
    n_held = sum(len(nbs) for v in held.values() for nbs in v.values())
    print(f"feedback: {n_fb} notebooks under {root / 'feedback'}, released to {released} student/assignment "
          f"folders in the exchange")
    if n_held and not args.release_pending_feedback:
        print(f"held:     {n_held} notebooks with written answers awaiting hand grading (grade them in "
              "Formgrader, then release; --release-pending-feedback releases them now)")
    print(f"csv:      {result.csv_path}{_incomplete_note(result.csv_path)}")
    print(f"report:   {root / pipeline.REPORT_NAME}")
    seconds = {**steps, **{k: v for k, v in result.seconds.items() if k not in steps}}
    print(f"time:     {total:.1f} s in all ({', '.join(f'{k} {v:.1f} s' for k, v in seconds.items())})")
    return 0


def hand_in(subs: Path, names, students, root: Path, db_url: str, ex_root: Path) -> list[str]:
    """Release each assignment into the exchange, submit every student's folder through nbgrader
    as that student, and collect: ``submitted/`` then holds what nbgrader collected. Returns the
    problems (a student whose submission nbgrader refused is named and skipped)."""
    from .instructor.operations import exchange

    exchange.ensure_exchange(path=ex_root, allow_system=ex_root.is_dir())
    wanted = set(students) if students else None
    everyone = sorted(p.name for p in subs.iterdir() if p.is_dir() and (wanted is None or p.name in wanted))
    exchange.forget_students(everyone, root, ex_root)
    problems = []
    with tempfile.TemporaryDirectory(prefix="rlhf-demo-students-") as tmp:
        for a in names:
            exchange.release(a, root, db_url, ex_root)
            homes = {}
            for sid in everyone:
                if (subs / sid / a).is_dir():
                    home = Path(tmp) / sid
                    shutil.copytree(subs / sid / a, home / a,
                                    ignore=shutil.ignore_patterns(".ipynb_checkpoints", "__pycache__"))
                    homes[sid] = home
            for sid, why in exchange.submit_many(a, homes, root, ex_root).items():
                if why:
                    problems.append(why)
            exchange.collect(a, root, db_url, ex_root, check_owner=False)
    return problems


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
