"""Back up the gradebook and export it to CSV, with every grade traceable to the cell that earned it.

One command (from the repository root)::

    .venv/bin/python -m rlhf_lab.instructor.operations.backup                 # -> backups/<UTC time>/
    .venv/bin/python -m rlhf_lab.instructor.operations.backup --out DIR --db postgresql://user@host/grades
    .venv/bin/python -m rlhf_lab.instructor.operations.backup --verify backups/<UTC time>
    .venv/bin/python -m rlhf_lab.instructor.operations.backup --restore backups/<UTC time>   # SQLite / PostgreSQL

It writes one folder per run:

``gradebook.sqlite`` or ``gradebook.pgdump``
    A consistent snapshot of the live gradebook: SQLite's online backup API
    (:meth:`sqlite3.Connection.backup`, safe while nbgrader writes) or ``pg_dump -Fc`` for a
    PostgreSQL URL (restore with ``--restore`` or ``pg_restore --clean``).
``grades.csv``
    The course's CSV export (:class:`.csv_export.CsvExport`, what ``nbgrader export`` writes here: a
    real CSV writer): one row per student and graded assignment (with ``lms_user_id``, the
    auto/manual split and the hand-graded points still pending), read from the snapshot, not the
    live database.
``grades_by_cell.csv``
    One row per student and graded cell: assignment, notebook, ``grade_id``, kind (test, answer,
    manual), auto/manual/final score, max score, whether a human still has to grade it, whether
    the notebook is flagged, and where the cell is: ``source_file`` + ``source_index`` (the cell
    in ``source/`` that holds the test, hidden part included), the gradebook's ``checksum`` of
    that cell, and ``autograded_index`` (the executed cell in ``autograded/<student>/...``
    whose outputs produced the score). Each student's scores in this file add up to the
    ``raw_score`` of ``grades.csv``: every point in the CSV traces to a test cell.
``MANIFEST.json``
    SHA-256 and size of every file, row counts and the nbgrader version, so a copy can be checked.

:func:`verify_backup` re-opens the snapshot and checks all of the above.
"""
from __future__ import annotations

import csv
import datetime as _dt
import hashlib
import json
import os
import shutil
import sqlite3
import subprocess
import tempfile
import urllib.parse
from pathlib import Path

CELL_COLUMNS = [
    "student", "assignment", "notebook", "grade_id", "kind", "auto_score", "manual_score", "extra_credit",
    "score", "max_score", "needs_manual_grade", "flagged", "source_file", "source_index", "checksum",
    "autograded_file", "autograded_index",
]


def _pipeline():
    """The course layer (root, gradebook URL, course id); named for the module that used to hold them."""
    from .. import course

    return course


def sqlite_file(db_url: str) -> Path | None:
    """The file of a ``sqlite:///...`` URL, else None."""
    if not db_url.startswith("sqlite:"):
        return None
    path = db_url.split(":///", 1)[1] if ":///" in db_url else ""
    path = path.split("?", 1)[0]
    return Path(path) if path else None


def snapshot_sqlite(src: Path, dest: Path) -> Path:
    """Copy a live SQLite database with the online backup API (consistent even while it is written)."""
    if not src.exists():
        raise FileNotFoundError(f"gradebook {src} does not exist")
    dest.parent.mkdir(parents=True, exist_ok=True)
    source = sqlite3.connect(f"file:{src}?mode=ro", uri=True, timeout=60)
    target = sqlite3.connect(str(dest))
    try:
        with target:
            source.backup(target)
        check = target.execute("PRAGMA integrity_check").fetchone()[0]
        if check != "ok":
            raise RuntimeError(f"the backup of {src} fails SQLite's integrity check: {check}")
    finally:
        target.close()
        source.close()
    return dest


def _pg_env(db_url: str) -> tuple[list[str], dict]:
    """``pg_dump``/``pg_restore`` connection arguments for a SQLAlchemy PostgreSQL URL."""
    url = urllib.parse.urlsplit(db_url.replace("postgresql+psycopg2://", "postgresql://")
                                .replace("postgresql+psycopg://", "postgresql://"))
    env = dict(os.environ)
    if url.password:
        env["PGPASSWORD"] = urllib.parse.unquote(url.password)
    args = []
    if url.hostname:
        args += ["-h", url.hostname]
    if url.port:
        args += ["-p", str(url.port)]
    if url.username:
        args += ["-U", urllib.parse.unquote(url.username)]
    args += ["-d", url.path.lstrip("/")]
    return args, env


