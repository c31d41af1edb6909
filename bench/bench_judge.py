"""Benchmark: one student's autograde with and without the sandbox, and a class run with one judge server
against a judge per student process.

In one run, on a temporary copy of the course, the correct example student of each graded
assignment is autograded (``nbgrader autograde A --student ada_correct --force``, its own process,
as the course's commands do) in two configurations, interleaved so that they share the machine's
load:

* ``judge``: the hidden tests decided by the judge in the grader's process, the kernel unsandboxed
  (``RLHF_NO_SANDBOX=1``);
* ``judge+sandbox``: the default path (the judge, and the kernel under bubblewrap).

It reports the median seconds per configuration and the ratio (what the sandbox costs), and checks
that both gave the same grades, cell by cell. (Until the kernel side of grading was cut down to what
the judge needs, this benchmark also measured the path before the judge, checks inside the kernel:
``bench/results/judge.md`` keeps those figures; that path no longer exists.)

**Class run** (``--class-size N``, default 4): a class of N students of each assignment (the correct
student, the unchanged release and mistakes of that assignment from ``examples/submissions``) is
graded by the course's sequential executor twice, in the same run, order alternating between
assignments:

* ``per-process``: each student's nbgrader process judges by itself (``RLHF_JUDGE_SERVER=0``, as a
  bare ``nbgrader autograde`` does), so every student pays the library import and the references'
  compilation again;
* ``server``: one judge server for the run (:mod:`rlhf_lab.instructor.grader.judge_server`), the default.

It reports the mean per-student autograde seconds of each, their ratio, the first student's seconds
and the mean of the later ones, and checks that the two gave the same grades, cell by cell.
``--only class`` skips the single-student part (its earlier section of ``--out`` is kept).

Usage: ``python bench/bench_judge.py [--repeats N] [--class-size N] [--only single|class] [--assignments A ...]
[--out FILE]``
"""
from __future__ import annotations

import argparse
import datetime as dt
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
os.environ["PATH"] = str(Path(sys.executable).parent) + os.pathsep + os.environ.get("PATH", "")
os.environ.setdefault("JAX_PLATFORMS", "cpu")

from rlhf_lab.instructor.classrun import pipeline  # noqa: E402

CONFIGS = {
    "judge": {"RLHF_NO_SANDBOX": "1"},
    "judge+sandbox": {"RLHF_NO_SANDBOX": "0"},
}
STUDENT = "ada_correct"


def grades(root: Path, db_url: str, assignment: str) -> dict:
    table = pipeline.read_grades(root, db_url)
    return {k: (c.score, c.max_score) for k, c in table.by_cell(STUDENT, assignment).items()}


CLASS_MARK = "## Class run: one judge server vs a judge per student process"
#: environment of each class configuration: a judge in every student's process and the default path
#: (a judge server for the run), both with the sandbox on
CLASS_CONFIGS = {
    "per-process": {"RLHF_JUDGE_SERVER": "0", "RLHF_NO_SANDBOX": "0"},
    "server": {"RLHF_JUDGE_SERVER": "1", "RLHF_NO_SANDBOX": "0"},
}


def class_students(assignment: str, size: int) -> list[str]:
    """The correct student, the unchanged release, then mistakes of ``assignment`` (bundled examples)."""
    folder = ROOT / "examples" / "submissions"
    others = sorted(p.parent.name for p in folder.glob(f"*/{assignment}")
                    if p.parent.name not in (STUDENT, "ben_unchanged"))
    return ([STUDENT, "ben_unchanged"] + others)[:size]


