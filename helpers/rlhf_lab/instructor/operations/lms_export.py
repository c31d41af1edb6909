"""Grades back to the LMS: the gradebook in Canvas's or Moodle's own gradebook import CSV.

Command line (from the course root; ``make lms-export LMS=canvas|moodle [OUT=file]``)::

    python -m rlhf_lab.instructor.operations.lms_export --format canvas --out grades_canvas.csv
    python -m rlhf_lab.instructor.operations.lms_export --format moodle --out grades_moodle.csv \\
        [--assignment a1_ppo_objective ...] [--column "a1_ppo_objective=PPO objective (81234)"] \\
        [--include-incomplete] [--db URL] [--root DIR]

The scores are those of ``grades.csv`` (:class:`.csv_export.CsvExport`: ``score``, after the late
penalty, for every graded assignment; assignments without points are left out), one row per
student, one column per assignment, every field through :func:`.csv_export.safe_cell` (a name
that looks like a formula stays text).

**Canvas** (Grades > Import). The layout of Canvas's own gradebook export, which its importer
reads back (``GradebookImporter``): a header ``Student,ID,SIS User ID,SIS Login ID,Section,
<assignment>...``; a second row whose first field is ``Points Possible`` (the assignments'
``max_score``; Canvas uses it for an assignment the file creates); then one row per student with
``ID`` = the roster's ``lms_user_id`` (Canvas's numeric user id, what Canvas matches first) and
``Student`` = "Last, First". The SIS columns and ``Section`` are left empty (the course does not
know them; Canvas does not need them when ``ID`` is set). An assignment column is headed by the
assignment's name, which Canvas matches to an assignment of that title or offers to create; to
update an existing Canvas assignment by its id, name the column as Canvas does,
``<title> (<Canvas assignment id>)``: ``--column "a1_ppo_objective=PPO objective (81234)"``.

**Moodle** (Grades > Import > CSV file). ``First name,Last name,Email address,<assignment>...``;
on Moodle's import page map from "Email address" to "Email address" (the identifier) and each
assignment column to its grade item.

A student the file cannot identify (Canvas: no ``lms_user_id``; Moodle: no e-mail) is left out of
the file and named on stderr with the reason; the others are written and the command succeeds.
A score that is not final yet (hand-graded points still pending, ``grades.csv``'s
``pending_manual_points``) is left blank, which both LMSs read as "no grade, change nothing", and
named on stderr; ``--include-incomplete`` writes the partial score instead. A student with no
submission gets 0, as in ``grades.csv``.
"""
from __future__ import annotations

import argparse
import dataclasses
import os
import sys
from pathlib import Path
from typing import Iterable, Sequence

from .csv_export import CsvExport, writer

FORMATS = ("canvas", "moodle")
CANVAS_STUDENT_COLUMNS = ("Student", "ID", "SIS User ID", "SIS Login ID", "Section")
#: The first field of Canvas's second row (its export writes it with four leading spaces; its
#: importer looks for the words).
CANVAS_POINTS_POSSIBLE = "    Points Possible"
MOODLE_STUDENT_COLUMNS = ("First name", "Last name", "Email address")
#: Decimal places of a score in the LMS file (Canvas keeps two).
DECIMALS = 2


@dataclasses.dataclass
class LmsTable:
    """What goes into the file, and who was left out or held back (one message each)."""

    format: str
    header: list
    rows: list  # every row after the header (Canvas: the Points Possible row first)
    students: list  # student ids written, in order
    left_out: list  # "student: why" for students the LMS could not identify
    incomplete: list  # "student/assignment: n points wait for a grader" (blank or partial score)


def _number(value) -> float:
    return round(float(value or 0.0), DECIMALS)


def _canvas_name(first: str | None, last: str | None, sid: str) -> str:
    """Canvas's sortable name, "Last, First" (or what there is; the student id when nothing)."""
    first, last = (first or "").strip(), (last or "").strip()
    if first and last:
        return f"{last}, {first}"
    return last or first or sid


def parse_columns(specs: Iterable[str]) -> dict:
    """``["name=Header", ...]`` -> ``{name: Header}`` (``--column``); a spec without ``=`` is an error."""
    out = {}
    for spec in specs:
        name, sep, header = spec.partition("=")
        if not sep or not name.strip() or not header.strip():
            raise ValueError(f"--column {spec!r}: expected ASSIGNMENT=HEADER, for example "
                             "'a1_ppo_objective=PPO objective (81234)'")
        out[name.strip()] = header.strip()
    return out


