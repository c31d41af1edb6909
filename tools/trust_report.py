#!/usr/bin/env python3
"""Grade every hostile/broken case of ``examples/hostile/`` and write ``docs/trust_report.md``.

    .venv/bin/python tools/trust_report.py                 # grade in a temporary copy, write the report
    .venv/bin/python tools/trust_report.py --out FILE      # write somewhere else
    .venv/bin/python tools/trust_report.py --workers 2     # autograde on a 2-worker Dask LocalCluster
    .venv/bin/python tools/trust_report.py --keep DIR      # grade in DIR/course and keep it
    .venv/bin/python tools/trust_report.py --from DIR/course   # only re-render from a course graded with --keep

Writing the default report also replaces the case table in README.md with the same table.

Each case runs through the real pipeline in a private copy of the course: collect -> integrity
pre-flight -> ``nbgrader autograde`` (one process per student) -> integrity overrides ->
``nbgrader generate_feedback`` -> export. The table is produced from the gradebook, the integrity
report and the autograded notebooks, so it says what the grader actually did. The script exits 1
if any case did not get the treatment ``examples/hostile/CASES.json`` expects.
"""
from __future__ import annotations

import argparse
import datetime as _dt
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
os.environ["PATH"] = str(Path(sys.executable).parent) + os.pathsep + os.environ.get("PATH", "")
os.environ.setdefault("JAX_PLATFORMS", "cpu")

sys.path.insert(0, str(ROOT / "tests"))  # the fixtures package (example and hostile submissions)
from fixtures import hostile  # noqa: E402
from rlhf_lab.instructor.classrun import pipeline  # noqa: E402


def _md(text: str) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


TABLE_HEADER = "| case | student | what the grader did | resulting grade | as expected |"


def case_table(cases, verdicts) -> list[str]:
    """The Markdown table (header, rule, one row per case) shared by the report and README.md."""
    lines = [TABLE_HEADER, "|---|---|---|---|---|"]
    for case, v in zip(cases, verdicts):
        score, total = v.total
        zeros = [k.split("/")[1] for k in case.zero]
        grade = f"{score:g} / {total:g}" if total else "0 (nothing gradable)"
        if zeros:
            grade += f"; 0 on {', '.join(zeros)}"
        ok = "yes" if v.ok else "NO: " + "; ".join(v.problems)
        lines.append(f"| {_md(case.title)} | `{_md(case.student)}` | {_md(v.action())} | {_md(grade)} | {_md(ok)} |")
    return lines


def table_in(text: str) -> list[str]:
    """The case table found in a Markdown text (the lines from its header to the first non-row)."""
    lines = text.splitlines()
    start = lines.index(TABLE_HEADER)
    end = start
    while end < len(lines) and lines[end].startswith("|"):
        end += 1
    return lines[start:end]


def update_readme(readme: Path, table: list[str]) -> None:
    """Replace the case table in README.md's trust section with ``table``."""
    text = readme.read_text(encoding="utf-8")
    old = "\n".join(table_in(text))
    readme.write_text(text.replace(old, "\n".join(table), 1), encoding="utf-8")


def render(cases, verdicts, run, seconds: float, workers: int | None) -> str:
    lines = [
        "# Trust report: hostile and broken submissions",
        "",
        "Produced by `tools/trust_report.py` (do not edit by hand): every case of `examples/hostile/` "
        "(built by `tools/make_hostile.py` from the release and the source solutions) was graded by the "
        "real pipeline: integrity pre-flight, `nbgrader autograde` (one process per student, kernels "
        "under the course's memory limit and per-cell timeout), integrity overrides, feedback, export.",
        "",
        f"Run on {_dt.datetime.now(_dt.timezone.utc):%Y-%m-%d %H:%M} UTC, nbgrader per-cell timeout "
        f"{os.environ.get('RLHF_CELL_TIMEOUT', '60')} s, kernel memory limit "
        f"{os.environ.get('RLHF_KERNEL_MEMORY_MB', '4096')} MiB, "
        f"{'sequential' if not workers else f'{workers} Dask workers'}, {len(cases)} cases in {seconds:.0f} s.",
        "",
        "*Grade* is the student's score on the targeted notebook's autograded tests after the integrity "
        "overrides (the notebook's other, manually graded answer is not included). "
        "Unless a case says otherwise the target is `a1_ppo_objective/01_clipped_objective.ipynb` and the "
        "assignment's second notebook was not submitted (so it scores 0 and is listed as missing).",
        "",
    ]
    lines += case_table(cases, verdicts)
    lines += ["", "## What each case does", ""]
    for case in cases:
        lines.append(f"* `{case.student}` ({case.assignment}): {case.attack}.")
    failed = [r for r in run.runs if not r.ok]
    lines += ["", "## Autograde runs nbgrader could not complete", ""]
    if failed:
        for r in failed:
            reason = r.reason.replace(str(run.root) + "/", "").replace(str(run.root), ".")
            lines.append(f"* `{r.student}` / {r.assignment}: {_md(reason)}")
    else:
        lines.append("* none")
    lines += ["", "## Integrity findings (blocking ones withhold points for instructor review)", ""]
    for a, rep in sorted(run.reports.items()):
        for f in rep.findings:
            if f.code == "missing-notebook" and f.student.startswith("h") and f.notebook != hostile.NB_FILE:
                continue  # every hostile student submitted one notebook only
            lines.append(f"* {_md(f.text())}")
    lines.append("")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "trust_report.md")
    parser.add_argument("--workers", type=int, default=0, help="Dask workers (0: the sequential loop)")
    parser.add_argument("--keep", type=Path, help="grade in this folder and keep it (default: a temp dir)")
    parser.add_argument("--from", dest="graded", type=Path,
                        help="render from a course already graded by this script with --keep (no grading)")
    args = parser.parse_args(argv)
    pipeline.ensure_venv_on_path()
    cases = hostile.load_cases(ROOT / "examples" / "hostile")
    if args.graded is not None:
        run = hostile.load_run(args.graded)
        verdicts = [hostile.verdict(c, run) for c in cases]
        seconds = float(sum(run.seconds.get(k, 0) for k in ("collect", "autograde", "feedback", "export")))
        return _write(args.out, render(cases, verdicts, run, seconds, args.workers), verdicts)
    with tempfile.TemporaryDirectory(prefix="rlhf_trust_") as tmp:
        base = args.keep or Path(tmp)
        root = pipeline.copy_course(base / "course", ROOT)
        pipeline.generate(root, pipeline.assignments(root))
        grader = None
        if args.workers:
            from rlhf_lab.instructor.classrun import parallel

            grader = parallel.dask_grader(workers=args.workers)
        start = time.perf_counter()

        def progress(r):
            print(f"  {r.student:<32} {r.seconds:6.1f} s  {'ok' if r.ok else 'FAILED: ' + r.reason[:90]}", flush=True)

        run = hostile.run_hostile_class(root, grader=grader, progress=progress, cases=cases)
        seconds = time.perf_counter() - start
        verdicts = [hostile.verdict(c, run) for c in cases]
        text = render(cases, verdicts, run, seconds, args.workers)
    return _write(args.out, text, verdicts)


def _write(out: Path, text: str, verdicts) -> int:
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text, encoding="utf-8")
    if out.resolve() == (ROOT / "docs" / "trust_report.md").resolve():
        update_readme(ROOT / "README.md", table_in(text))  # the same table, in README.md
    bad = [v for v in verdicts if not v.ok]
    print(f"wrote {out}: {len(verdicts)} cases, {len(bad)} not as expected")
    for v in bad:
        print(f"  {v.case.student}: " + "; ".join(v.problems))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
