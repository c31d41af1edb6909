"""Benchmark of the instructor pipeline: ``make demo`` end to end, and one student's autograde.

In one run, on a temporary copy of the course (the repository is never touched), it times:

* ``make demo`` equivalent: ``python -m rlhf_lab.demo --workdir DIR`` (regenerate the release,
  collect the bundled class, autograde each student in its own nbgrader process, feedback, CSV,
  tables), wall clock, with the per-step and per-student times it reports;
* one student's autograde of each graded assignment (the correct example, ``nbgrader autograde A
  --student ada_correct --force``, in the demo's course), repeated ``--repeats`` times, median;
  target < 60 s; each repeat is run twice back to back, with the trusted compilation cache (the
  default) and without it (``RLHF_COMPILE_CACHE=0``), so their ratio is measured in the same run;
* where that time goes: nbgrader process start-up (plain ``python -m nbgrader`` against the
  pipeline's launcher, as a ratio measured in the same run), and the slowest cells of the autograded
  notebooks (from nbclient's per-cell execution timestamps).

The machine is shared, so the load average before and after is recorded with the figures.

Usage: ``python bench/bench_pipeline.py [--repeats N] [--skip-demo] [--out bench/results/pipeline.md]``
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
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
os.environ["PATH"] = str(Path(sys.executable).parent) + os.pathsep + os.environ.get("PATH", "")
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import nbformat  # noqa: E402

sys.path.insert(0, str(ROOT / "tests"))  # the fixtures package
from fixtures import submissions  # noqa: E402
from rlhf_lab.instructor.grader import compile_cache  # noqa: E402
from rlhf_lab.instructor.classrun import pipeline

TARGET_STUDENT_SECONDS = 60.0


def load() -> str:
    return " / ".join(f"{x:.2f}" for x in os.getloadavg())


def startup_seconds(cmd: list, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        subprocess.run(cmd + ["--version"], check=True, capture_output=True, env=pipeline.nbgrader_env(ROOT))
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def cell_times(folder: Path) -> list:
    """[(seconds, notebook, grade_id or cell index)] from nbclient's execution timestamps."""
    def ts(s):
        return dt.datetime.fromisoformat(s.replace("Z", "+00:00"))

    out = []
    for path in sorted(folder.glob("*.ipynb")):
        nb = nbformat.read(path, as_version=4)
        for i, cell in enumerate(nb.cells):
            ex = cell.get("metadata", {}).get("execution", {})
            if "iopub.execute_input" in ex and "shell.execute_reply" in ex:
                sec = (ts(ex["shell.execute_reply"]) - ts(ex["iopub.execute_input"])).total_seconds()
                gid = cell.get("metadata", {}).get("nbgrader", {}).get("grade_id", f"cell {i}")
                out.append((sec, path.stem, gid))
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=1, help="autograde runs per assignment (median)")
    parser.add_argument("--skip-demo", action="store_true", help="only the per-student autograde")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "pipeline.md")
    args = parser.parse_args(argv)

    lines = ["# Instructor pipeline benchmark", ""]
    lines += [f"- date: {dt.datetime.now().isoformat(timespec='seconds')}",
              f"- machine: {platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}",
              f"- load average (1/5/15 min) at start: {load()}", ""]
    with tempfile.TemporaryDirectory(prefix="rlhf_bench_pipeline_") as tmp:
        tmp = Path(tmp)

        plain = startup_seconds([sys.executable, "-m", "nbgrader"], 3)
        fast = startup_seconds(pipeline.nbgrader_command(), 3)
        lines += ["## nbgrader process start-up (paid once per autograded student)", "",
                  "| command | median of 3 |", "|---|---|",
                  f"| `python -m nbgrader --version` | {plain:.2f} s |",
                  f"| pipeline launcher (`nbgrader_cli.py --version`) | {fast:.2f} s |",
                  f"| ratio plain / launcher | {plain / fast:.2f}x |", ""]
        print(lines[-3], lines[-2], flush=True)

        if not args.skip_demo:
            work = tmp / "demo"
            t = time.perf_counter()
            env = {k: v for k, v in os.environ.items() if k not in ("RLHF_COURSE_ROOT", "RLHF_COURSE_DB")}
            proc = subprocess.run([sys.executable, "-m", "rlhf_lab.demo", "--workdir", str(work)],
                                  capture_output=True, text=True, env=env)
            demo_s = time.perf_counter() - t
            if proc.returncode != 0:
                print(proc.stdout[-3000:], proc.stderr[-3000:])
                raise SystemExit("the demo failed")
            report = json.loads((work / pipeline.REPORT_NAME).read_text())
            runs = report["runs"]
            lines += ["## `make demo` (python -m rlhf_lab.demo --workdir DIR)", "",
                      f"- wall clock: **{demo_s:.1f} s** for {len(runs)} student/assignment autogrades "
                      f"({len({r['student'] for r in runs})} students)",
                      "- steps: " + ", ".join(f"{k} {v:.1f} s" for k, v in report["seconds"].items()),
                      f"- failed autograde runs: {sum(not r['ok'] for r in runs)}", "",
                      "| student | assignment | autograde seconds |", "|---|---|---|"]
            lines += [f"| {r['student']} | {r['assignment']} | {r['seconds']:.1f} |" for r in runs]
            lines += [""]
            print(f"demo: {demo_s:.1f} s", flush=True)

        if args.skip_demo:
            root = pipeline.copy_course(tmp / "one", ROOT)
            db = "sqlite:///" + str(root / "gradebook.db")
            pipeline.generate(root, db_url=db)
            pipeline.collect(root / "examples" / "submissions", root, students=[submissions.CORRECT])
            for a in pipeline.graded_assignments(root):
                compile_cache.ensure_seed(root, a)
        else:  # the demo's course is generated and collected already: regrade its correct student
            root = work
            db = "sqlite:///" + str(root / "gradebook.db")
        lines += ["## One student's autograde (the correct example), per assignment", "",
                  f"Target: under {TARGET_STUDENT_SECONDS:.0f} s per student and assignment.", "",
                  "| assignment | notebooks | median wall clock | sum of cell times | without the compile cache "
                  "| ratio | verdict |",
                  "|---|---|---|---|---|---|---|"]
        slow_cells = []
        verdicts = []
        for a in pipeline.graded_assignments(root):
            times, plain_times = [], []
            for _ in range(args.repeats):
                for cache, out in (("1", times), ("0", plain_times)):
                    os.environ["RLHF_COMPILE_CACHE"] = cache
                    try:
                        run = pipeline.autograde_student(a, submissions.CORRECT, root, db_url=db)
                    finally:
                        os.environ.pop("RLHF_COMPILE_CACHE", None)
                    if not run.ok:
                        raise SystemExit(f"autograde of {a} failed: {run.reason}\n{run.log_tail}")
                    out.append(run.seconds)
                    if cache == "1":
                        cells = cell_times(root / "autograded" / submissions.CORRECT / a)
            med, plain_med = statistics.median(times), statistics.median(plain_times)
            ok = med < TARGET_STUDENT_SECONDS
            verdicts.append(ok)
            lines.append(f"| {a} | {len(pipeline.notebooks(a, root))} | {med:.1f} s | "
                         f"{sum(c[0] for c in cells):.1f} s | {plain_med:.1f} s | {plain_med / med:.2f}x | "
                         f"{'OK' if ok else 'OVER TARGET'} |")
            slow_cells += [(s, a, nb, gid) for s, nb, gid in cells]
            print(f"{a}: {med:.1f} s (without the compile cache {plain_med:.1f} s)", flush=True)
        lines += ["", "Slowest cells (seconds of execution in the kernel):", "",
                  "| seconds | assignment | notebook | cell |", "|---|---|---|---|"]
        for s, a, nb, gid in sorted(slow_cells, reverse=True)[:12]:
            lines.append(f"| {s:.1f} | {a} | {nb} | {gid} |")
    lines += ["", f"- load average (1/5/15 min) at end: {load()}", ""]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("\n".join(lines))
    print(f"wrote {args.out}")
    return 0 if all(verdicts) else 1


if __name__ == "__main__":
    sys.exit(main())
