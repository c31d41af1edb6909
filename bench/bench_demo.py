"""Benchmark of ``make demo`` end to end: the whole demo on one worker vs on a pool of the cores, same run.

Each run is ``python -m rlhf_lab.demo --workers N`` exactly as ``make demo`` starts it (its scratch
copy ``course_run/``, generate, roster, exchange hand-in, the compile-cache seeds, autograde,
feedback, export, release), on a fresh copy of the course made for that run (the repository is
never touched) with no compile-cache seed in it, so every run builds the seeds as a new user's
first demo does (``--with-seeds`` copies the repository's seeds in instead, if it has any). The
baseline, one worker (``--workers 1``: the sequential loop, one student after another, seeds one
at a time), and the pool (``--workers N``, default the usable cores: Dask LocalCluster, seeds N at
a time) are measured in the same run, in the order ``1, N, N, 1, ...`` (``--repeats``), so the load
other programs put on this shared machine falls on both alike; the machine's load average and the
CPU time other programs used meanwhile are reported with the figures. Both must give the same
grades, cell by cell.

Where the CPU goes: while each demo runs, every process started after it is sampled (psutil, every
half second) and its CPU time is added to a kind (grading kernels, the
``nbgrader autograde`` processes, the pool's workers with their judge server, feedback, the other
nbgrader steps, the demo itself, ...). The sum over all kinds divided by the cores is the least wall
time any scheduling of that work could take on this machine: the demo's CPU floor. A process's last
half second before it exits can be missed, so the sampled total is a little under the machine's.

Target: the whole demo within 4 minutes on a quiet 2-core machine.

With ``--baseline REV`` the two kinds of run are instead this tree and a git worktree of revision
``REV`` (its own course copy and ``rlhf_lab`` on ``PYTHONPATH``, the same venv), both with N workers,
in the order ``baseline, current, current, baseline, ...``: a change measured against the code before
it, in the same run, with the CPU of each run by kind of process.

Usage: ``python bench/bench_demo.py [--workers N] [--repeats R] [--with-seeds] [--baseline REV]
[--out bench/results/demo.md]``
"""
from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
os.environ["PATH"] = str(Path(sys.executable).parent) + os.pathsep + os.environ.get("PATH", "")
os.environ.setdefault("JAX_PLATFORMS", "cpu")

from rlhf_lab.instructor.classrun import pipeline  # noqa: E402

TARGET_SECONDS = 240.0
COURSE_ID = "rlhf-ppo"


def load() -> str:
    return " / ".join(f"{x:.2f}" for x in os.getloadavg())


def cpu_snapshot() -> tuple[float, float]:
    """(CPU seconds the whole machine was busy, CPU seconds of this process and its finished children)."""
    import psutil

    t = psutil.cpu_times()
    own = os.times()
    return t.user + t.nice + t.system + t.irq + t.softirq, own.user + own.system + own.children_user + own.children_system


#: (kind, test on the process's command line), first match wins: see :func:`kind_of`.
KINDS = (
    ("grading kernels (one per notebook, sandboxed)", lambda c: "ipykernel" in c),
    # trees from before gradients were taken from the traced program (a baseline's processes)
    ("trusted gradient runtimes (trees before the traced-program judge)", lambda c: "_IN, _OUT = _os.dup" in c),
    ("confinement wrappers (root-owned course)", lambda c: "confine.py" in c),
    ("nbgrader autograde (one per student and assignment)", lambda c: "nbgrader_cli.py autograde" in c),
    ("nbgrader generate_feedback", lambda c: "nbgrader_cli.py generate_feedback" in c),
    ("other nbgrader steps (generate, release, collect, export, roster)", lambda c: "nbgrader" in c),
    ("pool workers and seed builders (Dask, the judge server's references)", lambda c: "spawn_main" in c),
    ("library builds' import checks", lambda c: "importlib, json, sys" in c),
    ("the demo's own process", lambda c: "rlhf_lab.demo" in c),
)


OTHER_KIND = "everything else (bubblewrap, confinement helpers, alembic, ...)"


def kind_of(cmdline: str) -> str:
    """The kind of a process, from its command line (see :data:`KINDS`). Bubblewrap itself (whose
    command line holds the kernel's or runtime's) is "everything else": each sandbox is two bwrap
    processes around the one that does the work."""
    if os.path.basename(cmdline.split(" ", 1)[0]) == "bwrap":
        return OTHER_KIND
    for kind, test in KINDS:
        if test(cmdline):
            return kind
    return OTHER_KIND


