"""The class roster: checked, then imported with nbgrader's own ``nbgrader db student import``.

Without a roster the gradebook knows students only by the id of their submission folder, so
Formgrader lists everyone as "None, None" and ``grades.csv`` has empty names. The roster is a CSV
with the columns nbgrader reads, ``id,first_name,last_name,email,lms_user_id`` (only ``id`` is
required; ``lms_user_id`` is the Canvas user id that ``nbgrader zip_collect`` matches, see
:mod:`.lms`). The bundled class's roster is ``examples/roster.csv``; a real class keeps its own as
``roster.csv`` in the course root (or ``$RLHF_ROSTER``).

:func:`check_roster` reads the file first and reports every problem with its line number (missing
``id`` column, empty or duplicate ids, invalid ids, unknown columns), because nbgrader itself stops
at the first bad row with a bare ``KeyError`` or silently ignores unknown columns.

A student id names a folder under ``submitted/``, ``autograded/`` and ``feedback/``, a file in the
exchange (``<id>+<assignment>+<timestamp>``) and, on a JupyterHub, a Linux account. So an id must be
acceptable to all three at once: :data:`ID_RULE`, the portable Linux user name (lower-case letter or
``_`` first, then lower-case letters, digits, ``_`` and ``-``, at most 32 characters). That rules out
``..``, ``/``, ``+`` (the exchange's separator), spaces, control characters, a leading ``-`` (read as
an option) and upper case (two ids that differ only in case would share a folder on a
case-insensitive disk). ``lms_user_id`` (Canvas's numeric user id) must be digits; names and e-mail
addresses may hold any printable text (a name that looks like a spreadsheet formula is written as
text by every CSV the course makes, :func:`.csv_export.safe_cell`), but no control characters. :func:`import_roster` then runs the real import (nbgrader creates or updates
each student; re-importing is safe).

Command line::

    python -m rlhf_lab.instructor.operations.roster [ROSTER.csv]      # check and import (default: the course roster)
    python -m rlhf_lab.instructor.operations.roster --check ROSTER.csv
"""
from __future__ import annotations

import argparse
import csv
import os
import re
import sys
import unicodedata
from pathlib import Path

from ..classrun.pipeline import COURSE_ID, CommandRun, PipelineError, course_root, default_db_url, ensure_venv_on_path, run_nbgrader

COLUMNS = ("id", "first_name", "last_name", "email", "lms_user_id")
ENV_VAR = "RLHF_ROSTER"
#: A student id: a portable Linux user name (``useradd``'s default rule, ``NAME_REGEX`` of
#: ``adduser.conf``), which is also one path component and one field of an exchange file name.
ID_RULE = re.compile(r"[a-z_][a-z0-9_-]{0,31}")
ID_RULE_TEXT = ("a lower-case letter or '_' first, then lower-case letters, digits, '_' or '-', "
                "at most 32 characters (a Linux user name, a folder name and an exchange field at once)")


def id_problem(sid: str) -> str | None:
    """Why ``sid`` cannot be a student id (``None``: it can). See :data:`ID_RULE`."""
    if ID_RULE.fullmatch(sid):
        return None
    if any(unicodedata.category(ch).startswith("C") for ch in sid):
        return "contains a control character"
    if sid in (".", "..") or "/" in sid or "\\" in sid:
        return "is a path, not a name"
    if len(sid) > 32:
        return f"is {len(sid)} characters long (at most 32)"
    if sid.startswith("-"):
        return "starts with '-' (commands would read it as an option)"
    bad = sorted({ch for ch in sid.lower() if not re.fullmatch(r"[a-z0-9_-]", ch)})
    if bad:
        return "contains " + ", ".join(repr(ch) for ch in bad)
    if sid != sid.lower():
        return "has upper-case letters"
    return "does not start with a letter or '_'"


def _field_problems(n: int, row: dict) -> list[str]:
    """Problems of the non-id fields of roster line ``n``."""
    problems = []
    for column in ("first_name", "last_name", "email", "lms_user_id"):
        value = row.get(column) or ""
        if any(unicodedata.category(ch).startswith("C") for ch in value):
            problems.append(f"line {n}: {column} {value!r} contains a control character (a tab or a line break?)")
    lms = (row.get("lms_user_id") or "").strip()
    if lms and not lms.isdigit():
        problems.append(f"line {n}: lms_user_id {lms!r} is not a number (Canvas's user ids are digits)")
    return problems


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
        seen: dict = {}
        lms_ids: dict = {}
        for n, row in enumerate(reader, start=2):
            if None in row:
                problems.append(f"line {n}: more values than columns")
            raw = row.get("id") or ""
            sid = raw.strip()
            if not sid:
                problems.append(f"line {n}: empty id")
                continue
            why = "has spaces around it" if raw != sid else id_problem(sid)
            if why:
                problems.append(f"line {n}: id {raw!r} is not a valid student id: it {why}; an id is {ID_RULE_TEXT}")
            problems.extend(_field_problems(n, row))
            key = sid.casefold()
            if key in seen:
                problems.append(f"line {n}: id {sid!r} already on line {seen[key]}")
            seen.setdefault(key, n)
            lms = (row.get("lms_user_id") or "").strip()
            if lms and lms in lms_ids:
                problems.append(f"line {n}: lms_user_id {lms} already on line {lms_ids[lms]} (an LMS download "
                                "could not tell the two students apart)")
            lms_ids.setdefault(lms, n)
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
    parser = argparse.ArgumentParser(prog="python -m rlhf_lab.instructor.operations.roster",
                                     description="Check a roster CSV and import it into the gradebook.")
    parser.add_argument("roster", nargs="?", type=Path, help="CSV file (default $RLHF_ROSTER, roster.csv "
                                                            "or examples/roster.csv)")
    parser.add_argument("--check", action="store_true", help="only check the file, import nothing")
    parser.add_argument("--db", help="gradebook URL (default the course's)")
    args = parser.parse_args(argv)
    if args.roster is None and not os.environ.get(ENV_VAR) and not (course_root() / "roster.csv").exists():
        print(f"error: no roster to import: {course_root() / 'roster.csv'} does not exist and ${ENV_VAR} is not set.\n"
              f"  Write roster.csv (columns id, first_name, last_name, email, lms_user_id) "
              "or name the file: `make roster ROSTER=path/to/roster.csv`.\n"
              "  The bundled example class's roster is examples/roster.csv (`make roster ROSTER=examples/roster.csv`).",
              file=sys.stderr)
        return 2
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
