"""The course-local nbgrader exchange: create it, release into it, submit and collect through it.

nbgrader moves assignments between instructor and students through an *exchange* folder:
``release_assignment`` copies ``release/A`` to ``<exchange>/<course>/outbound/A``, a student's
``fetch_assignment`` copies it into their folder, ``submit`` copies their work to
``<exchange>/<course>/inbound/<student>+A+<timestamp>+<random>`` (adding ``timestamp.txt`` and
``submission_secret.txt``), and ``collect`` copies the latest submission of each student into
``submitted/<student>/A/``. Feedback goes back the same way (``release_feedback`` /
``fetch_feedback``).

The exchange of this course is ``<course root>/exchange`` unless ``$RLHF_EXCHANGE`` names another
folder (``nbgrader_config.py`` reads the same variable, so the command line, Formgrader and the
students' Assignment List all agree). :func:`ensure_exchange` (``python -m
rlhf_lab.instructor.operations.exchange init``, ``make exchange``) creates it with mode ``drwxrwxrwx``, the
mode nbgrader checks, and refuses system folders (``/usr``, ``/etc``, ``/var`` ...) unless told
``--allow-system``: nbgrader's own default, ``/usr/local/share/nbgrader/exchange``, is never used
by accident.

Every function runs nbgrader's own command (:func:`rlhf_lab.instructor.classrun.pipeline.run_nbgrader`)
and returns its :class:`~rlhf_lab.instructor.classrun.pipeline.CommandRun`; :func:`submit_as` submits a
folder as a given student (``nbgrader submit --student``), with a private nbgrader cache per
student, which is how the demo hands in the bundled class.

Command line::

    python -m rlhf_lab.instructor.operations.exchange init [--path DIR] [--allow-system]
    python -m rlhf_lab.instructor.operations.exchange where
"""
from __future__ import annotations

import argparse
import os
import shutil
import stat
import sys
from pathlib import Path

from ..classrun.pipeline import COURSE_ID, CommandRun, PipelineError, course_root, run_nbgrader

ENV_VAR = "RLHF_EXCHANGE"
#: The mode nbgrader's ``release_assignment`` expects of the exchange root (it changes any other).
EXCHANGE_MODE = 0o777
#: Folders an exchange is never created under without ``allow_system``.
SYSTEM_PREFIXES = ("/usr", "/etc", "/var", "/opt", "/srv", "/bin", "/sbin", "/lib", "/lib64",
                   "/boot", "/proc", "/sys", "/dev", "/run")
#: Files nbgrader's ``submit`` adds to every submission (the integrity pre-flight expects them).
EXCHANGE_FILES = ("timestamp.txt", "submission_secret.txt")


class ExchangeError(PipelineError):
    """The exchange cannot be used as asked (system folder, wrong permissions, nbgrader refused)."""


def exchange_root(root=None) -> Path:
    """The exchange folder of the course at ``root``: ``$RLHF_EXCHANGE`` if set, else ``<root>/exchange``."""
    env = os.environ.get(ENV_VAR)
    return Path(env).resolve() if env else course_root(root) / "exchange"


def is_system_path(path: str | os.PathLike) -> bool:
    """Whether ``path`` lies under one of :data:`SYSTEM_PREFIXES` (``/`` itself included)."""
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"path must be a path, got {type(path).__name__}")
    p = Path(path).resolve()
    if p == Path("/"):
        return True
    return any(p == Path(prefix) or Path(prefix) in p.parents for prefix in SYSTEM_PREFIXES)


