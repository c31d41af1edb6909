"""Benchmark: one student's whole course (all nine graded notebooks), this tree against a baseline revision.

In one run, the correct example student (``ada_correct``) of every graded assignment is autograded
with the course's own task (``pipeline.autograde_student``: one ``nbgrader autograde A --student S
--force`` process, the default path: judge, sandbox, compile cache) by two code trees:

* ``baseline``: a git worktree of ``--baseline REV`` (default: the revision before the kernel side
  of grading was cut down), with its own copy of the course;
* ``current``: this working tree, with its own copy of the course.

Each tree runs in its own worker process whose ``rlhf_lab`` is that tree's (``PYTHONPATH`` put in
front of the venv's editable install), on the same venv. Each course copy is generated and collected
once, its compile-cache seeds are built and every assignment is autograded once, untimed, before
any timing (the steady state of a class: what every student after the first finds). Then, for every repeat, the
assignments are graded in turns (baseline then current, then current then baseline on the next
repeat), so the load other programs put on this shared machine falls on both alike. The report
gives the median seconds per assignment, the sum over the course and the ratio current / baseline,
and checks that both trees give the same grades, cell by cell.

Target (the course's issue): one student's course in at most two thirds of the baseline's time.

Every autograde runs with ``RLHF_TIMELINE`` set (:mod:`rlhf_lab.instructor.grader.timeline`), and
the report says where each tree's time goes: nbgrader's start-up and own work, the pre-flight, the
kernels' start and stop, the first cell (``import rlhf_lab`` and ``grading.start()``), the other
cells, and the judged cells (medians over the repeats). A baseline without the timeline gets only its
totals. Beside the wall clock, each autograde's CPU time (the nbgrader process and every process it
waited for: kernels, sandboxes) is reported, as core-seconds.

Usage: ``python bench/bench_student.py [--baseline REV] [--repeats N] [--assignments A ...]
[--out bench/results/student.md]``
"""
from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
STUDENT = "ada_correct"
#: main before the kernel side of grading was cut down to what the judge needs (issue 20)
DEFAULT_BASELINE = "c5c7f8c"
TARGET_RATIO = 2 / 3

#: Columns of the profile: (label, how it is computed from one autograde's timeline, see :func:`phases`).
PROFILE_COLUMNS = [
    ("whole autograde", "the nbgrader process's wall clock"),
    ("nbgrader start-up and own work", "the rest: interpreter and nbgrader start-up, copying, gradebook, writing"),
    ("pre-flight", "the course's pre-convert hook (files, integrity, rebinding, library-build plan)"),
    ("withheld-points overrides", "the post-convert hook"),
    ("kernel start and stop", "each notebook's time outside its cells: sandbox, scratch, compile-cache copy, kernel"),
    ("first cell", "`import rlhf_lab` and `grading.start()` (the locked first cell)"),
    ("other cells in the kernel", "given code, answers, experiments"),
    ("judged cells", "the judge: its checks and their requests to the kernel"),
]


def phases(timeline: list[dict], total: float) -> dict:
    """The :data:`PROFILE_COLUMNS` of one autograde from its timeline records (seconds)."""
    def tot(kind, pred=lambda r: True):
        return sum(r["seconds"] for r in timeline if r["phase"] == kind and pred(r))

    notebooks = tot("notebook")
    first_cells = 0.0
    # the first code cell of each notebook: the earliest code cell after each notebook's start
    starts = sorted(r["start"] for r in timeline if r["phase"] == "notebook")
    code_cells = sorted((r for r in timeline if r["phase"] == "cell" and r.get("code")), key=lambda r: r["start"])
    for start in starts:
        after = [r for r in code_cells if r["start"] >= start]
        if after:
            first_cells += after[0]["seconds"]
    cells = tot("cell")
    judged = tot("judged cell")
    pre, post = tot("pre-flight"), tot("overrides")
    return {
        "whole autograde": total,
        "nbgrader start-up and own work": total - notebooks - pre - post,
        "pre-flight": pre,
        "withheld-points overrides": post,
        "kernel start and stop": notebooks - cells - judged,
        "first cell": first_cells,
        "other cells in the kernel": cells - first_cells,
        "judged cells": judged,
    }


def load() -> str:
    return " / ".join(f"{x:.2f}" for x in os.getloadavg())


# ------------------------------------------------------------------------------------------ worker