def snapshot_postgres(db_url: str, dest: Path) -> Path:
    """``pg_dump -Fc`` of the gradebook database into ``dest``."""
    pg_dump = shutil.which("pg_dump") or _pg_tool("pg_dump")
    if not pg_dump:
        raise FileNotFoundError("pg_dump is not installed (Debian: apt-get install postgresql-client)")
    args, env = _pg_env(db_url)
    dest.parent.mkdir(parents=True, exist_ok=True)
    subprocess.run([pg_dump, "-Fc", "--no-owner", "-f", str(dest), *args], check=True, env=env,
                   capture_output=True, text=True)
    return dest


def _pg_tool(name: str) -> str | None:
    for base in sorted(Path("/usr/lib/postgresql").glob("*/bin"), reverse=True):
        if (base / name).exists():
            return str(base / name)
    return None


def sqlalchemy_url(db_url: str) -> str:
    """``postgresql://`` -> ``postgresql+psycopg2://`` when psycopg 3 is absent (see
    :func:`.course.normalise_db_url`, the one place that decides it)."""
    from ..course import normalise_db_url

    return normalise_db_url(db_url)


def redact(db_url: str) -> str:
    """The URL without its password."""
    url = urllib.parse.urlsplit(db_url)
    if url.password:
        netloc = url.netloc.replace(":" + url.password + "@", ":***@")
        return urllib.parse.urlunsplit(url._replace(netloc=netloc))
    return db_url


# ---------------------------------------------------------------------------------------- exports
def export_assignment_csv(db_url: str, course_id: str, dest: Path) -> Path:
    """The course's CSV export (``nbgrader export``'s plugin in ``nbgrader_config.py``, a real CSV
    writer: :mod:`.csv_export`) of the gradebook at ``db_url``."""
    from nbgrader.api import Gradebook

    from .csv_export import CsvExport

    plugin = CsvExport()
    plugin.to = str(dest)
    with Gradebook(db_url, course_id) as gb:
        plugin.export(gb)
    return dest


def _source_layout(root: Path) -> dict:
    """``{(assignment, notebook, grade_id): cell index}`` in ``source/``."""
    import nbformat

    out = {}
    src = root / "source"
    for path in sorted(src.glob("*/*.ipynb")) if src.is_dir() else []:
        nb = nbformat.read(str(path), as_version=4)
        for i, cell in enumerate(nb.cells):
            gid = cell.get("metadata", {}).get("nbgrader", {}).get("grade_id")
            if gid:
                out[(path.parent.name, path.stem, gid)] = i
    return out


def _autograded_index(root: Path, student: str, assignment: str, notebook: str, cache: dict,
                      refused: list | None = None) -> dict:
    """``{grade_id: cell index}`` of the student's autograded notebook ({} when there is none).

    The notebook is read only when it is a plain file in plain folders (:func:`.safe_files.read_text`):
    a link, a FIFO or a hard link the student left in ``autograded/`` is never followed or opened;
    its message (naming the student and the file) goes to ``refused`` and the index is empty.
    """
    import nbformat

    from ..grader import safe_files

    key = (student, assignment, notebook)
    if key not in cache:
        path = root / "autograded" / student / assignment / f"{notebook}.ipynb"
        idx = {}
        unsafe = [p for p in (path.parent.parent, path.parent) if p.is_symlink()]
        if unsafe:
            if refused is not None:
                refused.append(safe_files.refusal(unsafe[0], os.lstat(unsafe[0])).message)
        elif os.path.lexists(path):
            try:
                nb = nbformat.reads(safe_files.read_text(path), as_version=4)
                for i, cell in enumerate(nb.cells):
                    gid = cell.get("metadata", {}).get("nbgrader", {}).get("grade_id")
                    if gid:
                        idx[gid] = i
            except safe_files.UnsafeFileError as exc:
                if refused is not None:
                    refused.append(str(exc))
                idx = {}
            except Exception:  # noqa: BLE001 - a broken autograded file just has no index
                idx = {}
        cache[key] = idx
    return cache[key]