def class_part(size: int, only: list[str] | None = None) -> list[str]:
    from rlhf_lab.instructor.classrun import orchestrator
    from rlhf_lab.instructor.course import as_course

    load_before = os.getloadavg()
    rows, same_all = [], True
    with tempfile.TemporaryDirectory(prefix="rlhf_bench_judge_class_") as tmp:
        root = pipeline.copy_course(Path(tmp) / "course", ROOT)
        db_url = "sqlite:///" + str(root / "gradebook.db")
        names = [a for a in pipeline.graded_assignments(root) if not only or a in only]
        pipeline.generate(root, names, db_url=db_url)
        who = {a: class_students(a, size) for a in names}
        pipeline.collect(ROOT / "examples" / "submissions", root, names=names,
                         students=sorted({s for v in who.values() for s in v}))
        course = as_course(root, db_url)
        saved = dict(os.environ)
        try:
            for i, assignment in enumerate(names):
                order = list(CLASS_CONFIGS) if i % 2 == 0 else list(CLASS_CONFIGS)[::-1]  # share the load
                seconds, seen = {}, {}
                for config in order:
                    os.environ.update(CLASS_CONFIGS[config])
                    run = orchestrator.grade_assignment(course, assignment, who[assignment],
                                                        orchestrator.SequentialExecutor(), preflight=False)
                    bad = [r for r in run.results if r["status"] != "graded"]
                    if bad:
                        raise SystemExit(f"{assignment} {config}: {bad[0]['student']} failed: {bad[0]['reason']}")
                    by_student = {r["student"]: r["seconds"] for r in run.results}
                    seconds[config] = [by_student[s] for s in who[assignment]]
                    table = pipeline.read_grades(root, db_url)
                    seen[config] = {s: sorted((k, c.score, c.max_score)
                                              for k, c in table.by_cell(s, assignment).items()) for s in who[assignment]}
                    print(f"{assignment:14s} {config:12s} " + " ".join(f"{x:5.1f}" for x in seconds[config]), flush=True)
                same = seen["per-process"] == seen["server"]
                for other in [c for c in CLASS_CONFIGS if seen[c] != seen["server"]]:
                    for student in who[assignment]:
                        a, b = dict((k, v) for k, *v in seen["server"][student]), dict(
                            (k, v) for k, *v in seen[other][student])
                        for cell in sorted(set(a) | set(b)):
                            if a.get(cell) != b.get(cell):
                                print(f"  differs: {student} {cell}: server {a.get(cell)}, {other} {b.get(cell)}",
                                      flush=True)
                same_all = same_all and same
                rows.append((assignment, len(who[assignment]), seconds, same))
        finally:
            os.environ.clear()
            os.environ.update(saved)
    load_after = os.getloadavg()
    mean = statistics.mean
    lines = [CLASS_MARK, "",
             f"`python bench/bench_judge.py --only class --class-size {size}"
             + (f" --assignments {' '.join(only)}" if only else "") + "`: sequential executor, sandbox on; "
             f"load average before {' / '.join(f'{x:.2f}' for x in load_before)}, after "
             f"{' / '.join(f'{x:.2f}' for x in load_after)}.", "",
             "| assignment | students | per-process, mean per student (s) | "
             "server, mean per student (s) | server / per-process | "
             "per-process: first, later (s) | server: first, later (s) | same grades |",
             "|---|---|---|---|---|---|---|---|"]
    total = {c: 0.0 for c in CLASS_CONFIGS}
    for assignment, n, seconds, same in rows:
        for c in CLASS_CONFIGS:
            total[c] += sum(seconds[c])
        fl = {c: f"{seconds[c][0]:.1f}, {mean(seconds[c][1:]) if n > 1 else float('nan'):.1f}" for c in CLASS_CONFIGS}
        lines.append(f"| {assignment} | {n} | {mean(seconds['per-process']):.1f} | "
                     f"{mean(seconds['server']):.1f} | {mean(seconds['server']) / mean(seconds['per-process']):.2f}x | "
                     f"{fl['per-process']} | {fl['server']} | {'yes' if same else 'NO'} |")
    lines += ["", f"All the assignments above together: server / per-process = {total['server'] / total['per-process']:.2f}x "
              f"({total['server']:.0f} s vs {total['per-process']:.0f} s). "
              f"Same grades cell by cell, server and per-process: {'yes' if same_all else 'NO'}.", ""]
    return lines if same_all else lines + ["GRADES DIFFER"]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--class-size", type=int, default=4)
    parser.add_argument("--only", choices=("single", "class"))
    parser.add_argument("--assignments", nargs="*", help="the class part's assignments (default: every graded one)")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "judge.md")
    args = parser.parse_args(argv)
    if args.only == "class":
        old = args.out.read_text(encoding="utf-8") if args.out.exists() else ""
        head = old.split(CLASS_MARK)[0].rstrip() + "\n\n" if old.strip() else ""
        lines = class_part(args.class_size, args.assignments)
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(head + "\n".join(lines), encoding="utf-8")
        print("\n".join(lines))
        return 0 if lines[-1] != "GRADES DIFFER" else 1
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="rlhf_bench_judge_") as tmp:
        root = pipeline.copy_course(Path(tmp) / "course", ROOT)
        db_url = "sqlite:///" + str(root / "gradebook.db")
        names = pipeline.graded_assignments(root)
        pipeline.generate(root, names, db_url=db_url)
        pipeline.collect(ROOT / "examples" / "submissions", root, names=names, students=[STUDENT])
        times = {(a, c): [] for a in names for c in CONFIGS}
        seen = {}
        saved = dict(os.environ)
        try:
            for _ in range(args.repeats):
                for assignment in names:
                    for config, env in CONFIGS.items():
                        os.environ.update(env)
                        run = pipeline.autograde_student(assignment, STUDENT, root, db_url)
                        if not run.ok:
                            print(f"{assignment} {config}: autograde failed: {run.reason}", file=sys.stderr)
                            return 1
                        times[(assignment, config)].append(run.seconds)
                        seen.setdefault(assignment, {})[config] = grades(root, db_url, assignment)
                        print(f"{assignment:14s} {config:14s} {run.seconds:6.1f} s", flush=True)
        finally:
            os.environ.clear()
            os.environ.update(saved)
    load_after = os.getloadavg()
    same = all(len({repr(sorted(v.items())) for v in by.values()}) == 1 for by in seen.values())
    lines = [f"# Judge benchmark ({dt.date.today()}, {platform.machine()}, {os.cpu_count()} cores)", "",
             f"`python bench/bench_judge.py --repeats {args.repeats}`; load average before "
             f"{' / '.join(f'{x:.2f}' for x in load_before)}, after {' / '.join(f'{x:.2f}' for x in load_after)}.",
             "", "| assignment | judge, no sandbox (s) | judge+sandbox (s) | judge+sandbox / judge |",
             "|---|---|---|---|"]
    for assignment in names:
        med = {c: statistics.median(times[(assignment, c)]) for c in CONFIGS}
        lines.append(f"| {assignment} | {med['judge']:.1f} | {med['judge+sandbox']:.1f} | "
                     f"{med['judge+sandbox'] / med['judge']:.2f}x |")
    lines += ["", f"Same grades cell by cell in the two configurations: {'yes' if same else 'NO'}.", ""]
    class_ok = True
    if args.only != "single":
        more = class_part(args.class_size, args.assignments)
        class_ok = more[-1] != "GRADES DIFFER"
        lines += more
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("\n".join(lines), encoding="utf-8")
    print("\n".join(lines))
    return 0 if same and class_ok else 1


if __name__ == "__main__":
    t0 = time.perf_counter()
    code = main()
    print(f"({time.perf_counter() - t0:.0f} s)")
    sys.exit(code)
