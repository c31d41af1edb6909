"""JupyterLab for one roster student on a shared machine, without a hub (``make student-lab STUDENT=<id>``).

Several students on one login (a demo, a small lab) must not share anything Jupyter or nbgrader
keeps per user: nbgrader's cache (its feedback cache put classmates' feedback into a third
student's folder), JupyterLab's workspace (one student's lab reopened another's notebook) and
settings, IPython's history, the notebook trust database. So every student gets a **private home**
(default ``~/rlhf-students/<id>``, mode 0700, ``--homes`` to change the parent) and every one of
those locations points into it::

    <home>/work/                 the lab's root folder: fetched assignments, the student's files
    <home>/jupyter/config/       JUPYTER_CONFIG_DIR: a fresh copy of the course's jupyter/student/
    <home>/jupyter/data/         JUPYTER_DATA_DIR: nbgrader's cache (nbgrader_cache/), trust db
    <home>/jupyter/runtime/      JUPYTER_RUNTIME_DIR
    <home>/jupyter/lab/          JUPYTERLAB_WORKSPACES_DIR (workspaces/), JUPYTERLAB_SETTINGS_DIR (user-settings/)
    <home>/ipython/              IPYTHONDIR (history)

``HOME`` is the private home too (caches of matplotlib and others). ``RLHF_STUDENT_ID`` is the id
(the course's student configuration files submissions under it, ``jupyter/student/nbgrader_config.py``),
``RLHF_EXCHANGE`` the course's exchange (``$RLHF_EXCHANGE`` or ``<course>/exchange``). When a student
build of the library exists (:mod:`.student_library`, ``$RLHF_STUDENT_LIB``), ``PYTHONPATH`` points
at it, so the student's kernels import it instead of the full library.

The id must be in the roster (``--roster``, else ``$RLHF_ROSTER``, else ``roster.csv``, else
``examples/roster.csv``); any other id is refused with the roster's name. Nothing is written into
the repository (the private home may not lie inside it). One login is not a privacy boundary: a
student can still read the course folder and the other homes with the shell; the hub is.

Command line::

    python -m rlhf_lab.instructor.operations.student_lab ID [--roster CSV] [--homes DIR] [--dry-run] [LAB ARGS...]

``--dry-run`` prepares the home and prints the environment and the command without starting JupyterLab.
"""
from __future__ import annotations

import argparse
import csv
import os
import shlex
import shutil
import sys
from pathlib import Path

from ..course import REPO_ROOT, course_root
from . import student_library
from .exchange import exchange_root
from .roster import id_problem, roster_path

#: Environment variables :func:`environment` sets (the rest of the environment is passed on).
SET_VARS = ("HOME", "RLHF_STUDENT_ID", "RLHF_EXCHANGE", "JUPYTER_CONFIG_DIR", "JUPYTER_DATA_DIR",
            "JUPYTER_RUNTIME_DIR", "JUPYTERLAB_WORKSPACES_DIR", "JUPYTERLAB_SETTINGS_DIR", "IPYTHONDIR",
            "MPLCONFIGDIR", "PYTHONPATH", "JUPYTER_PATH")
#: What JupyterLab writes into its config dir at run time: never copied from the course's folder.
RUNTIME_FILES = ("lab", "migrated", "__pycache__")


class StudentLabError(RuntimeError):
    """The lab cannot be started for this student (message for the person who typed the command)."""


def default_homes() -> Path:
    return Path(os.path.expanduser("~")) / "rlhf-students"


def roster_students(path: Path) -> dict[str, str]:
    """``{id: "First Last"}`` of the roster CSV (the columns :mod:`.roster` checks)."""
    try:
        with open(path, newline="", encoding="utf-8-sig") as fh:
            rows = list(csv.DictReader(fh))
    except OSError as exc:
        raise StudentLabError(f"cannot read the roster {path}: {exc.strerror}") from None
    out = {}
    for row in rows:
        sid = (row.get("id") or "").strip()
        if sid:
            out[sid] = " ".join(p for p in ((row.get("first_name") or "").strip(),
                                            (row.get("last_name") or "").strip()) if p)
    return out


def resolve_student(student: str, roster: Path | None = None, root=None) -> tuple[str, str, Path]:
    """(id, name, roster file) for a roster student; :class:`StudentLabError` for anyone else."""
    path = Path(roster).resolve() if roster else roster_path(root)
    if not path.is_file():
        raise StudentLabError(f"no roster at {path}: name one with ROSTER=path/to/roster.csv (or $RLHF_ROSTER)")
    students = roster_students(path)
    if student not in students:
        known = ", ".join(sorted(students)[:8]) + (", ..." if len(students) > 8 else "")
        raise StudentLabError(f"{student!r} is not in the roster {path} ({len(students)} students: {known}); "
                              "add them there, or use an id from it")
    why = id_problem(student)
    if why:  # a roster that never passed `make roster`: the id would name a folder
        raise StudentLabError(f"{student!r} in the roster {path} is not a valid student id: it {why}")
    return student, students[student], path


def _inside(path: Path, folder: Path) -> bool:
    try:
        path.resolve().relative_to(folder.resolve())
        return True
    except ValueError:
        return False