def worker(tree: Path, course: Path, request: dict) -> dict:
    """Run one request in this process, whose ``rlhf_lab`` is ``tree``'s (see :func:`call_worker`)."""
    from rlhf_lab.instructor.classrun import pipeline
    from rlhf_lab.instructor.grader import compile_cache

    db = "sqlite:///" + str(course / "gradebook.db")
    if request["op"] == "setup":
        root = pipeline.copy_course(course, tree)
        pipeline.generate(root, db_url=db)
        pipeline.collect(tree / "examples" / "submissions", root, students=[STUDENT])
        seeds = {a: round(compile_cache.ensure_seed(root, a).seconds, 1) for a in pipeline.graded_assignments(root)}
        # one untimed autograde of each assignment: what a class's later students find (files read
        # once, library builds made, a grader's compile cache filled where the tree keeps one)
        warm = {a: round(pipeline.autograde_student(a, STUDENT, root, db_url=db).seconds, 1)
                for a in pipeline.graded_assignments(root)}
        return {"assignments": pipeline.graded_assignments(root), "seeds": seeds, "warm-up": warm}
    if request["op"] == "grade":
        try:
            from rlhf_lab.instructor.grader import timeline
        except ImportError:  # a baseline from before the timeline: its totals only
            timeline = None

        path = Path(request["timeline"])
        path.unlink(missing_ok=True)
        os.environ["RLHF_TIMELINE"] = str(path)
        import resource

        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        run = pipeline.autograde_student(request["assignment"], STUDENT, course, db_url=db)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
        if not run.ok:
            return {"ok": False, "reason": run.reason, "log": run.log_tail}
        table = pipeline.read_grades(course, db)
        cells = {k: [c.score, c.max_score] for k, c in table.by_cell(STUDENT, request["assignment"]).items()}
        records = timeline.read(path) if timeline else []
        return {"ok": True, "seconds": run.seconds, "cpu": cpu, "cells": cells, "phases": phases(records, run.seconds)}
    raise ValueError(request["op"])


def call_worker(tree: Path, course: Path, request: dict) -> dict:
    """:func:`worker` in a fresh process of this venv whose ``rlhf_lab`` is ``tree``'s."""
    env = dict(os.environ, PYTHONPATH=str(tree / "helpers"), JAX_PLATFORMS=os.environ.get("JAX_PLATFORMS", "cpu"))
    env.pop("RLHF_COURSE_ROOT", None)
    env.pop("RLHF_COURSE_DB", None)
    env["PATH"] = str(Path(sys.executable).parent) + os.pathsep + env.get("PATH", "")
    proc = subprocess.run([sys.executable, __file__, "--worker", str(tree), str(course), json.dumps(request)],
                          capture_output=True, text=True, env=env, cwd=tree)
    lines = proc.stdout.strip().splitlines()
    if proc.returncode != 0 or not lines:
        raise SystemExit(f"worker for {tree} failed on {request}:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    return json.loads(lines[-1])


# ------------------------------------------------------------------------------------------ driver


def baseline_tree(rev: str, parent: Path) -> Path:
    """A detached git worktree of ``rev`` under ``parent`` (removed by :func:`drop_tree`)."""
    tree = parent / "baseline"
    subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", str(tree), rev],
                   check=True, capture_output=True)
    return tree