def build_table(records: Sequence[dict], fmt: str, columns: dict | None = None,
                include_incomplete: bool = False) -> LmsTable:
    """The LMS file for ``records`` (:meth:`.csv_export.CsvExport.records`: one dict per graded
    assignment and student) in format ``fmt`` (:data:`FORMATS`)."""
    if fmt not in FORMATS:
        raise ValueError(f"format must be one of {', '.join(FORMATS)}, got {fmt!r}")
    if not isinstance(include_incomplete, bool):
        raise TypeError(f"include_incomplete must be True or False, got {include_incomplete!r}")
    columns = dict(columns or {})
    assignments: list = []
    max_score: dict = {}
    students: dict = {}  # sid -> first record (names, ids)
    scores: dict = {}  # (sid, assignment) -> record
    for r in records:
        if r["assignment"] not in max_score:
            assignments.append(r["assignment"])
            max_score[r["assignment"]] = r["max_score"]
        students.setdefault(r["student_id"], r)
        scores[(r["student_id"], r["assignment"])] = r
    unknown = sorted(set(columns) - set(assignments))
    if unknown:
        raise ValueError(f"--column names assignment(s) with no grades to export: {', '.join(unknown)} "
                         f"(exported: {', '.join(assignments) or 'none'})")
    headers = [columns.get(a, a) for a in assignments]
    if fmt == "canvas":
        header = list(CANVAS_STUDENT_COLUMNS) + headers
        rows = [[CANVAS_POINTS_POSSIBLE, "", "", "", ""] + [_number(max_score[a]) for a in assignments]]
    else:
        header = list(MOODLE_STUDENT_COLUMNS) + headers
        rows = []
    written, left_out, incomplete = [], [], []
    for sid, who in students.items():
        if fmt == "canvas":
            key = (who.get("lms_user_id") or "").strip()
            if not key:
                left_out.append(f"{sid}: no lms_user_id in the gradebook (add the student's Canvas user id "
                                "to the roster's lms_user_id column and run `make roster`)")
                continue
            row = [_canvas_name(who["first_name"], who["last_name"], sid), key, "", "", ""]
        else:
            key = (who.get("email") or "").strip()
            if not key:
                left_out.append(f"{sid}: no e-mail in the gradebook (Moodle identifies a student by it: add it "
                                "to the roster's email column and run `make roster`)")
                continue
            row = [who["first_name"] or "", who["last_name"] or "", key]
        for a in assignments:
            r = scores.get((sid, a))
            if r is None:
                row.append("")
                continue
            pending = float(r.get("pending_manual_points") or 0.0)
            if pending > 0:
                incomplete.append(f"{sid}/{a}: {pending:g} point(s) wait for a grader"
                                  + (f" (partial score {_number(r['score']):g} written)" if include_incomplete
                                     else " (left blank)"))
                row.append(_number(r["score"]) if include_incomplete else "")
            else:
                row.append(_number(r["score"]))
        rows.append(row)
        written.append(sid)
    return LmsTable(fmt, header, rows, written, left_out, incomplete)


def write_table(table: LmsTable, dest: str | os.PathLike) -> Path:
    """Write ``table`` as UTF-8 CSV through the course's writer (quoting and the formula guard)."""
    dest = Path(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    with open(dest, "w", encoding="utf-8", newline="") as fh:
        out = writer(fh)
        out.writerow(table.header)
        out.writerows(table.rows)
    return dest


def gradebook_records(db_url: str, course_id: str, assignments: Sequence[str] | None = None) -> list[dict]:
    """:meth:`.csv_export.CsvExport.records` of the gradebook at ``db_url`` (what ``grades.csv`` holds)."""
    from nbgrader.api import Gradebook

    plugin = CsvExport()
    if assignments:
        plugin.assignment = list(assignments)
    with Gradebook(db_url, course_id) as gb:
        return list(plugin.records(gb))


def export_lms(fmt: str, out: str | os.PathLike, root=None, db_url: str | None = None,
               assignments: Sequence[str] | None = None, columns: dict | None = None,
               include_incomplete: bool = False) -> tuple[Path, LmsTable]:
    """Read the course's gradebook and write the ``fmt`` import file to ``out``."""
    from .. import course

    root = course.course_root(root)
    course.ensure_venv_on_path()
    db_url = course.normalise_db_url(db_url or course.default_db_url(root))
    if db_url.startswith("sqlite:///"):
        path = Path(db_url[len("sqlite:///"):].split("?", 1)[0])
        if not path.is_file():  # nbgrader would create an empty gradebook and export nothing
            raise FileNotFoundError(f"gradebook {path} does not exist (grade the class first, or pass --db)")
    records = gradebook_records(db_url, course.COURSE_ID, assignments)
    if assignments:
        missing = sorted(set(assignments) - {r["assignment"] for r in records})
        if missing:
            raise ValueError(f"no grades to export for {', '.join(missing)} (not in the gradebook, or it has "
                             "no graded cells)")
    table = build_table(records, fmt, columns, include_incomplete)
    return write_table(table, out), table


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m rlhf_lab.instructor.operations.lms_export",
                                     description="Write the gradebook in Canvas's or Moodle's gradebook import CSV.")
    parser.add_argument("--format", required=True, choices=FORMATS, help="the LMS whose import format to write")
    parser.add_argument("--out", required=True, type=Path, help="the CSV file to write")
    parser.add_argument("--assignment", action="append", default=None, metavar="NAME",
                        help="export only this assignment (repeat for more; default every graded one)")
    parser.add_argument("--column", action="append", default=[], metavar="NAME=HEADER",
                        help="the column header of an assignment, e.g. Canvas's 'Title (assignment id)'")
    parser.add_argument("--include-incomplete", action="store_true",
                        help="write partial scores where hand-graded points are still pending (default: blank)")
    parser.add_argument("--db", help="gradebook URL (default the course's)")
    parser.add_argument("--root", help="course root (default the repository)")
    args = parser.parse_args(argv)
    try:
        columns = parse_columns(args.column)
        dest, table = export_lms(args.format, args.out, args.root, args.db, args.assignment, columns,
                                 args.include_incomplete)
    except (ValueError, FileNotFoundError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"wrote {dest}: {len(table.students)} student(s), {len(table.header) - (5 if args.format == 'canvas' else 3)} "
          f"assignment(s), {args.format} gradebook import format")
    if table.left_out:
        print(f"warning: {len(table.left_out)} student(s) left out of {dest}, the LMS could not tell who they are:",
              *table.left_out, sep="\n  ", file=sys.stderr)
    if table.incomplete:
        print(f"note: {len(table.incomplete)} score(s) are not final yet:", *table.incomplete, sep="\n  ",
              file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