def cell_rows(db_url: str, course_id: str, root: Path, refused: list | None = None) -> list[dict]:
    """One dict per student and graded cell (columns :data:`CELL_COLUMNS`), in gradebook order.

    ``refused`` (a list) gets a message for every autograded notebook that was not read because it
    is not a plain file (its rows have no ``autograded_index``)."""
    from nbgrader.api import Gradebook

    layout = _source_layout(root)
    cache: dict = {}
    rows = []
    with Gradebook(db_url, course_id) as gb:
        for assignment in gb.assignments:
            for sub in sorted(assignment.submissions, key=lambda s: s.student.id):
                for snb in sorted(sub.notebooks, key=lambda n: n.name):
                    nb = snb.notebook
                    solution_names = {c.name for c in nb.solution_cells}
                    auto_idx = _autograded_index(root, sub.student.id, assignment.name, snb.name, cache, refused)
                    for g in sorted(snb.grades, key=lambda g: layout.get((assignment.name, snb.name, g.name), 0)):
                        cell = g.cell
                        if cell.name in solution_names:
                            kind = "answer" if cell.cell_type == "code" else "manual"
                        else:
                            kind = "test" if cell.cell_type == "code" else "manual"
                        try:
                            checksum = gb.find_source_cell(cell.name, snb.name, assignment.name).checksum
                        except Exception:  # noqa: BLE001
                            checksum = ""
                        src_index = layout.get((assignment.name, snb.name, cell.name))
                        rows.append({
                            "student": sub.student.id,
                            "assignment": assignment.name,
                            "notebook": snb.name,
                            "grade_id": cell.name,
                            "kind": kind,
                            "auto_score": g.auto_score,
                            "manual_score": g.manual_score,
                            "extra_credit": g.extra_credit,
                            "score": float(g.score),
                            "max_score": float(g.max_score),
                            "needs_manual_grade": bool(g.needs_manual_grade),
                            "flagged": bool(snb.flagged),
                            "source_file": f"source/{assignment.name}/{snb.name}.ipynb",
                            "source_index": "" if src_index is None else src_index,
                            "checksum": checksum,
                            "autograded_file": f"autograded/{sub.student.id}/{assignment.name}/{snb.name}.ipynb"
                            if cell.name in auto_idx else "",
                            "autograded_index": auto_idx.get(cell.name, ""),
                        })
    return rows


def write_cell_csv(rows: list[dict], dest: Path) -> Path:
    """The per-cell table as CSV, through the course's writer (quoting and the formula guard of
    :func:`.csv_export.safe_cell`: a student id or grade id a spreadsheet would run stays text)."""
    from .csv_export import writer

    with open(dest, "w", newline="", encoding="utf-8") as fh:
        out = writer(fh)
        out.writerow(CELL_COLUMNS)
        out.writerows([row[k] for k in CELL_COLUMNS] for row in rows)
    return dest


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


# ------------------------------------------------------------------------------------ the command
def backup(root=None, db_url: str | None = None, out: str | os.PathLike | None = None) -> Path:
    """Snapshot the gradebook and write both CSVs and a manifest; returns the backup folder."""
    import nbgrader

    pipeline = _pipeline()
    root = pipeline.course_root(root)
    pipeline.ensure_venv_on_path()
    db_url = sqlalchemy_url(db_url or pipeline.default_db_url(root))
    stamp = _dt.datetime.now(_dt.timezone.utc).strftime("%Y%m%dT%H%M%S.%fZ")
    folder = Path(out) if out is not None else root / "backups" / stamp
    folder.mkdir(parents=True, exist_ok=False)
    live = sqlite_file(db_url)
    if live is not None:
        snap = snapshot_sqlite(live, folder / "gradebook.sqlite")
        read_url = "sqlite:///" + str(snap)
    else:
        snap = snapshot_postgres(db_url, folder / "gradebook.pgdump")
        read_url = db_url  # pg_dump is consistent; the CSVs come from the same server
    export_assignment_csv(read_url, pipeline.COURSE_ID, folder / "grades.csv")
    from ..grader import safe_files

    safe_files.add_course_root(root)
    refused: list = []
    rows = cell_rows(read_url, pipeline.COURSE_ID, root, refused)
    write_cell_csv(rows, folder / "grades_by_cell.csv")
    files = {p.name: {"sha256": _sha256(p), "bytes": p.stat().st_size} for p in sorted(folder.iterdir())}
    manifest = {
        "created_utc": stamp,
        "course_id": pipeline.COURSE_ID,
        "gradebook": redact(db_url),
        "snapshot": snap.name,
        "nbgrader_version": nbgrader.__version__,
        "cell_rows": len(rows),
        # autograded notebooks not read (a link, a FIFO ... in a student folder): never followed
        "refused": sorted(set(refused)),
        "files": files,
    }
    (folder / "MANIFEST.json").write_text(json.dumps(manifest, indent=1) + "\n")
    return folder