def ensure_exchange(root=None, path: str | os.PathLike | None = None, allow_system: bool = False) -> Path:
    """Create the exchange (default :func:`exchange_root`) with mode ``drwxrwxrwx``; return it.

    An existing folder is kept and its mode set to what nbgrader expects. Raises
    :class:`ExchangeError` for a folder under a system prefix unless ``allow_system``, and for a
    path that exists but is not a folder.
    """
    if not isinstance(allow_system, bool):
        raise TypeError(f"allow_system must be True or False, got {allow_system!r}")
    target = Path(path).resolve() if path is not None else exchange_root(root)
    if is_system_path(target) and not allow_system:
        raise ExchangeError(f"refusing to use the system folder {target} as the exchange; set "
                            f"${ENV_VAR} to a folder of the course or pass --allow-system")
    if target.exists() and not target.is_dir():
        raise ExchangeError(f"the exchange {target} exists but is not a folder")
    target.mkdir(parents=True, exist_ok=True)
    if stat.S_IMODE(target.stat().st_mode) != EXCHANGE_MODE:
        target.chmod(EXCHANGE_MODE)  # mkdir applies the umask; nbgrader wants exactly 0777
    return target


def _exchange_args(exchange: Path | None) -> list[str]:
    return [f"--Exchange.root={exchange}"] if exchange is not None else []


def release(assignment: str, root=None, db_url: str | None = None, exchange: Path | None = None) -> CommandRun:
    """``nbgrader release_assignment A --force``: ``release/A`` -> ``<exchange>/<course>/outbound/A``."""
    _check_name("assignment", assignment)
    ensure_exchange(root, exchange)
    return _ok(run_nbgrader(["release_assignment", assignment, "--force", *_exchange_args(exchange)], root, db_url),
               f"release_assignment {assignment}")


def fetch(assignment: str, home: str | os.PathLike, root=None, exchange: Path | None = None) -> CommandRun:
    """``nbgrader fetch_assignment A`` into the student folder ``home`` (creates ``home/A/``)."""
    _check_name("assignment", assignment)
    home = Path(home).resolve()
    home.mkdir(parents=True, exist_ok=True)
    args = ["fetch_assignment", assignment, f"--Exchange.assignment_dir={home}",
            f"--Exchange.cache={home / '.nbgrader_cache'}", *_exchange_args(exchange)]
    return _ok(run_nbgrader(args, root), f"fetch_assignment {assignment} into {home}")


def submit_as(assignment: str, student: str, home: str | os.PathLike, root=None,
              exchange: Path | None = None) -> CommandRun:
    """``nbgrader submit A --student ID`` of ``home/A/``, with the student's own nbgrader cache.

    The student id must not contain ``+`` or ``*`` (nbgrader's separators); nbgrader refuses those.
    """
    _check_name("assignment", assignment)
    _check_name("student", student)
    home = Path(home).resolve()
    if not (home / assignment).is_dir():
        raise ExchangeError(f"student {student}: nothing to submit, {home / assignment} is not a folder")
    args = ["submit", assignment, "--student", student, f"--Exchange.assignment_dir={home}",
            f"--Exchange.cache={home / '.nbgrader_cache'}", *_exchange_args(exchange)]
    return _ok(run_nbgrader(args, root), f"submit {assignment} as {student}")


def course_config(root=None, db_url: str | None = None):
    """The course's ``nbgrader_config.py`` loaded as nbgrader loads it (for in-process exchange calls)."""
    from traitlets.config.loader import PyFileConfigLoader

    root = course_root(root)
    saved = dict(os.environ)
    try:
        os.environ["RLHF_COURSE_ROOT"] = str(root)
        if db_url:
            os.environ["RLHF_COURSE_DB"] = db_url
        return PyFileConfigLoader("nbgrader_config.py", path=str(root)).load_config()
    finally:
        os.environ.clear()
        os.environ.update(saved)