def home_of(student: str, homes=None) -> Path:
    return (Path(homes).expanduser() if homes else default_homes()).absolute() / student


def environment(student: str, home: Path, root=None, student_lib=None, base=None) -> dict[str, str]:
    """The lab's environment: ``base`` (default ``os.environ``) with :data:`SET_VARS` set for this student."""
    env = dict(os.environ if base is None else base)
    jup = home / "jupyter"
    env.update({
        "HOME": str(home), "RLHF_STUDENT_ID": student, "RLHF_EXCHANGE": str(exchange_root(root)),
        "JUPYTER_CONFIG_DIR": str(jup / "config"), "JUPYTER_DATA_DIR": str(jup / "data"),
        "JUPYTER_RUNTIME_DIR": str(jup / "runtime"),
        "JUPYTERLAB_WORKSPACES_DIR": str(jup / "lab" / "workspaces"),
        "JUPYTERLAB_SETTINGS_DIR": str(jup / "lab" / "user-settings"),
        "IPYTHONDIR": str(home / "ipython"), "MPLCONFIGDIR": str(home / "matplotlib"),
    })
    for var in ("PYTHONPATH", "JUPYTER_PATH"):
        env.pop(var, None)
    lib = Path(student_lib) if student_lib is not None else student_library.default_dest()
    if (lib / "rlhf_lab" / "__init__.py").is_file() and (lib / student_library.MARKER).is_file():
        env.update(student_library.student_env(lib))
    return env


def prepare_home(home: Path, root=None) -> None:
    """Create the private home (0700) and its folders; refresh the copy of the course's student config."""
    root = course_root(root)
    for folder in (root, REPO_ROOT):
        if _inside(home, folder):
            raise StudentLabError(f"the student's home {home} is inside {folder}: nothing of a student's lab "
                                  "may be written into the course folder; choose --homes elsewhere")
    try:
        home.parent.mkdir(parents=True, exist_ok=True)
        home.mkdir(mode=0o700, exist_ok=True)
        os.chmod(home, 0o700)
        for sub in ("work", "jupyter/data", "jupyter/runtime", "jupyter/lab/workspaces",
                    "jupyter/lab/user-settings", "ipython", "matplotlib"):
            (home / sub).mkdir(parents=True, exist_ok=True)
        shutil.copytree(root / "jupyter" / "student", home / "jupyter" / "config", dirs_exist_ok=True,
                        ignore=shutil.ignore_patterns(*RUNTIME_FILES))
    except OSError as exc:
        raise StudentLabError(f"cannot prepare the student's home {home}: {exc}") from None


def command(home: Path, lab_args=()) -> list[str]:
    jupyter = str(Path(sys.executable).parent / "jupyter")
    return [jupyter, "lab", f"--ServerApp.root_dir={home / 'work'}", *lab_args]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m rlhf_lab.instructor.operations.student_lab",
                                     description="JupyterLab for one roster student, in a private home.")
    parser.add_argument("student", nargs="?", help="the student's id (from the roster)")
    parser.add_argument("--roster", type=Path, help="roster CSV (default $RLHF_ROSTER, roster.csv, examples/roster.csv)")
    parser.add_argument("--homes", type=Path, help=f"parent of the private homes (default {default_homes()})")
    parser.add_argument("--student-lib", type=Path, help="the student build of rlhf_lab (default $RLHF_STUDENT_LIB "
                                                         f"or {student_library.DEFAULT_DEST})")
    parser.add_argument("--dry-run", action="store_true", help="prepare the home, print environment and command, "
                                                               "start nothing")
    args, lab_args = parser.parse_known_args(argv)
    lab_args = [a for a in lab_args if a != "--"]
    if not args.student:
        print("student-lab: name the student: make student-lab STUDENT=<id from the roster>", file=sys.stderr)
        return 2
    try:
        sid, name, roster = resolve_student(args.student, args.roster)
        home = home_of(sid, args.homes)
        prepare_home(home)
    except StudentLabError as exc:
        print(f"student-lab: {exc}", file=sys.stderr)
        return 2
    env = environment(sid, home, student_lib=args.student_lib)
    cmd = command(home, lab_args)
    print(f"student-lab: submitting as {sid}" + (f" ({name})" if name else "") + f", from the roster {roster}")
    print(f"  private home {home} (mode 0700): work in {home / 'work'}")
    if "PYTHONPATH" in env:
        print(f"  course library: the student build {env['PYTHONPATH']}")
    else:
        lib = args.student_lib or student_library.default_dest()
        print(f"  course library: the full one (no student build at {lib}: "
              "python -m rlhf_lab.instructor.operations.student_library build)")
    if args.dry_run:
        for var in SET_VARS:
            if var in env:
                print(f"{var}={shlex.quote(env[var])}")
        print(shlex.join(cmd))
        return 0
    sys.stdout.flush()
    os.chdir(home / "work")
    os.execve(cmd[0], cmd, env)
    return 0  # pragma: no cover (execve does not return)


if __name__ == "__main__":
    sys.exit(main())