def drop_tree(tree: Path) -> None:
    subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(tree)], capture_output=True)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--baseline", default=DEFAULT_BASELINE, help="git revision to compare with")
    parser.add_argument("--repeats", type=int, default=2, help="autogrades per assignment and tree (median)")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "student.md")
    parser.add_argument("--assignments", nargs="*", help="only these graded assignments (default: all)")
    parser.add_argument("--worker", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        tree, course, request = args.worker
        print(json.dumps(worker(Path(tree), Path(course), json.loads(request))))
        return 0

    rev = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", args.baseline], check=True,
                         capture_output=True, text=True).stdout.strip()
    head = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], check=True,
                          capture_output=True, text=True).stdout.strip()
    dirty = bool(subprocess.run(["git", "-C", str(ROOT), "status", "--porcelain", "--untracked-files=no"],
                                capture_output=True, text=True).stdout.strip())
    started = dt.datetime.now().strftime("%Y-%m-%d %H:%M")
    load_start = load()
    with tempfile.TemporaryDirectory(prefix="rlhf_bench_student_") as tmp:
        tmp = Path(tmp)
        trees = {"baseline": baseline_tree(rev, tmp), "current": ROOT}
        try:
            courses = {name: tmp / f"course-{name}" for name in trees}
            setup = {name: call_worker(trees[name], courses[name], {"op": "setup"}) for name in trees}
            assignments = [a for a in setup["current"]["assignments"]
                           if not args.assignments or a in args.assignments]
            print(f"set up: seeds {setup}", flush=True)
            seconds = {name: {a: [] for a in assignments} for name in trees}
            cpus = {name: {a: [] for a in assignments} for name in trees}
            cells = {name: {} for name in trees}
            profile = {name: {} for name in trees}
            for repeat in range(args.repeats):
                order = list(trees) if repeat % 2 == 0 else list(reversed(list(trees)))
                for a in assignments:
                    for name in order:
                        res = call_worker(trees[name], courses[name], {"op": "grade", "assignment": a,
                                                                       "timeline": str(tmp / f"{name}.jsonl")})
                        if not res["ok"]:
                            raise SystemExit(f"{name} failed to grade {a}: {res['reason']}\n{res['log']}")
                        seconds[name][a].append(res["seconds"])
                        cpus[name][a].append(res["cpu"])
                        cells[name][a] = res["cells"]
                        profile[name].setdefault(a, []).append(res["phases"])
                        print(f"repeat {repeat + 1} {a} {name}: {res['seconds']:.1f} s, {res['cpu']:.1f} core-s",
                              flush=True)
        finally:
            drop_tree(trees["baseline"])

    med = {name: {a: statistics.median(v) for a, v in seconds[name].items()} for name in seconds}
    cpu = {name: {a: statistics.median(v) for a, v in cpus[name].items()} for name in cpus}
    total = {name: sum(med[name].values()) for name in med}
    ratio = total["current"] / total["baseline"]
    same = cells["baseline"] == cells["current"]
    lines = ["# One student's course: this tree against the baseline", "",
             f"Measured {started} on {platform.node()} ({len(os.sched_getaffinity(0))} usable cores, Python "
             f"{platform.python_version()}) by `bench/bench_student.py --repeats {args.repeats}`: baseline `{rev}`, "
             f"current `{head}`{' with uncommitted changes' if dirty else ''}. The correct example student, every "
             "graded assignment, the course's own task (`pipeline.autograde_student`: one `nbgrader autograde` "
             "process, judge + sandbox + compile cache, seeds built and one untimed autograde of each assignment "
             "beforehand), the two trees in turns. "
             f"Load average (1/5/15 min) at the start: {load_start}, at the end: {load()}.", "",
             "| assignment | baseline | current | current / baseline | CPU baseline | CPU current | CPU ratio |",
             "|---|---|---|---|---|---|---|"]
    for a in med["current"]:
        lines.append(f"| {a} | {med['baseline'][a]:.1f} s | {med['current'][a]:.1f} s | "
                     f"{med['current'][a] / med['baseline'][a]:.2f} | {cpu['baseline'][a]:.1f} core-s | "
                     f"{cpu['current'][a]:.1f} core-s | {cpu['current'][a] / cpu['baseline'][a]:.2f} |")
    cpu_total = {name: sum(cpu[name].values()) for name in cpu}
    lines.append(f"| **all ({len(med['current'])} assignments)** | **{total['baseline']:.1f} s** | "
                 f"**{total['current']:.1f} s** | **{ratio:.2f}** | **{cpu_total['baseline']:.1f} core-s** | "
                 f"**{cpu_total['current']:.1f} core-s** | **{cpu_total['current'] / cpu_total['baseline']:.2f}** |")
    lines += ["", f"Target: at most {TARGET_RATIO:.2f} of the baseline: **{'met' if ratio <= TARGET_RATIO else 'not met'}**. "
              f"Grades cell by cell: **{'the same' if same else 'DIFFERENT'}**"
              + ("" if same else f" (baseline {cells['baseline']}, current {cells['current']})") + ".", ""]
    lines += ["## Where the time goes (seconds, median over the repeats, from `RLHF_TIMELINE`)", ""]
    lines += [f"- {label}: {how}" for label, how in PROFILE_COLUMNS]
    lines += ["", "| assignment | tree | " + " | ".join(label for label, _ in PROFILE_COLUMNS) + " |",
              "|---|---|" + "---|" * len(PROFILE_COLUMNS)]
    sums = {name: {label: 0.0 for label, _ in PROFILE_COLUMNS} for name in trees}
    for a in assignments:
        for name in trees:
            runs = profile[name][a]
            if not any(r["judged cells"] or r["pre-flight"] for r in runs):
                lines.append(f"| {a} | {name} | {statistics.median(r['whole autograde'] for r in runs):.1f} | "
                             "(no timeline in this tree) |")
                continue
            row = {label: statistics.median(r[label] for r in runs) for label, _ in PROFILE_COLUMNS}
            for label in row:
                sums[name][label] += row[label]
            lines.append(f"| {a} | {name} | " + " | ".join(f"{row[label]:.1f}" for label, _ in PROFILE_COLUMNS) + " |")
    for name in trees:
        if sums[name]["judged cells"]:
            lines.append(f"| **the course** | {name} | " + " | ".join(f"**{sums[name][label]:.1f}**"
                                                                    for label, _ in PROFILE_COLUMNS) + " |")
    lines.append("")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("\n".join(lines))
    print("\n".join(lines))
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