def submit_many(assignment: str, homes: dict, root=None, exchange: Path | None = None) -> dict:
    """Submit ``{student: home}`` (each ``home/A/``) with nbgrader's own submit, in this process.

    Each student goes through :class:`nbgrader.exchange.default.submit.ExchangeSubmit` (the class
    ``nbgrader submit --student ID`` runs) with their own cache; starting one nbgrader process
    per student would cost a few seconds each. Returns ``{student: None or error message}``: a
    student whose submission nbgrader refuses fails alone.
    """
    import logging

    from nbgrader.auth import Authenticator
    from nbgrader.coursedir import CourseDirectory
    from nbgrader.exchange import ExchangeError as NbExchangeError
    from nbgrader.exchange.default.submit import ExchangeSubmit
    from traitlets.config import Config

    _check_name("assignment", assignment)
    if not isinstance(homes, dict):
        raise TypeError(f"homes must be a dict {{student: folder}}, got {type(homes).__name__}")
    base = course_config(root)
    log = logging.getLogger("rlhf_lab.exchange.submit")
    log.propagate = False
    log.addHandler(logging.NullHandler())
    out = {}
    for student, home in sorted(homes.items()):
        _check_name("student", student)
        home = Path(home).resolve()
        cfg = Config()
        cfg.merge(base)
        cfg.CourseDirectory.assignment_id = assignment
        cfg.CourseDirectory.student_id = student
        cfg.Exchange.assignment_dir = str(home)
        cfg.Exchange.cache = str(home / ".nbgrader_cache")
        if exchange is not None:
            cfg.Exchange.root = str(exchange)
        coursedir = CourseDirectory(config=cfg, log=log)
        try:
            if not (home / assignment).is_dir():
                raise NbExchangeError(f"{home / assignment} is not a folder")
            ExchangeSubmit(coursedir=coursedir, authenticator=Authenticator(config=cfg, log=log),
                           config=cfg, log=log).start()
            out[student] = None
        except (NbExchangeError, OSError, RuntimeError) as exc:
            out[student] = f"student {student}: nbgrader submit failed: {exc}"
    return out


def collect(assignment: str, root=None, db_url: str | None = None, exchange: Path | None = None,
            check_owner: bool = True) -> CommandRun:
    """``nbgrader collect A --update``: the latest submission of each student into ``submitted/``.

    The course's collect (``c.ExchangeFactory.collect`` in ``nbgrader_config.py``) checks each
    submission folder's Unix owner itself: a folder owned by the student's account or by the
    account collecting (``nbgrader submit --student`` from the instructor's account, as the demo
    and the tests hand the class in) is not reported; one owned by any other account is, as a
    warning saying another account submitted in that student's name
    (:func:`rlhf_lab.instructor.grader.preflight_hook.submission_owner_problem`).
    ``check_owner=False`` switches that check off too.
    """
    _check_name("assignment", assignment)
    args = ["collect", assignment, "--update", *_exchange_args(exchange)]
    if not check_owner:
        args.append("--ExchangeCollect.check_owner=False")
    return _ok(run_nbgrader(args, root, db_url), f"collect {assignment}")


def unsafe_feedback(assignment: str, root=None) -> dict:
    """``{student: [messages]}``: students whose ``feedback/<student>/<assignment>/`` must not be
    released, because it (or the student's folder) is a link, or it holds a link, a FIFO, a socket,
    a device, a hard link or an oversized file (:func:`.safe_files.check_no_links`). Nothing is
    followed or opened to find out."""
    from ..grader import safe_files

    _check_name("assignment", assignment)
    base = course_root(root) / "feedback"
    safe_files.add_course_root(course_root(root))
    out: dict = {}
    for entry in sorted(os.listdir(base)) if base.is_dir() and not base.is_symlink() else []:
        student_dir = base / entry
        folder = student_dir / assignment
        if student_dir.is_symlink() or not student_dir.is_dir():
            out[entry] = [safe_files.refusal(student_dir, os.lstat(student_dir)).message
                          if student_dir.is_symlink() else f"student {entry!r}: feedback/{entry} is not a folder"]
            continue
        if not os.path.lexists(folder):
            continue
        found = safe_files.check_no_links(folder)
        if found:
            out[entry] = [r.message for r in found]
    return out


