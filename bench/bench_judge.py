"""Benchmark: one student's autograde with the judge and the sandbox, against the previous path.

In one run, on a temporary copy of the course, the correct example student of each graded
assignment is autograded (``nbgrader autograde A --student ada_correct --force``, its own process,
as the course's commands do) in three configurations, interleaved so that they share the
machine's load:

* ``in-kernel``: the hidden tests' checks run inside the student's kernel (``RLHF_JUDGE=0``) and
  the kernel is not sandboxed (``RLHF_NO_SANDBOX=1``): the grading path before the judge;
* ``judge``: the checks run in the grader's process, the kernel unsandboxed;
* ``judge+sandbox``: the default path (the judge, and the kernel under bubblewrap).

It reports the median seconds per configuration and the ratios to ``in-kernel``, and checks that
the three configurations gave the same grades, cell by cell. The target of the course issue: the
default path no slower than 1.2x the previous one.

Usage: ``python bench/bench_judge.py [--repeats N] [--out bench/results/judge.md]``
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

from rlhf_lab.instructor import pipeline  # noqa: E402

CONFIGS = {
    "in-kernel": {"RLHF_JUDGE": "0", "RLHF_NO_SANDBOX": "1"},
    "judge": {"RLHF_JUDGE": "1", "RLHF_NO_SANDBOX": "1"},
    "judge+sandbox": {"RLHF_JUDGE": "1", "RLHF_NO_SANDBOX": "0"},
}
STUDENT = "ada_correct"


def grades(root: Path, db_url: str, assignment: str) -> dict:
    table = pipeline.read_grades(root, db_url)
    return {k: (c.score, c.max_score) for k, c in table.by_cell(STUDENT, assignment).items()}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "judge.md")
    args = parser.parse_args(argv)
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
             "", "| assignment | in-kernel (s) | judge (s) | judge+sandbox (s) | judge+sandbox / in-kernel |",
             "|---|---|---|---|---|"]
    for assignment in names:
        med = {c: statistics.median(times[(assignment, c)]) for c in CONFIGS}
        lines.append(f"| {assignment} | {med['in-kernel']:.1f} | {med['judge']:.1f} | {med['judge+sandbox']:.1f} | "
                     f"{med['judge+sandbox'] / med['in-kernel']:.2f}x |")
    lines += ["", f"Same grades cell by cell in the three configurations: {'yes' if same else 'NO'}.", ""]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("\n".join(lines), encoding="utf-8")
    print("\n".join(lines))
    return 0 if same else 1


if __name__ == "__main__":
    t0 = time.perf_counter()
    code = main()
    print(f"({time.perf_counter() - t0:.0f} s)")
    sys.exit(code)