def verify_backup(folder: str | os.PathLike, root=None) -> list[str]:
    """Problems with a backup folder (empty list: the backup is complete and consistent).

    Checks the manifest's hashes, that the SQLite snapshot opens and passes ``integrity_check``,
    that ``grades_by_cell.csv`` sums to ``grades.csv`` per student and assignment (its score and
    its points still waiting for a grader; ``auto_score + manual_score == raw_score``), that every
    cell row points at a cell of ``source/`` with that ``grade_id`` and, for test cells, that the
    cell's nbgrader checksum still equals the one the gradebook graded with.
    """
    import nbformat
    from nbgrader.utils import compute_checksum

    pipeline = _pipeline()
    root = pipeline.course_root(root)
    folder = Path(folder)
    problems = []
    manifest = json.loads((folder / "MANIFEST.json").read_text())
    for name, meta in manifest["files"].items():
        path = folder / name
        if not path.exists():
            problems.append(f"{name} is missing")
        elif _sha256(path) != meta["sha256"]:
            problems.append(f"{name} does not match its SHA-256 in MANIFEST.json")
    snap = folder / manifest["snapshot"]
    if snap.suffix == ".sqlite":
        con = sqlite3.connect(f"file:{snap}?mode=ro", uri=True)
        try:
            if con.execute("PRAGMA integrity_check").fetchone()[0] != "ok":
                problems.append("the SQLite snapshot fails integrity_check")
        finally:
            con.close()
    with open(folder / "grades.csv", newline="", encoding="utf-8") as fh:
        summary = list(csv.DictReader(fh))
    totals = {(r["student_id"], r["assignment"]): float(r["raw_score"] or 0) for r in summary}
    # backups written before grades.csv carried these columns have none of them
    waiting = {(r["student_id"], r["assignment"]): float(r["pending_manual_points"] or 0) for r in summary
               if r.get("pending_manual_points") is not None}
    for r in summary:
        if r.get("auto_score") is not None and r.get("manual_score") is not None and \
                abs(float(r["auto_score"] or 0) + float(r["manual_score"] or 0) - float(r["raw_score"] or 0)) > 1e-9:
            problems.append(f"{(r['student_id'], r['assignment'])}: auto_score + manual_score is not raw_score "
                            "in grades.csv")
    with open(folder / "grades_by_cell.csv", newline="", encoding="utf-8") as fh:
        rows = list(csv.DictReader(fh))
    sums: dict = {}
    possible: dict = {}
    pending: dict = {}
    notebooks: dict = {}
    for r in rows:
        key = (r["student"], r["assignment"])
        sums[key] = sums.get(key, 0.0) + float(r["score"])
        possible[key] = possible.get(key, 0.0) + float(r["max_score"] or 0)
        if r["needs_manual_grade"] == "True" and r["manual_score"] == "":
            pending[key] = pending.get(key, 0.0) + float(r["max_score"] or 0)
        src = root / r["source_file"]
        if src not in notebooks:
            notebooks[src] = nbformat.read(str(src), as_version=4) if src.exists() else None
        nb = notebooks[src]
        if nb is None:
            problems.append(f"{r['source_file']} (for {r['grade_id']}) does not exist")
            continue
        idx = int(r["source_index"]) if r["source_index"] != "" else -1
        if not (0 <= idx < len(nb.cells)) or \
                nb.cells[idx].get("metadata", {}).get("nbgrader", {}).get("grade_id") != r["grade_id"]:
            problems.append(f"{r['student']}/{r['assignment']}/{r['grade_id']}: source_index {idx} is not that cell")
        elif r["kind"] == "test" and compute_checksum(nb.cells[idx]) != r["checksum"]:
            problems.append(f"{r['student']}/{r['assignment']}/{r['grade_id']}: the test cell in source/ changed "
                            "since it was graded (checksum differs)")
    for key, total in totals.items():
        if abs(sums.get(key, 0.0) - total) > 1e-9:
            problems.append(f"{key}: cells add up to {sums.get(key, 0.0)}, grades.csv says {total}")
    for key, points in waiting.items():
        if abs(pending.get(key, 0.0) - points) > 1e-9:
            problems.append(f"{key}: {pending.get(key, 0.0)} points wait for a grader in grades_by_cell.csv, "
                            f"grades.csv says {points}")
    for key in sums:
        # grades.csv has no rows for an assignment without points (max_score 0, csv_export.graded)
        if key not in totals and (possible.get(key) or sums[key]):
            problems.append(f"{key}: in grades_by_cell.csv but not in grades.csv")
    return problems


