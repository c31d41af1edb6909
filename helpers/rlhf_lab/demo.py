"""``python -m rlhf_lab.demo`` (``make demo``): one week of the class, on the bundled example students.

It runs in a scratch copy of the course, ``course_run/`` in the course root (gitignored; the copy
is made anew on every run and says so on its first line): the course's own gradebook, exchange,
``release/``, ``submitted/``, ``autograded/``, ``feedback/``, ``grades.csv`` and compile-cache seeds
are left exactly as they were, so the instructor's real week (README) starts clean. The demo's
results stay in the copy: its gradebook, exchange, feedback, ``grades.csv`` and grading report,
open them there (``make lab`` shows the folder). ``--workdir DIR`` copies the course into DIR
instead; ``--in-place`` runs in the course itself (its outputs replaced, as an instructor's week
does).

Steps, all real nbgrader, the way a class runs:

1. ``generate_assignment`` (``release/`` and the gradebook), then the roster
   ``examples/roster.csv`` through ``nbgrader db student import`` (names in Formgrader and the CSV);
2. ``release_assignment`` into the course's exchange (``<root>/exchange`` or ``$RLHF_EXCHANGE``
   in place; the copy's own ``exchange/`` in a copy);
3. every bundled student (``examples/submissions/<student>/<assignment>/``) hands in through
   nbgrader's own submit, as that student (``nbgrader submit --student``), from a folder of
   their own; then ``collect`` copies the latest submission of each into ``submitted/``;
4. the compile-cache seeds that are missing are built (several assignments at a time), then the
   whole class is autograded on a pool of ``--workers`` processes (default: the usable cores; a
   Dask LocalCluster, ``--workers 1`` the sequential loop; the same grades either way), one
   ``nbgrader autograde`` per student and assignment, into ``autograded/``; feedback HTML into
   ``feedback/`` (notebooks with written answers still waiting for a human are held back unless
   ``--release-pending-feedback``), ``release_feedback`` into the exchange, export ``grades.csv``;
5. print the grade table per student and per test cell (read back from the gradebook): autograded
   points apart from the hand-graded points still pending, and a reason for anything the
   pre-flight did or that went wrong.

Every phase is announced on stdout with what it does and an estimate, and shows a progress bar
on stderr while it runs (only on a terminal, or with ``RLHF_PROGRESS=1`` / ``--progress``).
Only the bundled students' earlier submissions are removed from the exchange; anyone else's stay.

``--resume`` continues an interrupted run (in the same copy): outputs and the gradebook are kept,
and only students whose run record (``.autograde_runs/``) does not say their nbgrader finished are
graded; feedback, the CSV and the tables then cover everyone.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

from .instructor.classrun import pipeline
from .instructor.classrun import progress as progress_mod

#: The scratch copy the demo runs in by default, in the course root (gitignored).
DEFAULT_WORKDIR = "course_run"
#: The file that says a folder is the demo's own copy (the demo deletes only such a folder).
MARKER = ".rlhf-demo-copy"


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


def _seed_folders(root: Path) -> dict:
    from .instructor.grader import compile_cache

    base = root / compile_cache.SEED_DIR
    return {p.name: p for p in sorted(base.iterdir()) if p.is_dir() and not p.is_symlink()} if base.is_dir() else {}


def scratch_copy(course: Path, dest: Path) -> Path:
    """A fresh copy of the course at ``dest`` for the demo (only ``dest`` is written).

    ``dest`` must be missing, empty or an earlier copy of the demo (it holds :data:`MARKER`);
    anything else is refused. An earlier copy is emptied except for its compile-cache seeds, then the
    course is copied in (:func:`.pipeline.copy_course`: config, ``source/``, ``release/``,
    ``examples/``; no output). Seeds: the copy keeps an earlier run's seed while it is up to date,
    else takes the course's, so a second demo does not build them again and the course's
    ``.cache/`` is only read.
    """
    dest = Path(os.path.abspath(dest))
    if dest.is_symlink() or (dest.exists() and not dest.is_dir()):
        raise pipeline.PipelineError(f"{dest} is not a folder: move it away or pass --workdir")
    if dest.is_dir() and any(dest.iterdir()) and not (dest / MARKER).is_file():
        raise pipeline.PipelineError(f"{dest} exists and is not a copy made by the demo (no {MARKER} in it): "
                                     "move it away or pass --workdir")
    if dest.is_dir():
        for child in list(dest.iterdir()):
            if child.name == ".cache" and child.is_dir() and not child.is_symlink():
                continue
            shutil.rmtree(child) if child.is_dir() and not child.is_symlink() else child.unlink()
    include = tuple(n for n in pipeline.COURSE_FILES if n != ".cache")
    root = pipeline.copy_course(dest, course, include=include)
    kept = _seed_folders(root)
    for name, seed in _seed_folders(course).items():
        if name in kept and pipeline._seed_is_fresh(root, name):
            continue
        if name in kept:
            shutil.rmtree(kept[name])
        shutil.copytree(seed, root / seed.relative_to(course), symlinks=True)
    (root / MARKER).write_text("A scratch copy of the course made by `make demo` (python -m rlhf_lab.demo); "
                               "the next demo replaces it.\n")
    return root


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m rlhf_lab.demo", description=__doc__.split("\n\n")[0])
    where = parser.add_mutually_exclusive_group()
    where.add_argument("--workdir", type=Path,
                       help=f"copy the course here and run on the copy (default <course>/{DEFAULT_WORKDIR})")
    where.add_argument("--in-place", action="store_true",
                       help="run in the course itself: its gradebook, exchange and outputs are replaced")
    parser.add_argument("--submissions", type=Path,
                        help="folder of <student>/<assignment>/ submissions (default examples/submissions)")
    parser.add_argument("--assignment", action="append", dest="assignments",
                        help="only this assignment (repeatable; default every graded assignment)")
    parser.add_argument("--student", action="append", dest="students", help="only this student (repeatable)")
    parser.add_argument("--db", help="gradebook URL (default sqlite:///<root>/gradebook.db)")
    parser.add_argument("--roster", type=Path, help="roster CSV to import (default examples/roster.csv)")
    parser.add_argument("--workers", type=int, default=None,
                        help=f"grading processes at a time (default: the usable cores, here "
                             f"{pipeline.default_workers()}; 1: one student after another)")
    parser.add_argument("--progress", action="store_true", default=None,
                        help="draw the progress bars on stderr even when it is not a terminal")
    parser.add_argument("--resume", action="store_true",
                        help="continue an interrupted run: keep outputs, grade only unfinished students")
    parser.add_argument("--release-pending-feedback", action="store_true",
                        help="also write and release feedback for notebooks whose written answers are "
                             "not graded yet (they say 'awaiting grading')")
    args = parser.parse_args(argv)
    if args.workers is not None and args.workers < 1:
        print("error: --workers must be at least 1", file=sys.stderr)
        return 2
    workers = args.workers or pipeline.default_workers()

    from .instructor.operations import exchange, roster

    pipeline.ensure_venv_on_path()
    course = pipeline.course_root()
    rep = progress_mod.Reporter(bars=True if args.progress else None)
    start = time.perf_counter()
    root = course
    db_url = args.db
    copy = not args.in_place
    if copy:
        dest = args.workdir if args.workdir is not None else course / DEFAULT_WORKDIR
        resume_copy = args.resume and (Path(dest) / MARKER).is_file()
        try:
            if args.workdir is not None and not (Path(dest) / MARKER).is_file():
                with rep.phase("course copy", 1, unit="folder", estimate=2.0, what=f"into {Path(dest).resolve()}"):
                    root = pipeline.copy_course(dest, course)
                    (root / MARKER).write_text("A copy of the course made by `python -m rlhf_lab.demo --workdir`.\n")
            elif resume_copy:
                root = Path(dest).resolve()
            else:
                with rep.phase("course copy", 1, unit="folder", estimate=2.0,
                               what=f"a scratch copy at {Path(os.path.abspath(dest))}: the course is not touched"):
                    root = scratch_copy(course, Path(dest))
        except (pipeline.PipelineError, OSError) as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
        print(f"{'resuming in' if resume_copy else 'course copied to'} {root} (the demo's gradebook, exchange, "
              f"outputs and grades.csv are there; {course} itself is left as it was)")
        # a copy grades into its own gradebook and exchange unless told otherwise (never into an
        # inherited $RLHF_COURSE_DB / $RLHF_EXCHANGE, which may be the course's)
        db_url = db_url or "sqlite:///" + str(root / "gradebook.db")
    ex_root = (root / "exchange") if copy else exchange.exchange_root(root)
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
    # the seeds need only source/: with a pool they are built from now on, alongside the steps below
    seeds = pipeline.SeedBuild(root, names, workers)
    try:
        return _week(args, rep, root, db_url, ex_root, subs, names, workers, seeds, start, copy)
    finally:
        seeds.close()


def _week(args, rep, root: Path, db_url: str, ex_root: Path, subs: Path, names, workers: int,
          seeds, start: float, copy: bool) -> int:
    """The demo's week once its course and exchange are settled (see the module docstring)."""
    from .instructor.operations import exchange, roster

    def progress(run):
        status = "ok" if run.ok else f"FAILED: {run.reason}"
        rep.write(f"  autograded {run.assignment:<16} {run.student:<28} {run.seconds:6.1f} s  {status}")
        for note in run.notes:
            rep.write(f"      note: {note}")

    print(f"course root {root}\ngradebook   {db_url}\nexchange    {ex_root}\nsubmissions {subs}")
    print(f"generate -> roster -> release -> students submit -> collect -> compile-cache seeds -> autograde "
          f"(one nbgrader process per student, {workers} at a time) -> feedback -> export")
    steps = {}
    not_submitted: dict = {}
    resume = args.resume and bool(pipeline.already_submitted(root, names, args.students).collected) \
        and _gradebook_has(root, db_url, names)
    if not resume:
        pipeline.check_config(root, db_url)
        pipeline.clean_outputs(root)
        t = time.perf_counter()
        every = pipeline.assignments(root)
        with rep.phase("generate", len(every), unit="assignment",
                       estimate=len(every) * pipeline.PRIOR_SECONDS["generate"],
                       what="nbgrader generate_assignment: release/ and the gradebook") as ph:
            for a in every:
                pipeline.generate(root, [a], db_url)
                ph.advance()
        steps["generate"] = time.perf_counter() - t
        t = time.perf_counter()
        roster_file = (args.roster or root / "examples" / "roster.csv").resolve()
        with rep.phase("roster", 1, unit="file", estimate=pipeline.PRIOR_SECONDS["generate"],
                       what=f"nbgrader db student import {roster_file.name}"):
            roster.import_roster(roster_file, root, db_url)
        print(f"roster:     {len(roster.gradebook_students(root, db_url))} students imported from {roster_file.name} "
              "(nbgrader db student import)")
        steps["roster"] = time.perf_counter() - t
        t = time.perf_counter()
        try:
            with rep.phase("hand in", len(names), unit="assignment", estimate=len(names) * 6.0,
                           what="release_assignment, every student's nbgrader submit, collect") as ph:
                not_submitted = hand_in(subs, names, args.students, root, db_url, ex_root,
                                        on_assignment=lambda a: ph.advance())
        except exchange.ExchangeError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
        steps["exchange"] = time.perf_counter() - t
        for why in not_submitted.values():
            print(f"  not submitted: {why}")
    result = pipeline.run_class(None, root=root, db_url=db_url, names=names, students=args.students,
                                progress=progress, fresh=False, regenerate=False, force=not resume,
                                release_pending_feedback=args.release_pending_feedback, workers=workers,
                                reporter=rep, seed_build=seeds)
    t = time.perf_counter()
    released = 0
    with rep.phase("release feedback", len(names), unit="assignment", estimate=len(names) * 3.0,
                   what="nbgrader release_feedback into the exchange") as ph:
        for a in names:
            if result.feedback.get(a):
                exchange.release_feedback(a, root, db_url, ex_root)
                released += len(result.feedback[a])
            ph.advance()
    steps["release feedback"] = time.perf_counter() - t
    total = time.perf_counter() - start
    for (sid, a), why in sorted(result.collected.problems.items()):
        print(f"  not collected: {sid}/{a}: {why}")
    reasons = result.reasons()
    for key, why in not_submitted.items():
        reasons.setdefault(key, []).append(why)
    print()
    print(pipeline.format_tables(result.grades, result.runs, reasons))
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
    if copy:
        print(f"results:  all in {root} (a scratch copy of the course; the next demo into the same folder "
              "replaces it)")
    seconds = {**steps, **{k: v for k, v in result.seconds.items() if k not in steps}}
    print(f"time:     {total:.1f} s in all, {workers} worker{'s' if workers != 1 else ''} "
          f"({', '.join(f'{k} {v:.1f} s' for k, v in seconds.items())})")
    report = json.loads((root / pipeline.REPORT_NAME).read_text())
    report["demo_seconds"] = {"total": round(total, 3), **{k: round(v, 3) for k, v in seconds.items()}}
    (root / pipeline.REPORT_NAME).write_text(json.dumps(report, indent=1, sort_keys=True) + "\n")
    return 0


def hand_in(subs: Path, names, students, root: Path, db_url: str, ex_root: Path, on_assignment=None) -> dict:
    """Release each assignment into the exchange, submit every student's folder through nbgrader
    as that student, and collect: ``submitted/`` then holds what nbgrader collected. Returns the
    problems, ``{(student, assignment): text}`` (a student whose submission nbgrader refused is
    named and skipped). ``on_assignment(a)`` is called after each assignment."""
    from .instructor.operations import exchange

    exchange.ensure_exchange(path=ex_root, allow_system=ex_root.is_dir())
    wanted = set(students) if students else None
    everyone = sorted(p.name for p in subs.iterdir() if p.is_dir() and (wanted is None or p.name in wanted))
    exchange.forget_students(everyone, root, ex_root)
    problems = {}
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
                    problems[(sid, a)] = why
            exchange.collect(a, root, db_url, ex_root, check_owner=False)
            if on_assignment is not None:
                on_assignment(a)
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