class CpuSampler:
    """CPU seconds of every process started after :meth:`start`, by kind, sampled every ``period`` s."""

    def __init__(self, period: float = 0.5):
        import threading

        self.period, self.seen, self._stop = period, {}, threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def start(self) -> "CpuSampler":
        import psutil

        # processes running now are not the demo's (psutil's start times drift from time.time())
        self.before = {(p.pid, p.info["create_time"]) for p in psutil.process_iter(["create_time"])}
        self._thread.start()
        return self

    def _sample(self) -> None:
        import psutil

        for proc in psutil.process_iter(["pid", "cmdline", "cpu_times", "create_time"]):
            info = proc.info
            key = (info["pid"], info["create_time"])
            if key in self.before or info["cpu_times"] is None:
                continue
            old = self.seen.get(key)
            cmd = " ".join(info["cmdline"] or []) or (old[0] if old else "")  # a zombie has no command line
            self.seen[key] = (cmd, info["cpu_times"].user + info["cpu_times"].system)

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                self._sample()
            except Exception:  # noqa: BLE001 - a process vanished mid-read: the next sample has it
                pass
            self._stop.wait(self.period)

    def stop(self) -> dict:
        """``{kind: (core-seconds, processes)}``, this sampler's own process left out."""
        self._stop.set()
        self._thread.join()
        out: dict = {}
        for cmd, cpu in self.seen.values():
            if "bench_demo.py" in cmd:
                continue
            kind = kind_of(cmd)
            total, count = out.get(kind, (0.0, 0))
            out[kind] = (total + cpu, count + 1)
        return out


def cell_grades(root: Path) -> dict:
    from nbgrader.api import Gradebook

    out = {}
    with Gradebook("sqlite:///" + str(root / "gradebook.db"), COURSE_ID) as gb:
        for a in gb.assignments:
            for s in a.submissions:
                for nb in s.notebooks:
                    for g in nb.grades:
                        out[(a.name, s.student.id, nb.name, g.name)] = (g.auto_score, g.manual_score,
                                                                        g.needs_manual_grade)
    return out


def one_demo(base: Path, label: str, workers: int, with_seeds: bool, tree: Path = ROOT) -> dict:
    include = pipeline.COURSE_FILES if with_seeds else tuple(n for n in pipeline.COURSE_FILES if n != ".cache")
    course = pipeline.copy_course(base / label, tree, include=include)
    env = {k: v for k, v in os.environ.items() if k not in ("RLHF_COURSE_DB", "RLHF_EXCHANGE", "RLHF_PROGRESS")}
    env["RLHF_COURSE_ROOT"] = str(course)
    if tree != ROOT:
        env["PYTHONPATH"] = str(tree / "helpers")
    load_before = os.getloadavg()[0]
    before = cpu_snapshot()
    sampler = CpuSampler().start()
    t = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "rlhf_lab.demo", "--workers", str(workers)], cwd=course, env=env,
                          capture_output=True, text=True)
    wall = time.perf_counter() - t
    by_kind = sampler.stop()
    after = cpu_snapshot()
    if proc.returncode != 0:
        print(proc.stdout[-3000:], proc.stderr[-3000:], file=sys.stderr)
        raise SystemExit(f"the demo failed ({label})")
    work = course / "course_run"
    report = json.loads((work / pipeline.REPORT_NAME).read_text())
    other = max(0.0, (after[0] - before[0]) - (after[1] - before[1])) / wall
    result = {"label": label, "workers": workers, "wall": wall, "steps": report.get("demo_seconds", {}),
              "runs": report["runs"], "seeds": report.get("compile_cache_seeds", {}), "grades": cell_grades(work),
              "stderr": proc.stderr, "load_before": load_before, "load_after": os.getloadavg()[0],
              "other_cores": other, "cpu_by_kind": by_kind, "machine_busy": after[0] - before[0]}
    shutil.rmtree(course, ignore_errors=True)
    print(f"{label}: {wall:.1f} s with {workers} worker(s), load {load_before:.1f} -> {result['load_after']:.1f}, "
          f"other programs {other:.2f} cores", flush=True)
    return result


