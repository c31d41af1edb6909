"""The class roster: checked, then imported with nbgrader's own ``nbgrader db student import``.

Without a roster the gradebook knows students only by the id of their submission folder, so
Formgrader lists everyone as "None, None" and ``grades.csv`` has empty names. The roster is a CSV
with the columns nbgrader reads, ``id,first_name,last_name,email,lms_user_id`` (only ``id`` is
required; ``lms_user_id`` is the Canvas user id that ``nbgrader zip_collect`` matches, see
:mod:`.lms`). The bundled class's roster is ``examples/roster.csv``; a real class keeps its own as
``roster.csv`` in the course root (or ``$RLHF_ROSTER``).

:func:`check_roster` reads the file first and reports every problem with its line number (missing
``id`` column, empty or duplicate ids, ids nbgrader's exchange cannot store, unknown columns),
because nbgrader itself stops at the first bad row with a bare ``KeyError`` or silently ignores
unknown columns. :func:`import_roster` then runs the real import (nbgrader creates or updates
each student; re-importing is safe).

Command line::

    python -m rlhf_lab.instructor.roster [ROSTER.csv]      # check and import (default: the course roster)
    python -m rlhf_lab.instructor.roster --check ROSTER.csv
"""
from __future__ import annotations

import argparse
import csv
import os
import sys
from pathlib import Path

from .pipeline import COURSE_ID, CommandRun, PipelineError, course_root, default_db_url, ensure_venv_on_path, run_nbgrader

COLUMNS = ("id", "first_name", "last_name", "email", "lms_user_id")
ENV_VAR = "RLHF_ROSTER"


class RosterError(PipelineError):
    """The roster file cannot be imported as it is."""


def roster_path(root=None) -> Path:
    """``$RLHF_ROSTER``, else ``<root>/roster.csv`` when it exists, else ``<root>/examples/roster.csv``."""
    env = os.environ.get(ENV_VAR)
    if env:
        return Path(env).resolve()
    own = course_root(root) / "roster.csv"
    return own if own.exists() else course_root(root) / "examples" / "roster.csv"


def check_roster(path: str | os.PathLike) -> list[str]:
    """Every problem of the roster CSV at ``path`` as ``line N: ...`` strings (empty: importable)."""
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"path must be a path to a CSV file, got {type(path).__name__}")
    path = Path(path)
    if not path.is_file():
        return [f"{path}: no such file"]
    problems = []
    with open(path, newline="", encoding="utf-8-sig") as fh:
        reader = csv.DictReader(fh)
        fields = reader.fieldnames or []
        if "id" not in fields:
            return [f"line 1: the header must name an 'id' column (allowed columns: {', '.join(COLUMNS)}), "
                    f"found {fields}"]
        unknown = [f for f in fields if f not in COLUMNS]
        if unknown:
            problems.append(f"line 1: unknown column(s) {unknown}; nbgrader would ignore them "
                            f"(allowed: {', '.join(COLUMNS)})")
        seen = {}
        for n, row in enumerate(reader, start=2):
            if None in row:
                problems.append(f"line {n}: more values than columns")
            sid = (row.get("id") or "").strip()
            if not sid:
                problems.append(f"line {n}: empty id")
                continue
            if any(ch in sid for ch in "+*/ ") or sid in (".", ".."):
                problems.append(f"line {n}: id {sid!r} contains '+', '*', '/' or a space, which the exchange "
                                "and the submission folders cannot hold")
            if sid in seen:
                problems.append(f"line {n}: id {sid!r} already on line {seen[sid]}")
            seen.setdefault(sid, n)
    return problems


def import_roster(path: str | os.PathLike | None = None, root=None, db_url: str | None = None) -> CommandRun:
    """Check the roster (default :func:`roster_path`) and run ``nbgrader db student import`` on it.

    Raises :class:`RosterError` listing every problem before anything is imported, or when
    nbgrader fails.
    """
    path = Path(path).resolve() if path is not None else roster_path(root)
    problems = check_roster(path)
    if problems:
        raise RosterError(f"roster {path} cannot be imported:\n  " + "\n  ".join(problems))
    run = run_nbgrader(["db", "student", "import", str(path)], root, db_url)
    if not run.ok:
        raise RosterError(f"nbgrader db student import {path} failed:\n" + ("\n".join(run.errors()) or run.output[-2000:]))
    return run


def gradebook_students(root=None, db_url: str | None = None) -> dict:
    """``{student id: (first_name, last_name, email, lms_user_id)}`` as the gradebook has them."""
    from nbgrader.api import Gradebook

    ensure_venv_on_path()
    with Gradebook(db_url or default_db_url(root), COURSE_ID) as gb:
        return {s.id: (s.first_name, s.last_name, s.email, s.lms_user_id) for s in gb.students}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m rlhf_lab.instructor.roster",
                                     description="Check a roster CSV and import it into the gradebook.")
    parser.add_argument("roster", nargs="?", type=Path, help="CSV file (default $RLHF_ROSTER, roster.csv "
                                                            "or examples/roster.csv)")
    parser.add_argument("--check", action="store_true", help="only check the file, import nothing")
    parser.add_argument("--db", help="gradebook URL (default the course's)")
    args = parser.parse_args(argv)
    path = (args.roster or roster_path()).resolve()
    problems = check_roster(path)
    if problems:
        print(f"roster {path}:", *problems, sep="\n  ", file=sys.stderr)
        return 2
    if args.check:
        print(f"roster {path}: ok")
        return 0
    try:
        import_roster(path, db_url=args.db)
    except RosterError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    students = gradebook_students(db_url=args.db)
    print(f"imported {path}: the gradebook now has {len(students)} students")
    return 0


if __name__ == "__main__":
    sys.exit(main())