def restore(folder: str | os.PathLike, root=None, db_url: str | None = None) -> Path | str:
    """Put a backup back: the SQLite snapshot replaces the gradebook file (the current file is kept
    beside it as ``<name>.before-restore``), or ``pg_restore --clean`` for a PostgreSQL dump."""
    pipeline = _pipeline()
    root = pipeline.course_root(root)
    folder = Path(folder)
    db_url = sqlalchemy_url(db_url or pipeline.default_db_url(root))
    manifest = json.loads((folder / "MANIFEST.json").read_text())
    snap = folder / manifest["snapshot"]
    live = sqlite_file(db_url)
    if snap.suffix == ".sqlite":
        if live is None:
            raise ValueError("a SQLite snapshot can only be restored into a sqlite:/// gradebook")
        if live.exists():
            shutil.copy2(live, live.with_name(live.name + ".before-restore"))
        with tempfile.TemporaryDirectory(dir=live.parent) as tmp:
            staged = snapshot_sqlite(snap, Path(tmp) / live.name)
            os.replace(staged, live)
        return live
    pg_restore = shutil.which("pg_restore") or _pg_tool("pg_restore")
    if not pg_restore:
        raise FileNotFoundError("pg_restore is not installed")
    args, env = _pg_env(db_url)
    subprocess.run([pg_restore, "--clean", "--if-exists", "--no-owner", *args, str(snap)], check=True, env=env,
                   capture_output=True, text=True)
    return redact(db_url)


def _main(argv=None) -> int:
    import argparse

    parser = argparse.ArgumentParser(description="Back up the gradebook and export it to CSV")
    parser.add_argument("--root", default=None, help="course root (default: the repository)")
    parser.add_argument("--db", default=None, help="gradebook URL (default: the course's SQLite file)")
    parser.add_argument("--out", default=None, help="backup folder (default: backups/<UTC time>)")
    parser.add_argument("--verify", metavar="FOLDER", help="check an existing backup instead")
    parser.add_argument("--restore", metavar="FOLDER", help="put a backup back into the gradebook")
    args = parser.parse_args(argv)
    if args.verify:
        problems = verify_backup(args.verify, args.root)
        for p in problems:
            print("PROBLEM:", p)
        print("backup OK" if not problems else f"{len(problems)} problem(s)")
        return 1 if problems else 0
    if args.restore:
        where = restore(args.restore, args.root, args.db)
        print(f"restored {args.restore} into {where}")
        return 0
    folder = backup(args.root, args.db, args.out)
    problems = verify_backup(folder, args.root)
    manifest = json.loads((folder / "MANIFEST.json").read_text())
    print(f"backup written to {folder}: {manifest['snapshot']}, grades.csv, grades_by_cell.csv "
          f"({manifest['cell_rows']} graded cells), MANIFEST.json")
    for message in manifest.get("refused", []):
        print("NOT READ:", message)
    for p in problems:
        print("PROBLEM:", p)
    return 1 if problems else 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(_main())