def cpu_table(r: dict, cores: int) -> list[str]:
    """Where run ``r``'s CPU went, by kind of process, and the CPU floor it implies on ``cores`` cores."""
    kinds = sorted(r["cpu_by_kind"].items(), key=lambda kv: -kv[1][0])
    total = sum(cpu for cpu, _ in r["cpu_by_kind"].values())
    out = [f"## Where the CPU of {r['label']} went ({r['workers']} workers)", "",
           "| kind of process | processes | CPU (core-seconds) | share |", "|---|---|---|---|"]
    for kind, (cpu, count) in kinds:
        out.append(f"| {kind} | {count} | {cpu:.1f} | {cpu / total:.0%} |")
    out += ["", f"Sampled: {total:.0f} core-seconds (the machine was busy {r['machine_busy']:.0f} core-seconds "
                f"meanwhile). **CPU floor on {cores} cores: {total / cores:.0f} s** (the work divided by the "
                f"cores: no scheduling of this work finishes sooner); the run took {r['wall']:.0f} s. The "
                f"{TARGET_SECONDS:.0f} s target needs the work under {TARGET_SECONDS * cores:.0f} core-seconds.", ""]
    return out


def compare_with_baseline(args) -> int:
    """This tree against a worktree of ``args.baseline``, both at ``args.workers`` (see the module docstring)."""
    cores = pipeline.default_workers()
    start_load = load()
    rev = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", args.baseline], check=True,
                         capture_output=True, text=True).stdout.strip()
    head = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], check=True,
                          capture_output=True, text=True).stdout.strip()
    results = {"baseline": [], "current": []}
    with tempfile.TemporaryDirectory(prefix="bench-demo-") as tmp:
        base = Path(tmp)
        tree = base / "baseline-tree"
        subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", str(tree), rev], check=True,
                       capture_output=True)
        try:
            order = []
            for k in range(args.repeats):
                order += ["baseline", "current"] if k % 2 == 0 else ["current", "baseline"]
            for i, which in enumerate(order):
                results[which].append(one_demo(base, f"run{i + 1}-{which}", args.workers, args.with_seeds,
                                               tree if which == "baseline" else ROOT))
        finally:
            subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(tree)], capture_output=True)
    runs = results["baseline"] + results["current"]
    same = all(r["grades"] == runs[0]["grades"] for r in runs) and runs[0]["grades"]
    wall = {k: statistics.median(r["wall"] for r in v) for k, v in results.items()}
    cpu = {k: statistics.median(sum(c for c, _ in r["cpu_by_kind"].values()) for r in v) for k, v in results.items()}
    lines = [
        f"# `make demo` end to end: `{head}` against `{rev}`", "",
        f"Measured {dt.datetime.now().strftime('%Y-%m-%d %H:%M')} on {platform.node()} ({cores} usable cores, "
        f"Python {platform.python_version()}) by `bench/bench_demo.py --baseline {args.baseline}"
        f"{' --repeats ' + str(args.repeats) if args.repeats != 1 else ''}`: each run is `python -m rlhf_lab.demo "
        f"--workers {args.workers}` on a fresh copy of its tree's course (no compile-cache seed: each run builds "
        f"them), in the order {', '.join(r['label'] for r in sorted(runs, key=lambda r: r['label']))}. "
        f"Load average (1/5/15 min) at the start: {start_load}, at the end: {load()}.", "",
        "| run | wall | CPU sampled (core-seconds) | load before -> after | other programs' cores |",
        "|---|---|---|---|---|",
    ]
    for r in sorted(runs, key=lambda r: r["label"]):
        lines.append(f"| {r['label']} | {r['wall']:.1f} s | {sum(c for c, _ in r['cpu_by_kind'].values()):.0f} | "
                     f"{r['load_before']:.1f} -> {r['load_after']:.1f} | {r['other_cores']:.2f} |")
    lines += ["", f"**Wall: {wall['current']:.1f} s vs {wall['baseline']:.1f} s ({wall['current'] / wall['baseline']:.2f}); "
                  f"CPU: {cpu['current']:.0f} vs {cpu['baseline']:.0f} core-seconds "
                  f"({cpu['current'] / cpu['baseline']:.2f}).** "
              + ("Every run gave the same grades, cell by cell." if same else "THE RUNS GAVE DIFFERENT GRADES."), ""]
    for r in (results["baseline"][0], results["current"][0]):
        lines += cpu_table(r, cores)
    text = "\n".join(lines)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text)
    print(text)
    return 0 if same else 1


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workers", type=int, default=pipeline.default_workers())
    ap.add_argument("--repeats", type=int, default=1, help="pairs of runs (order 1, N, N, 1, ...)")
    ap.add_argument("--with-seeds", action="store_true", help="start from the repository's compile-cache seeds")
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "demo.md")
    ap.add_argument("--baseline", help="compare this tree with a worktree of this revision (both at --workers)")
    args = ap.parse_args(argv)
    if args.baseline:
        return compare_with_baseline(args)

    cores = pipeline.default_workers()
    start_load = load()
    results = {1: [], args.workers: []}
    with tempfile.TemporaryDirectory(prefix="bench-demo-") as tmp:
        base = Path(tmp)
        order = []
        for k in range(args.repeats):
            order += [1, args.workers] if k % 2 == 0 else [args.workers, 1]
        for i, w in enumerate(order):
            results[w].append(one_demo(base, f"run{i + 1}-w{w}", w, args.with_seeds))
    seq, par = results[1], results[args.workers]
    same = all(r["grades"] == seq[0]["grades"] for r in seq + par) and seq[0]["grades"]
    t_seq = statistics.median(r["wall"] for r in seq)
    t_par = statistics.median(r["wall"] for r in par)
    ratio = t_seq / t_par
    other = statistics.mean(r["other_cores"] for r in seq + par)

    def steps(r) -> str:
        return ", ".join(f"{k} {v:.1f} s" for k, v in r["steps"].items() if k != "total")

    n_runs = len(seq[0]["runs"])
    lines = [
        "# `make demo` end to end: one worker vs a pool of the cores", "",
        f"Measured {dt.datetime.now().strftime('%Y-%m-%d %H:%M')} on {platform.node()} ({cores} usable cores, "
        f"Python {platform.python_version()}) by `bench/bench_demo.py"
        f"{' --repeats ' + str(args.repeats) if args.repeats != 1 else ''}"
        f"{' --with-seeds' if args.with_seeds else ''}`.",
        f"Each run: `python -m rlhf_lab.demo --workers N` on a fresh copy of the course "
        f"({'with the repository' + chr(39) + 's compile-cache seeds' if args.with_seeds else 'no compile-cache seed: each run builds them, as a first demo does'}); "
        f"the bundled class, {len({r['student'] for r in seq[0]['runs']})} students, {n_runs} autogrades. "
        f"Runs in the order {', '.join(str(w) for w in order)} (workers), in the same run. "
        f"Load average (1/5/15 min) at the start: {start_load}; other programs kept {other:.2f} of the "
        f"{cores} cores busy on average while the demos ran, which takes cores from the pool and shrinks "
        "its ratio.", "",
        "| run | workers | wall | steps (from the demo's report) | load before -> after | other programs' cores |",
        "|---|---|---|---|---|---|",
    ]
    for r in sorted(seq + par, key=lambda r: r["label"]):
        lines.append(f"| {r['label']} | {r['workers']} | {r['wall']:.1f} s | {steps(r)} | "
                     f"{r['load_before']:.1f} -> {r['load_after']:.1f} | {r['other_cores']:.2f} |")
    lines += [
        "",
        f"**Whole demo: {t_par:.1f} s with {args.workers} workers vs {t_seq:.1f} s with one: {ratio:.2f}x** "
        f"(target: within {TARGET_SECONDS:.0f} s on a quiet {cores}-core machine: "
        f"{'met' if t_par <= TARGET_SECONDS else 'not met'} here). "
        + ("Every run gave the same grades, cell by cell." if same else "THE RUNS GAVE DIFFERENT GRADES."),
        "",
        "Seeds (per assignment, first run of each kind): "
        + "; ".join(f"{r['workers']} worker(s): " + ", ".join(
            f"{a} {s['seconds']:.0f} s{' (rebuilt)' if s['rebuilt'] else ''}"
            f"{' (no seed: ' + s['problem'][:80] + ')' if s.get('problem') else ''}" for a, s in r["seeds"].items())
            for r in (seq[0], par[0])),
        "",
        f"- load average (1/5/15 min) at the end: {load()}", "",
    ]
    lines += cpu_table(par[0], cores)
    for r in seq + par:
        said = [line for line in r["stderr"].splitlines() if line.strip() and "%|" not in line]
        if said:
            shown = "; ".join(f"`{line[:160]}`" for line in dict.fromkeys(said))
            lines += [f"- stderr of {r['label']}: {len(said)} line(s): {shown[:900]}", ""]
    text = "\n".join(lines)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text)
    print(text)
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