def release_feedback(assignment: str, root=None, db_url: str | None = None,
                     exchange: Path | None = None, refused: dict | None = None) -> CommandRun:
    """``nbgrader release_feedback A``: every ``feedback/<student>/A/`` into the exchange.

    Students whose feedback folder is not plain files only (:func:`unsafe_feedback`) are left out
    (``--CourseDirectory.student_id_exclude``) and, when ``refused`` is a dict, listed there with
    the reasons; the others are released. (The course's release plugin, installed by
    ``nbgrader_config.py``, checks the same again, file by file, for bare ``nbgrader release_feedback``.)
    """
    _check_name("assignment", assignment)
    bad = unsafe_feedback(assignment, root)
    if refused is not None:
        refused.update(bad)
    for student, messages in sorted(bad.items()):
        for message in messages:
            print(f"release_feedback: NOT released: {message}", file=sys.stderr)
    args = ["release_feedback", assignment, *_exchange_args(exchange)]
    if bad:
        args.append("--CourseDirectory.student_id_exclude=" + ",".join(sorted(bad)))
    return _ok(run_nbgrader(args, root, db_url), f"release_feedback {assignment}")


def fetch_feedback(assignment: str, student: str, home: str | os.PathLike, root=None,
                   exchange: Path | None = None) -> CommandRun:
    """``nbgrader fetch_feedback A --student ID`` into ``home/A/feedback/`` (needs the student's cache)."""
    _check_name("assignment", assignment)
    _check_name("student", student)
    home = Path(home).resolve()
    args = ["fetch_feedback", assignment, "--student", student, f"--Exchange.assignment_dir={home}",
            f"--Exchange.cache={home / '.nbgrader_cache'}", *_exchange_args(exchange)]
    return _ok(run_nbgrader(args, root), f"fetch_feedback {assignment} as {student}")


def inbound(assignment: str | None = None, root=None, exchange: Path | None = None) -> list[str]:
    """Names of the submissions waiting in ``inbound/`` (``student+assignment+timestamp+random``)."""
    folder = (exchange or exchange_root(root)) / COURSE_ID / "inbound"
    if not folder.is_dir():
        return []
    return sorted(p.name for p in folder.iterdir() if assignment is None or p.name.split("+")[1:2] == [assignment])


def forget_students(students, root=None, exchange: Path | None = None) -> int:
    """Remove the inbound submissions of ``students`` (the demo's own earlier run); other
    students' submissions are never touched. Returns how many were removed."""
    students = set(students)
    folder = (exchange or exchange_root(root)) / COURSE_ID / "inbound"
    removed = 0
    for p in sorted(folder.iterdir()) if folder.is_dir() else []:
        if p.name.split("+", 1)[0] in students:
            # a link (or a file) planted in inbound/ is removed itself, never what it points to
            shutil.rmtree(p) if p.is_dir() and not p.is_symlink() else p.unlink()
            removed += 1
    return removed


def _check_name(what: str, value) -> None:
    if not isinstance(value, str) or not value or "/" in value or value in (".", ".."):
        raise ValueError(f"{what} must be a non-empty name without '/', got {value!r}")
    if what == "student" and ("+" in value or "*" in value):
        raise ValueError(f"student id {value!r} contains '+' or '*', which nbgrader's exchange cannot store")


def _ok(run: CommandRun, what: str) -> CommandRun:
    if not run.ok:
        detail = "\n".join(run.errors()) or run.output[-2000:]
        raise ExchangeError(f"nbgrader {what} failed (exit {run.returncode}):\n{detail}")
    return run


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m rlhf_lab.instructor.operations.exchange",
                                     description="Create or locate the course's nbgrader exchange.")
    sub = parser.add_subparsers(dest="command", required=True)
    init = sub.add_parser("init", help="create the exchange folder with the permissions nbgrader expects")
    init.add_argument("--path", type=Path, help=f"the folder (default ${ENV_VAR} or <course>/exchange)")
    init.add_argument("--allow-system", action="store_true", help="allow a folder under /usr, /var, /srv ...")
    sub.add_parser("where", help="print the exchange folder nbgrader will use")
    args = parser.parse_args(argv)
    if args.command == "where":
        print(exchange_root())
        return 0
    try:
        path = ensure_exchange(path=args.path, allow_system=args.allow_system)
    except ExchangeError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"exchange ready: {path} (drwxrwxrwx); students fetch from {path / COURSE_ID / 'outbound'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
