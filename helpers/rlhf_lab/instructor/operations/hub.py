"""The course on one server: a real JupyterHub with one Linux account per student (``make hub``).

Three commands (run as root, from the course's venv)::

    python -m rlhf_lab.instructor.operations.hub users   # make hub-users: accounts, course root, exchange
    python -m rlhf_lab.instructor.operations.hub check   # what `serve` would refuse, changing nothing
    python -m rlhf_lab.instructor.operations.hub serve   # make hub: JupyterHub on 127.0.0.1:$HUB_PORT

**Accounts** (``users``). Every id of the roster (``roster.csv``, ``ROSTER=path`` or ``$RLHF_ROSTER``,
read and checked by :func:`.roster.check_roster`, so a bad id is reported with its line) becomes a
Linux user (``useradd``, home ``/home/<id>`` mode 0700) with a random password, set with
``chpasswd`` and written once to a file of mode 0600 in the hub's state folder (outside the
repository), which the person running the command hands out. The instructor/grader account
(``instructor``, ``$RLHF_HUB_INSTRUCTOR``) is created the same way and owns the course root
(``/srv/rlhf-course``, ``$RLHF_HUB_COURSE``; mode 0700, seeded with the course's ``source/`` and
``release/`` when it has none). An account that already exists is reused as it is: its password and
home are never touched.

**The exchange** (outside every home and the course root: ``/srv/nbgrader/exchange``,
``$RLHF_EXCHANGE``) gets exactly the modes nbgrader's own ``release_assignment``/``submit``/
``release_feedback`` create and check (``nbgrader/exchange/default/*.py``), plus sticky bits so that
nobody renames or deletes what another account made:

=======================  ==========  =========  ===========================================
path                     owner       mode       why
=======================  ==========  =========  ===========================================
parent of the exchange   root        0755       nobody but root can replace the exchange
exchange                 root        1777       nbgrader checks ``& 0o777 == 0o777``; sticky:
                                                no student renames the course folder
``<course>``             instructor  0755       ``release_assignment`` refuses a folder it
                                                does not own
``<course>/outbound``    instructor  0755       students read released assignments
``<course>/inbound``     instructor  3733       write-only for students (no listing), setgid
                                                as nbgrader makes it, sticky: no student
                                                renames or deletes a classmate's submission;
                                                default ACL: the instructor alone reads what is
                                                submitted (see :data:`PRIVATE_SUBMIT`)
``<course>/feedback``    instructor  0711       feedback files are named by a hash of the
                                                submission; nobody can list them, and each
                                                is readable by its student's account alone
                                                (an ACL entry: ``private_to_student``)
=======================  ==========  =========  ===========================================

Every ``users``, ``check`` and ``serve`` checks the whole tree (:func:`exchange_problems`): a mode
looser than the table is repaired to it (as root), an owner that is not the table's is refused
(whoever made that folder may have put something in it), nothing is ever loosened.

**The hub** (``serve``, config ``hub/jupyterhub_config.py``): JupyterHub on 127.0.0.1 (``$HUB_PORT``,
default 8000; the proxy's API on the next port, the hub itself on the one after), the Python
``configurable-http-proxy`` from the course's venv, and :class:`RosterPAMAuthenticator`. PAM and not
NativeAuthenticator: the class works offline, there is no sign-up flow to police (the roster *is*
the class list), and the Linux accounts must exist anyway, because each student's server runs as
their own OS user (``LocalProcessSpawner``, ``jupyterhub-singleuser`` of the course venv) and
nbgrader's exchange relies on Unix ownership. A Linux account that is not on the roster (and not the
instructor) logs in correctly and gets a page saying it is not on the roster, never a server.

nbgrader's JupyterHub integration: the groups ``nbgrader-<course>`` (students and instructor) and
``formgrade-<course>`` (instructor and graders, ``$RLHF_HUB_GRADERS``) are loaded by the hub config,
and every server's nbgrader uses ``JupyterHubAuthPlugin``, so the Assignment List and Formgrader's
course list come from the hub. Formgrader runs on the instructor's own server, rooted at the course
root: the instructor account owns the course root (0700), so only a process of that account can read
the gradebook and ``source/``; a separate hub service (nbgrader's multi-grader demo) would run as
that same account anyway, with an admin token in the config and a second server to keep alive.
Students' servers have Formgrader and Create Assignment switched off (the course's
``jupyter/student`` config). The per-role Jupyter configs are written under the state folder
(``/srv/rlhf-hub``, ``$RLHF_HUB_STATE``; the hub's database, cookie secret and proxy token are in its
``private/``, mode 0700) and
handed to each server with ``JUPYTER_CONFIG_PATH``; each user's own settings and workspaces stay in
their home. Nothing is written into the repository.
"""
from __future__ import annotations

import argparse
import ast
import csv
import errno
import os
import pwd
import secrets
import shutil
import socket
import stat
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from ..grader import safe_files
from ..course import REPO_ROOT, PipelineError, venv_bin
from . import roster as roster_mod

DEFAULT_STATE = "/srv/rlhf-hub"
DEFAULT_EXCHANGE = "/srv/nbgrader/exchange"
DEFAULT_COURSE = "/srv/rlhf-course"
DEFAULT_INSTRUCTOR = "instructor"
DEFAULT_PORT = 8000
HUB_CONFIG = REPO_ROOT / "hub" / "jupyterhub_config.py"
PROXY = "configurable-http-proxy"
PROXY_TIMEOUT_MS = 30 * 60 * 1000  # how long the proxy waits for a server's answer (Formgrader's long requests)


class HubError(PipelineError):
    """The hub cannot be set up or started as asked; the message says what to do."""


def course_id_from_config(config: str | os.PathLike = REPO_ROOT / "nbgrader_config.py") -> str:
    """The ``c.CourseDirectory.course_id = "..."`` of the course's ``nbgrader_config.py`` (read, not run)."""
    tree = ast.parse(Path(config).read_text(encoding="utf-8"))
    for node in ast.walk(tree):
        if (isinstance(node, ast.Assign) and len(node.targets) == 1
                and ast.unparse(node.targets[0]) == "c.CourseDirectory.course_id"
                and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str)):
            return node.value.value
    raise HubError(f"{config} sets no c.CourseDirectory.course_id")


@dataclass
class Settings:
    """Where everything of the hub lives; :meth:`from_env` reads the environment variables."""
    roster: Path
    instructor: str = DEFAULT_INSTRUCTOR
    graders: tuple = ()
    course_root: Path = Path(DEFAULT_COURSE)
    exchange: Path = Path(DEFAULT_EXCHANGE)
    state: Path = Path(DEFAULT_STATE)
    port: int = DEFAULT_PORT
    home_base: Path = Path("/home")
    course_id: str = field(default_factory=course_id_from_config)

    @property
    def proxy_api_port(self) -> int:
        return self.port + 1

    @property
    def hub_port(self) -> int:
        return self.port + 2

    @classmethod
    def from_env(cls, roster=None, env=None) -> "Settings":
        env = os.environ if env is None else env
        path = roster or env.get(roster_mod.ENV_VAR) or REPO_ROOT / "roster.csv"
        try:
            port = int(env.get("HUB_PORT") or DEFAULT_PORT)
        except ValueError:
            raise HubError(f"HUB_PORT={env.get('HUB_PORT')!r} is not a port number") from None
        if not 0 < port < 65534:
            raise HubError(f"HUB_PORT={port} is not a usable port (1..65533; the hub also uses the next two)")
        return cls(
            roster=Path(path).resolve(),
            instructor=env.get("RLHF_HUB_INSTRUCTOR") or DEFAULT_INSTRUCTOR,
            graders=tuple(g for g in (env.get("RLHF_HUB_GRADERS") or "").replace(",", " ").split() if g),
            course_root=Path(env.get("RLHF_HUB_COURSE") or DEFAULT_COURSE).resolve(),
            exchange=Path(env.get("RLHF_EXCHANGE") or DEFAULT_EXCHANGE).resolve(),
            state=Path(env.get("RLHF_HUB_STATE") or DEFAULT_STATE).resolve(),
            port=port,
            home_base=Path(env.get("RLHF_HUB_HOMES") or "/home").resolve(),
        )

    def staff(self) -> list[str]:
        return [self.instructor, *[g for g in self.graders if g != self.instructor]]


# --- the roster --------------------------------------------------------------------------------------

def roster_ids(path: str | os.PathLike) -> list[str]:
    """The student ids of the roster at ``path``, in file order; :class:`HubError` listing every
    problem (``line N: ...``, the checks of ``make roster``) when the file cannot be used."""
    path = Path(path)
    problems = roster_mod.check_roster(path)
    if problems:
        raise HubError(f"roster {path}:\n  " + "\n  ".join(problems))
    with open(path, newline="", encoding="utf-8-sig") as fh:
        return [row["id"].strip() for row in csv.DictReader(fh)]


def _check_account_name(what: str, name: str) -> None:
    why = roster_mod.id_problem(name)
    if why:
        raise HubError(f"{what} {name!r} is not a valid Linux user name: it {why}")


# --- accounts ----------------------------------------------------------------------------------------

def _uid_range() -> tuple[int, int]:
    """The uids of ordinary accounts on this machine (``UID_MIN``/``UID_MAX`` of /etc/login.defs,
    1000..60000 when it does not say)."""
    low, high = 1000, 60000
    try:
        for line in Path("/etc/login.defs").read_text().splitlines():
            parts = line.split()
            if len(parts) == 2 and parts[0] in ("UID_MIN", "UID_MAX") and parts[1].isdigit():
                low, high = (int(parts[1]), high) if parts[0] == "UID_MIN" else (low, int(parts[1]))
    except OSError:
        pass
    return low, high


def system_account_problem(name: str) -> str | None:
    """Why the existing account ``name`` must not become a course account (None: it may, or it does
    not exist): root and the system's own accounts (``daemon``, ``www-data``, ``nobody``...; uids
    outside ``UID_MIN..UID_MAX``) are never reused as a student's or the instructor's, since the hub
    would start a server with that account's powers for whoever knows its password."""
    try:
        entry = pwd.getpwnam(name)
    except KeyError:
        return None
    low, high = _uid_range()
    if entry.pw_uid == 0 or not low <= entry.pw_uid <= high:
        return (f"{name!r} is a system account of this machine (uid {entry.pw_uid}; ordinary accounts are "
                f"{low}..{high}): it cannot be a course account; give the student another id in the roster")
    return None


def _need_root(what: str) -> None:
    if os.geteuid() != 0:
        raise HubError(f"{what} needs root (it creates Linux accounts and folders owned by them); "
                       f"you are {pwd.getpwuid(os.geteuid()).pw_name}. Run it as root, e.g. "
                       "`sudo make hub-users` (or `sudo make hub`).")


def _run(cmd: list[str], stdin: str | None = None) -> None:
    done = subprocess.run(cmd, input=stdin, capture_output=True, text=True)
    if done.returncode != 0:
        raise HubError(f"{cmd[0]} failed (exit {done.returncode}): {(done.stderr or done.stdout).strip()}")


def ensure_account(name: str, home_base: Path) -> tuple[str, str | None]:
    """Create the Linux user ``name`` (home ``home_base/name``, mode 0700, a random password) or
    reuse the existing one untouched. Returns ``("created", password)`` or ``("reused", None)``."""
    _check_account_name("account", name)
    problem = system_account_problem(name)
    if problem:
        raise HubError(problem)
    try:
        pwd.getpwnam(name)
        return "reused", None
    except KeyError:
        pass
    home = home_base / name
    _run(["useradd", "--create-home", "--home-dir", str(home), "--shell", "/bin/bash", "--user-group",
          "--comment", "rlhf-ppo course account", "--", name])
    os.chmod(home, 0o700)
    password = secrets.token_urlsafe(12)
    _run(["chpasswd"], stdin=f"{name}:{password}\n")
    return "created", password


def _write_passwords(state: Path, passwords: dict) -> Path:
    """``id,password`` of the accounts just created, in a new file of mode 0600 under ``state``."""
    state.mkdir(parents=True, exist_ok=True)
    path = state / f"new-passwords-{time.strftime('%Y%m%dT%H%M%S')}-{secrets.token_hex(3)}.csv"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w", newline="") as fh:
        writer = csv.writer(fh)
        writer.writerow(["id", "password"])
        writer.writerows(sorted(passwords.items()))
    return path


def ensure_course_root(settings: Settings) -> list[str]:
    """The course root owned by the instructor, mode 0700 (seeded with ``source/`` and ``release/``)."""
    root, owner = settings.course_root, pwd.getpwnam(settings.instructor)
    notes = []
    if _inside(root, REPO_ROOT) or _inside(REPO_ROOT, root):
        raise HubError(f"the hub's course root {root} overlaps the repository {REPO_ROOT}: students run the "
                       "course venv from the repository, so it cannot be a 0700 folder; set RLHF_HUB_COURSE "
                       f"to another folder (default {DEFAULT_COURSE})")
    if not root.exists():
        root.parent.mkdir(parents=True, exist_ok=True)
        root.mkdir(mode=0o700)
        os.chown(root, owner.pw_uid, owner.pw_gid)
        notes.append(f"course root {root}: created (owner {settings.instructor}, 0700)")
    st = root.lstat()
    if not stat.S_ISDIR(st.st_mode):
        raise HubError(f"the course root {root} exists but is not a folder")
    if st.st_uid != owner.pw_uid:
        raise HubError(f"the course root {root} is owned by {_owner_name(st.st_uid)}, not {settings.instructor}; "
                       "check what is in it, then `chown -R` it or set RLHF_HUB_COURSE to another folder")
    if stat.S_IMODE(st.st_mode) != 0o700:
        notes.append(f"course root {root}: mode {stat.S_IMODE(st.st_mode):04o} -> 0700")
        os.chmod(root, 0o700)
    for sub in ("source", "release"):
        src, dest = REPO_ROOT / sub, root / sub
        if src.is_dir() and not dest.exists():
            shutil.copytree(src, dest, symlinks=True,
                            ignore=shutil.ignore_patterns(".ipynb_checkpoints", "__pycache__"))
            for dirpath, dirnames, filenames in os.walk(dest):
                for entry in [dirpath, *(os.path.join(dirpath, n) for n in dirnames + filenames)]:
                    os.lchown(entry, owner.pw_uid, owner.pw_gid)
            notes.append(f"course root {root}: {sub}/ copied from {src}")
    return notes


def _inside(path: Path, folder: Path) -> bool:
    return path == folder or folder in path.parents


def _owner_name(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return f"uid {uid}"


# --- the exchange ------------------------------------------------------------------------------------

DEFAULT_ACL = safe_files.ACL_DEFAULT


def inbound_default_acl(instructor_uid: int) -> bytes:
    """The default ACL of ``inbound/`` (what every submission made in it inherits), as the
    ``system.posix_acl_default`` xattr: ``user::rwx, user:<instructor>:rwx, group::---, mask::rwx,
    other::---``. nbgrader's submit then chmods the submission's files and folders; on a file with an
    ACL that sets the mask, so the instructor keeps read access through their own entry and the
    owning group (a shared ``users``, say) and every other account have none."""
    return safe_files.posix_acl(7, {instructor_uid: 7})


def _default_acl(path: Path) -> bytes | None:
    """``path``'s default ACL xattr; None when it has none, ``b""`` when its filesystem takes no ACL."""
    try:
        return os.getxattr(path, DEFAULT_ACL, follow_symlinks=False)
    except OSError as exc:
        if exc.errno == errno.ENODATA:
            return None
        if exc.errno in (errno.ENOTSUP, errno.EOPNOTSUPP):
            return b""
        raise


def exchange_layout(settings: Settings) -> list[tuple[Path, str, int]]:
    """``(path, owner, mode)`` of every folder of the exchange, parent first (see the module docstring)."""
    ex, course = settings.exchange, settings.exchange / settings.course_id
    return [
        (ex.parent, "root", 0o755),
        (ex, "root", 0o1777),
        (course, settings.instructor, 0o755),
        (course / "outbound", settings.instructor, 0o755),
        (course / "inbound", settings.instructor, 0o3733),
        (course / "feedback", settings.instructor, 0o711),
    ]


def exchange_problems(settings: Settings, repair: bool = False) -> tuple[list[str], list[str]]:
    """Check (``repair=True``: create and repair) the exchange. Returns ``(refusals, notes)``:
    refusals are problems left as they are (wrong owner, not a folder, a link; or anything, when
    not repairing), notes say what was created or repaired. A mode is only ever tightened or set to
    nbgrader's (never loosened: bits beyond the table's are what is removed)."""
    refusals, notes = [], []
    for folder, what in ((settings.course_root, "the course root"), (settings.home_base, "the homes"),
                         (REPO_ROOT, "the repository")):
        if _inside(settings.exchange, folder) or _inside(folder, settings.exchange):
            return [f"the exchange {settings.exchange} must be outside {what} ({folder}): set RLHF_EXCHANGE "
                    f"(default {DEFAULT_EXCHANGE})"], []
    for ancestor in reversed(settings.exchange.parent.parents):
        st = ancestor.stat()
        if st.st_uid != 0 or (st.st_mode & 0o022 and not st.st_mode & stat.S_ISVTX):
            refusals.append(f"{ancestor}: owned by {_owner_name(st.st_uid)} with mode {stat.S_IMODE(st.st_mode):04o}: "
                            "an account other than root could replace the exchange below it")
    for path, owner, mode in exchange_layout(settings):
        uid = pwd.getpwnam(owner).pw_uid
        if not os.path.lexists(path):
            if not repair:
                refusals.append(f"{path}: missing (run `make hub-users` as root)")
                continue
            path.mkdir()
            os.chown(path, uid, pwd.getpwnam(owner).pw_gid if owner != "root" else 0)
            os.chmod(path, mode)
            notes.append(f"{path}: created ({owner}, {mode:04o})")
            continue
        st = os.lstat(path)
        if stat.S_ISLNK(st.st_mode) or not stat.S_ISDIR(st.st_mode):
            refusals.append(f"{path}: is {'a link' if stat.S_ISLNK(st.st_mode) else 'not a folder'}; "
                            "the exchange must be real folders (remove it and run `make hub-users`)")
            continue
        if st.st_uid != uid:
            refusals.append(f"{path}: owned by {_owner_name(st.st_uid)}, must be {owner}; refusing to use it "
                            f"(whoever made it may have put files in it: inspect, remove, run `make hub-users`)")
            continue
        acl = _default_acl(path) if path.name == "inbound" else None
        if path.name == "inbound" and acl == b"":
            notes.append(f"{path}: its filesystem takes no ACL: submissions stay readable by any account that "
                         "learns their random name, as with nbgrader's own submit")
        elif path.name == "inbound" and acl != inbound_default_acl(uid):
            # what makes submissions private (see PRIVATE_SUBMIT): only the instructor reads them
            if repair:
                os.setxattr(path, DEFAULT_ACL, inbound_default_acl(uid), follow_symlinks=False)
                notes.append(f"{path}: default ACL {'set' if acl is None else 'repaired'} "
                             f"(submissions readable by {owner} alone)")
            else:
                refusals.append(f"{path}: {'no' if acl is None else 'a foreign'} default ACL; it must give "
                                f"{owner} alone access to submissions (`make hub-users` sets it)")
        have = stat.S_IMODE(st.st_mode)
        if have != mode:
            if repair:
                os.chmod(path, mode)
                notes.append(f"{path}: mode {have:04o} repaired to {mode:04o}")
            else:
                refusals.append(f"{path}: mode {have:04o}, must be {mode:04o} (`make hub-users` repairs it)")
    return refusals, notes


def ensure_exchange_tree(settings: Settings) -> list[str]:
    """Create/repair the exchange as root; :class:`HubError` with every refusal."""
    _need_root("setting up the exchange")
    if not settings.exchange.parent.exists():
        settings.exchange.parent.mkdir(parents=True, mode=0o755)
        os.chmod(settings.exchange.parent, 0o755)
    refusals, notes = exchange_problems(settings, repair=True)
    if refusals:
        raise HubError("the exchange is not safe to use:\n  " + "\n  ".join(refusals))
    return notes


# --- users -------------------------------------------------------------------------------------------

def setup_users(settings: Settings, out=print) -> dict:
    """``make hub-users``: roster accounts, instructor/graders, course root, exchange. Returns
    ``{"created": [...], "reused": [...], "passwords": path or None}``."""
    ids = roster_ids(settings.roster)  # before anything else: a bad roster changes nothing
    for name in settings.staff():
        _check_account_name("instructor/grader account", name)
    clash = sorted(set(ids) & set(settings.staff()))
    if clash:
        raise HubError(f"roster {settings.roster}: {', '.join(clash)} is also the instructor/grader account")
    _need_root("`hub users`")
    system = [p for p in (system_account_problem(n) for n in settings.staff() + ids) if p]
    if system:  # before anything is created
        raise HubError(f"roster {settings.roster}: " + "; ".join(system))
    created, reused, passwords = [], [], {}
    for name in settings.staff() + ids:
        what, password = ensure_account(name, settings.home_base)
        (created if what == "created" else reused).append(name)
        if password:
            passwords[name] = password
        home = Path(pwd.getpwnam(name).pw_dir)
        role = "instructor" if name == settings.instructor else "grader" if name in settings.graders else "student"
        out(f"{what} {role} account {name} (home {home})")
        if what == "reused" and home.is_dir() and stat.S_IMODE(home.stat().st_mode) & 0o077:
            out(f"  note: {home} is mode {stat.S_IMODE(home.stat().st_mode):04o}; other accounts can read it "
                f"(left as it is; `chmod 0700 {home}` to make it private)")
    for line in ensure_course_root(settings):
        out(line)
    notes = ensure_exchange_tree(settings)
    for line in notes:
        out(line)
    out(f"exchange {settings.exchange}: permissions as nbgrader expects" + ("" if notes else " (unchanged)"))
    out(f"the servers run Python from {server_runtime(settings)}")
    path = _write_passwords(settings.state, passwords) if passwords else None
    if path:
        out(f"passwords of the {len(passwords)} new accounts: {path} (mode 0600; hand them out, then delete the file)")
    return {"created": created, "reused": reused, "passwords": path}


# --- serve -------------------------------------------------------------------------------------------

def port_free(port: int, host: str = "127.0.0.1") -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind((host, port))
        except OSError as exc:
            if exc.errno in (errno.EADDRINUSE, errno.EACCES):
                return False
            raise
    return True


def free_ports(count: int = 3, host: str = "127.0.0.1", tries: int = 200) -> int:
    """A port with the ``count - 1`` after it also free on ``host`` (the hub uses three: ``HUB_PORT``,
    the proxy's API, the hub itself), for a hub started on ports nobody chose (tests, benchmarks)."""
    for _ in range(tries):
        with socket.socket() as sock:
            sock.bind((host, 0))
            port = sock.getsockname()[1]
        if port + count < 65536 and all(port_free(port + i, host) for i in range(count)):
            return port
    raise HubError(f"no {count} free ports in a row on {host}")


def proxy_command() -> str | None:
    """The Python ``configurable-http-proxy`` of the course venv (or on PATH)."""
    own = Path(venv_bin()) / PROXY
    return str(own) if own.exists() else shutil.which(PROXY)


def serve_problems(settings: Settings) -> list[str]:
    """Everything that stops ``serve`` (empty: it can start)."""
    problems = []
    if os.geteuid() != 0:
        problems.append(f"the hub must run as root (it starts each student's server as their own Linux account); "
                        f"you are {pwd.getpwuid(os.geteuid()).pw_name}: run `sudo make hub`")
    if proxy_command() is None:
        problems.append(f"no {PROXY}: it is pinned in requirements.txt (the Python proxy); rebuild the venv "
                        "with `make venv` or `pip install -r requirements.txt`")
    for port, what in ((settings.port, "the hub's public port (HUB_PORT)"),
                       (settings.proxy_api_port, "the proxy's API port (HUB_PORT+1)"),
                       (settings.hub_port, "the hub's internal port (HUB_PORT+2)")):
        if not port_free(port):
            problems.append(f"port {port} on 127.0.0.1, {what}, is busy: stop what uses it or "
                            f"choose another with `make hub HUB_PORT=...`")
    try:
        ids = roster_ids(settings.roster)
    except HubError as exc:
        return problems + [str(exc)]
    problems += [p for p in (system_account_problem(n) for n in settings.staff() + ids) if p]
    missing = [n for n in settings.staff() + ids if not _user_exists(n)]
    if missing:
        problems.append(f"no Linux account for {', '.join(missing)}: run `make hub-users` (as root) first")
        return problems
    if os.geteuid() == 0:
        try:
            for line in ensure_exchange_tree(settings):
                print(line)
        except HubError as exc:
            problems.append(str(exc))
        root = settings.course_root
        if not root.is_dir() or root.stat().st_uid != pwd.getpwnam(settings.instructor).pw_uid:
            problems.append(f"the course root {root} is missing or not owned by {settings.instructor}: "
                            "run `make hub-users`")
    return problems


def _user_exists(name: str) -> bool:
    try:
        pwd.getpwnam(name)
        return True
    except KeyError:
        return False


def hub_env(settings: Settings) -> dict:
    """The environment ``jupyterhub -f hub/jupyterhub_config.py`` reads its settings from."""
    env = dict(os.environ)
    env.update({
        roster_mod.ENV_VAR: str(settings.roster), "RLHF_HUB_INSTRUCTOR": settings.instructor,
        "RLHF_HUB_GRADERS": ",".join(settings.graders), "RLHF_HUB_COURSE": str(settings.course_root),
        "RLHF_EXCHANGE": str(settings.exchange), "RLHF_HUB_STATE": str(settings.state),
        "HUB_PORT": str(settings.port), "RLHF_HUB_HOMES": str(settings.home_base),
        "PATH": venv_bin() + os.pathsep + env.get("PATH", "/usr/bin:/bin"),
    })
    return env


def serve(settings: Settings) -> None:
    """Start JupyterHub in this process (``exec``); :class:`HubError` when it cannot start."""
    problems = serve_problems(settings)
    if problems:
        raise HubError("the hub cannot start:\n  " + "\n  ".join(problems))
    settings.state.mkdir(parents=True, exist_ok=True)
    exposed = repository_exposure()
    if exposed:
        print(f"warning: {exposed}", file=sys.stderr, flush=True)
    print(f"JupyterHub for {settings.course_id}: http://127.0.0.1:{settings.port}/ (log in with your Linux "
          f"account; state in {settings.state}; Ctrl-C stops the hub and every student's server)", flush=True)
    os.chdir(settings.state)  # JupyterHub's stray files (none expected) land here, never in the repository
    os.execve(str(Path(venv_bin()) / "jupyterhub"),
              ["jupyterhub", "-f", str(HUB_CONFIG)], hub_env(settings))


# --- the hub's side (used by hub/jupyterhub_config.py) ------------------------------------------------

def _usable_by_all(path: str | os.PathLike) -> bool:
    """Whether every account can reach ``path`` (each folder above it searchable by others) and
    read it (and execute it, for a file)."""
    p = Path(os.path.realpath(path))
    if any(not os.stat(d).st_mode & 0o001 for d in p.parents):
        return False
    return os.stat(p).st_mode & 0o005 == 0o005


#: files of the course venv's site-packages that make the full library importable (its editable install)
EDITABLE = ("__editable__.rlhf_lab", "__editable___rlhf_lab", "rlhf_lab-")


def _linked_copy(src: Path, dest: Path, skip=lambda rel: False) -> int:
    """Copy the tree ``src`` to ``dest`` (which must not exist), each regular file hard-linked when
    both are on one file system (else copied), symbolic links recreated as they are, folders 0755,
    ``__pycache__`` and whatever ``skip(relative path)`` names left out. Returns the files placed.

    A hard link is the same file under a second name: its mode (the venv's 0644/0755) and owner
    (root) come along, so the copy is readable wherever its folders are, and no account but root
    can change it."""
    count = 0
    for dirpath, dirnames, filenames in os.walk(src):
        here = Path(dirpath)
        rel = here.relative_to(src)
        dirnames[:] = [d for d in dirnames if d != "__pycache__" and not skip(rel / d)]
        target = dest / rel
        target.mkdir(parents=True, exist_ok=True)
        os.chmod(target, 0o755)
        for name in dirnames:  # links to folders: os.walk lists them as folders but does not enter them
            if (here / name).is_symlink():
                dirnames.remove(name)
                os.symlink(os.readlink(here / name), target / name)
        for name in filenames:
            if skip(rel / name):
                continue
            st = os.lstat(here / name)
            if stat.S_ISLNK(st.st_mode):
                os.symlink(os.readlink(here / name), target / name)
            elif stat.S_ISREG(st.st_mode):
                try:
                    os.link(here / name, target / name)
                except OSError:
                    shutil.copy2(here / name, target / name)
                count += 1
    return count


def _venv_key(venv: Path, base: Path) -> str:
    import hashlib
    pins = venv / ".pins-sha256"
    stamp = pins.read_text().strip() if pins.is_file() else str(os.stat(venv / "pyvenv.cfg").st_mtime_ns)
    return hashlib.sha256(f"{venv}\0{base}\0{stamp}\0format=2".encode()).hexdigest()[:20]


def server_runtime(settings: Settings) -> Path:
    """The ``bin`` folder every server (students' and instructor's) runs from: ``<state>/venv``.

    It is the course venv as a hard-linked copy (:func:`_linked_copy`) under the hub's state folder,
    with two differences: **no editable install of ``rlhf_lab``** (the course venv's points into the
    repository, the full library with ``judging/`` and ``instructor/``; each server is given its own
    library on ``PYTHONPATH`` instead, see :func:`server_env`), and an interpreter every account can
    run (the venv's own when it can, e.g. ``/usr/bin/python3.11``; a pyenv Python under ``/root`` it
    cannot: then the system's Python of the same version, ``$RLHF_HUB_PYTHON`` to name another).
    Nothing of it points into the repository, so the repository may be (and should be) a folder
    only its owner can read. Made again when the course venv's pins change (``.pins-sha256``)."""
    venv = Path(venv_bin()).parent
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    if _usable_by_all(venv / "bin" / "python") and _usable_by_all(sys.base_prefix):
        base = Path(os.path.realpath(venv / "bin" / "python"))
    else:
        base = Path(os.environ.get("RLHF_HUB_PYTHON") or f"/usr/bin/python{version}")
    if not base.exists() or not _usable_by_all(base):
        raise HubError(f"the course venv's Python ({os.path.realpath(venv / 'bin' / 'python')}) is not readable by the "
                       f"students' accounts and there is no Python {version} every account can run at {base}: "
                       f"install python{version} (Debian: apt-get install python{version}-venv) or set RLHF_HUB_PYTHON")
    got = subprocess.run([str(base), "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
                         capture_output=True, text=True).stdout.strip()
    if got != version:
        raise HubError(f"{base} is Python {got}, the course venv is {version}: set RLHF_HUB_PYTHON to a Python {version}")
    runtime = settings.state / "venv"
    key = _venv_key(venv, base)
    stamp = runtime / ".rlhf-hub-venv"
    if stamp.is_file() and stamp.read_text().strip() == key:
        return runtime / "bin"
    settings.state.mkdir(parents=True, exist_ok=True)
    os.chmod(settings.state, 0o755)
    staging = settings.state / f".venv-{os.getpid()}"
    shutil.rmtree(staging, ignore_errors=True)
    done = subprocess.run([str(base), "-m", "venv", "--without-pip", str(staging)], capture_output=True, text=True)
    if done.returncode != 0:
        raise HubError(f"could not make the servers' Python at {staging}: {done.stderr.strip()}")
    site_packages = Path(sysconfig_paths(venv)["purelib"])
    own = Path(sysconfig_paths(staging)["purelib"])
    shutil.rmtree(own)
    _linked_copy(site_packages, own, skip=lambda rel: len(rel.parts) == 1 and rel.name.startswith(EDITABLE))
    for sub in ("share", "etc"):
        if (venv / sub).is_dir():
            _linked_copy(venv / sub, staging / sub)
    shebangs = {f"#!{venv / 'bin' / name}" for name in ("python", "python3", f"python{version}")}
    for script in sorted((venv / "bin").iterdir()):
        if script.name.startswith(("python", "activate")) or not script.is_file():
            continue
        try:
            first, _, rest = script.read_text(encoding="utf-8").partition("\n")
        except (UnicodeDecodeError, OSError):
            continue
        if first.strip() in shebangs:
            _write(staging / "bin" / script.name, f"#!{runtime / 'bin' / 'python'}\n{rest}", 0o755)
    for folder in [staging, *(p for p in staging.rglob("*") if p.is_dir() and not p.is_symlink())]:
        os.chmod(folder, 0o755)
    _write(staging / ".rlhf-hub-venv", key + "\n")
    old = settings.state / f".venv-old-{os.getpid()}"
    if runtime.exists():
        runtime.rename(old)
    staging.rename(runtime)
    shutil.rmtree(old, ignore_errors=True)
    return runtime / "bin"


#: The course files the instructor's server reads, copied into the course root on every start
#: (the repository itself may be unreadable to the instructor account).
COURSE_FILES = ("nbgrader_config.py",)


def instructor_library(settings: Settings) -> Path:
    """The full course library for the instructor's server: ``<course root>/.library/rlhf_lab``, a
    hard-linked copy of the repository's ``helpers/rlhf_lab`` made again on every start, inside the
    0700 course root (so no student reaches it), with the course's ``nbgrader_config.py`` and the
    roster beside it. Returns the folder to put on ``PYTHONPATH``."""
    owner = pwd.getpwnam(settings.instructor)
    root = settings.course_root
    lib = root / ".library"
    staging = root / f".library-{os.getpid()}"
    shutil.rmtree(staging, ignore_errors=True)
    _linked_copy(REPO_ROOT / "helpers" / "rlhf_lab", staging / "rlhf_lab")
    os.chown(staging, owner.pw_uid, owner.pw_gid)
    old = root / f".library-old-{os.getpid()}"
    if lib.exists():
        lib.rename(old)
    staging.rename(lib)
    shutil.rmtree(old, ignore_errors=True)
    for name in COURSE_FILES:
        shutil.copyfile(REPO_ROOT / name, root / name)
        os.chown(root / name, owner.pw_uid, owner.pw_gid)
    shutil.copyfile(settings.roster, root / "roster.csv")
    os.chown(root / "roster.csv", owner.pw_uid, owner.pw_gid)
    os.chmod(root / "roster.csv", 0o600)
    return lib


def student_library(settings: Settings) -> Path:
    """The student build of the library (:mod:`.student_library`), rebuilt when it is stale; the
    folder the students' servers put on ``PYTHONPATH``."""
    from . import student_library as sl

    dest = sl.default_dest()
    problems = sl.check(dest, root=REPO_ROOT, python=None) if (dest / "rlhf_lab").is_dir() else ["missing"]
    if problems:
        try:
            sl.build(root=REPO_ROOT, dest=dest)
        except sl.StudentLibraryError as exc:
            raise HubError(f"the students' library build: {exc}") from None
    return dest


def repository_exposure() -> str | None:
    """A warning when every account can read the repository (its ``source/``, ``content/``,
    ``examples/`` and ``helpers/rlhf_lab/judging`` hold model answers and hidden checks)."""
    top = REPO_ROOT
    if all(os.stat(d).st_mode & 0o001 for d in [top, *top.parents]) and os.stat(top).st_mode & 0o004:
        return (f"the repository {top} can be read by every account on this machine, students included: its "
                f"source/, content/, examples/ and helpers/rlhf_lab/judging hold the model answers and the hidden "
                f"checks. The hub does not need it to be readable: `chmod 0700 {top}` (or keep it in a private home)")
    return None


def sysconfig_paths(prefix: Path) -> dict:
    import sysconfig
    return sysconfig.get_paths(vars={"base": str(prefix), "platbase": str(prefix)})


def _write(path: Path, text: str, mode: int = 0o644) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text, encoding="utf-8")
    os.chmod(tmp, mode)
    os.replace(tmp, path)


def secret_file(path: Path, nbytes: int = 32) -> str:
    """A random hex secret kept in ``path`` (mode 0600), made on first use."""
    if not path.exists():
        _write(path, secrets.token_hex(nbytes) + "\n", 0o600)
    return path.read_text().strip()


# The students' submit: nbgrader's own leaves a submission readable by every account (files 0644,
# folders 0755, the top 0777: "hidden from other users by the timestamp", i.e. by the random part
# of its name). inbound/ has a default ACL (inbound_default_acl) that every submission inherits:
# the instructor's entry, nothing for the owning group or others. This submit drops the others' bits
# nbgrader sets, so what is left is the student (owner) and the instructor (through the ACL's mask);
# where the exchange's filesystem has no ACL it changes nothing (the instructor could not read it).
PRIVATE_SUBMIT = """
import os as _os
from nbgrader.exchange.default.submit import ExchangeSubmit as _ExchangeSubmit


def _private_inbound(path):
    try:
        return bool(_os.getxattr(path, "system.posix_acl_default"))
    except OSError:
        return False


class PrivateSubmit(_ExchangeSubmit):
    \"\"\"nbgrader's submit, the submission readable by its student and the instructor only.\"\"\"

    def set_perms(self, dest, fileperms, dirperms):
        if _private_inbound(self.inbound_path):
            fileperms, dirperms = fileperms & 0o750, (dirperms | 0o070) & 0o770
        super().set_perms(dest, fileperms, dirperms)

    def copy_files(self):
        super().copy_files()
        if _private_inbound(self.inbound_path):  # nbgrader ends by making the submission's folder 0777
            _os.chmod(_os.path.join(self.inbound_path, self.assignment_filename), 0o770)


c.ExchangeFactory.submit = PrivateSubmit
"""


def write_server_configs(settings: Settings) -> dict:
    """The Jupyter config folders the hub hands each server (``<state>/jupyter/{student,instructor}``);
    returns ``{role: [config dirs, highest priority first]}`` for ``JUPYTER_CONFIG_PATH``."""
    base = settings.state / "jupyter"
    for folder in (settings.state, base, base / "student", base / "instructor"):
        folder.mkdir(parents=True, exist_ok=True)
        os.chmod(folder, 0o755)
    common = (f"# Written by rlhf_lab.instructor.operations.hub for the hub; rewritten on every start.\n"
              f"from nbgrader.auth import JupyterHubAuthPlugin\n\nc = get_config()  # noqa: F821\n")
    _write(base / "student" / "nbgrader_config.py", common + (
        f"c.CourseDirectory.course_id = {settings.course_id!r}\n"
        f"c.Exchange.root = {str(settings.exchange)!r}\n"
        "c.Exchange.path_includes_course = False\n"
        "c.Authenticator.plugin_class = JupyterHubAuthPlugin\n" + PRIVATE_SUBMIT))
    _write(base / "instructor" / "nbgrader_config.py", common + (
        f"load_subconfig({str(settings.course_root / 'nbgrader_config.py')!r})  # noqa: F821 (the course's, copied there)\n"
        f"c.Exchange.root = {str(settings.exchange)!r}\n"
        "c.Authenticator.plugin_class = JupyterHubAuthPlugin\n"
        "# one account per student: a submission another account made in a student's name is refused, and\n"
        "# the time of a submission is the exchange's, never the one its folder's name or timestamp.txt claims\n"
        "c.SafeExchangeCollect.refuse_foreign_owner = True\n"
        "c.SafeExchangeCollect.exchange_time = True\n"
        "# each feedback page readable by its student's account alone (an ACL entry), not by every account\n"
        "c.SafeExchangeReleaseFeedback.private_to_student = True\n"))
    # the course's own role configs (jupyter/<role>), copied: the servers never read the repository
    copies = {}
    for role in ("student", "instructor"):
        dest = base / f"{role}-course"
        shutil.rmtree(dest, ignore_errors=True)
        shutil.copytree(REPO_ROOT / "jupyter" / role, dest,
                        ignore=shutil.ignore_patterns("lab", "migrated", "__pycache__", "*.pyc"))
        for folder in [dest, *(p for p in dest.rglob("*") if p.is_dir())]:
            os.chmod(folder, 0o755)
        for f in (p for p in dest.rglob("*") if p.is_file()):
            os.chmod(f, 0o644)
        copies[role] = str(dest)
    return {"student": [str(base / "student"), copies["student"]],
            "instructor": [str(base / "instructor"), copies["instructor"]]}


def server_scopes(settings: Settings):
    """``Spawner.server_token_scopes``: what a server's ``$JUPYTERHUB_API_TOKEN`` may do. nbgrader's
    ``JupyterHubAuthPlugin`` reads the user's own groups; the staff's servers also add students to
    the course group (``nbgrader db student add``). JupyterHub grants only the subset the user holds."""
    group = f"nbgrader-{settings.course_id}"
    base = ["users:activity!user", "access:servers!server", "read:users!user"]
    staff = set(settings.staff())

    def scopes(spawner):
        if spawner.user.name in staff:
            return base + ["list:groups", f"read:groups!group={group}", f"groups!group={group}"]
        return base
    return scopes


def _authenticator_class():
    from jupyterhub.auth import PAMAuthenticator
    from tornado import web

    class RosterPAMAuthenticator(PAMAuthenticator):
        """PAM login (real Linux accounts) for the roster and the staff only: a correct password of
        any other account gets a page saying it is not on the roster (no server, no hub session)."""

        course_id = ""

        async def authenticate(self, handler, data):
            name = await super().authenticate(handler, data)
            if name is None:
                return None
            user = name if isinstance(name, str) else name["name"]
            if self.normalize_username(user) not in self.allowed_users:
                refusal = web.HTTPError(403, "login refused: %s is not on the roster", user,
                                        reason="Not on the course roster")
                refusal.jupyterhub_message = NOT_ON_ROSTER.format(user=user, course=self.course_id)
                raise refusal
            return name

    return RosterPAMAuthenticator


#: shown on the refusal page (JupyterHub's error page shows an HTTPError's ``message``)
NOT_ON_ROSTER = ("{user} is a valid account on this machine but not on the roster of the course {course}: "
                 "this hub gives no server to it. Ask your instructor to add you to roster.csv.")


def server_env(settings: Settings, name: str, runtime: Path, dirs: dict, libraries: dict | None = None) -> dict:
    """The environment of ``name``'s server (on top of JupyterHub's own ``JUPYTERHUB_*``).

    ``libraries`` is ``{"student": folder, "instructor": folder}``: the ``rlhf_lab`` each role's
    server and kernels import (``PYTHONPATH``; the servers' venv has none of its own)."""
    prefix = Path(runtime).parent
    role = "instructor" if name in settings.staff() else "student"
    env = {
        "PATH": f"{runtime}:/usr/local/bin:/usr/bin:/bin",
        "JUPYTER_CONFIG_PATH": os.pathsep.join([*dirs[role], str(prefix / "etc" / "jupyter")]),
        "JUPYTER_PATH": str(prefix / "share" / "jupyter"),
        "JUPYTERLAB_DIR": str(prefix / "share" / "jupyter" / "lab"),
        "RLHF_EXCHANGE": str(settings.exchange),
        "JAX_PLATFORMS": "cpu",
        "TF_CPP_MIN_LOG_LEVEL": "2",
    }
    if libraries and libraries.get(role):
        env["PYTHONPATH"] = str(libraries[role])
    if role == "instructor":
        env["RLHF_COURSE_ROOT"] = str(settings.course_root)
        env[roster_mod.ENV_VAR] = str(settings.course_root / "roster.csv")
    return env


def configure(c, env=None) -> Settings:
    """Fill the JupyterHub config object ``c`` (called by ``hub/jupyterhub_config.py``)."""
    settings = Settings.from_env(env=env)
    ids = roster_ids(settings.roster)
    staff = settings.staff()
    state = settings.state
    state.mkdir(parents=True, exist_ok=True)
    os.chmod(state, 0o755)  # the role configs below are read by every server; the secrets are 0600
    dirs = write_server_configs(settings)
    private = state / "private"  # the hub's database, secrets and pid files: root only
    private.mkdir(exist_ok=True)
    os.chmod(private, 0o700)

    c.JupyterHub.bind_url = f"http://127.0.0.1:{settings.port}"
    c.JupyterHub.hub_ip = "127.0.0.1"
    c.JupyterHub.hub_port = settings.hub_port
    c.ConfigurableHTTPProxy.api_url = f"http://127.0.0.1:{settings.proxy_api_port}"
    # the Python proxy gives up on a request after tornado's default 20 s (503 "Timeout during request"):
    # Formgrader's Collect, Autograde and Generate Feedback answer only when done, so allow 30 minutes
    c.ConfigurableHTTPProxy.command = [proxy_command() or PROXY, f"--proxy-timeout={PROXY_TIMEOUT_MS}"]
    c.ConfigurableHTTPProxy.auth_token = secret_file(private / "proxy_auth_token")
    c.ConfigurableHTTPProxy.pid_file = str(private / "jupyterhub-proxy.pid")
    c.ConfigurableHTTPProxy.log_level = "error"  # the Python proxy knows debug|info|warning|error, JupyterHub debug|info|warn|error
    c.JupyterHub.db_url = "sqlite:///" + str(private / "jupyterhub.sqlite")
    c.JupyterHub.cookie_secret_file = str(private / "jupyterhub_cookie_secret")
    c.JupyterHub.pid_file = str(private / "jupyterhub.pid")
    c.JupyterHub.cleanup_servers = True
    c.JupyterHub.cleanup_proxy = True
    c.JupyterHub.log_level = os.environ.get("RLHF_HUB_LOG_LEVEL", "WARN")
    c.JupyterHub.template_vars = {"announcement_login": f"Course {settings.course_id}: log in with your "
                                                        "Linux account of this machine."}

    auth = _authenticator_class()
    auth.course_id = settings.course_id
    c.JupyterHub.authenticator_class = auth
    system = [p for p in (system_account_problem(n) for n in set(ids) | set(staff)) if p]
    if system:  # (`serve` refuses first; this guards a hub started from this config some other way)
        raise HubError("; ".join(system))
    c.Authenticator.allowed_users = set(ids) | set(staff)
    c.Authenticator.admin_users = set()
    c.PAMAuthenticator.open_sessions = False
    # groups nbgrader's JupyterHubAuthPlugin reads; managed here, so the roster decides membership
    c.JupyterHub.load_groups = {
        f"nbgrader-{settings.course_id}": {"users": sorted(set(ids) | {settings.instructor})},
        f"formgrade-{settings.course_id}": {"users": sorted(staff)},
    }
    c.JupyterHub.load_roles = [{
        "name": f"grader-{settings.course_id}",
        "description": "adds students to the course group (nbgrader db student add)",
        "scopes": ["list:groups", f"read:groups!group=nbgrader-{settings.course_id}",
                   f"groups!group=nbgrader-{settings.course_id}"],
        "users": sorted(staff),
    }]

    runtime = server_runtime(settings)
    libraries = {"student": student_library(settings), "instructor": instructor_library(settings)}
    c.Spawner.cmd = [str(runtime / "jupyterhub-singleuser")]
    c.Spawner.default_url = "/lab"
    c.Spawner.start_timeout = 180
    c.Spawner.http_timeout = 180
    c.Spawner.server_token_scopes = server_scopes(settings)
    c.Spawner.notebook_dir = "~"

    def environment(spawner):
        return server_env(settings, spawner.user.name, runtime, dirs, libraries)

    async def pre_spawn(spawner):
        name = spawner.user.name
        if name not in ids and name not in staff:  # allowed_users already refuses; never a server anyway
            from tornado import web
            refusal = web.HTTPError(403, "no server for %s: not on the roster", name, reason="Not on the course roster")
            refusal.jupyterhub_message = NOT_ON_ROSTER.format(user=name, course=settings.course_id)
            raise refusal
        spawner.environment = environment(spawner)
        if name in staff:
            spawner.notebook_dir = str(settings.course_root) if name == settings.instructor else "~"

    c.Spawner.pre_spawn_hook = pre_spawn
    return settings


# --- command line ------------------------------------------------------------------------------------

def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m rlhf_lab.instructor.operations.hub",
                                     description="JupyterHub for the course with real Linux accounts.")
    sub = parser.add_subparsers(dest="command", required=True)
    users = sub.add_parser("users", help="create the roster's Linux accounts, the instructor's, the course root "
                                         "and the exchange (root)")
    users.add_argument("roster", nargs="?", type=Path, help="roster CSV (default $RLHF_ROSTER or roster.csv)")
    check = sub.add_parser("check", help="report what `serve` would refuse; changes nothing")
    check.add_argument("roster", nargs="?", type=Path)
    serve_p = sub.add_parser("serve", help="start JupyterHub on 127.0.0.1:$HUB_PORT (root)")
    serve_p.add_argument("roster", nargs="?", type=Path)
    args = parser.parse_args(argv)
    try:
        settings = Settings.from_env(roster=args.roster)
        if not settings.roster.is_file():
            raise HubError(f"no roster: {settings.roster} does not exist. Write roster.csv (columns id, first_name, "
                           "last_name, email, lms_user_id) or name the file: `make hub-users ROSTER=path/to/roster.csv`")
        if args.command == "users":
            setup_users(settings)
        elif args.command == "check":
            problems = []
            try:
                ids = roster_ids(settings.roster)
                missing = [n for n in settings.staff() + ids if not _user_exists(n)]
                if missing:
                    problems.append(f"no Linux account for {', '.join(missing)}: run `make hub-users`")
                else:
                    problems += exchange_problems(settings)[0]
            except HubError as exc:
                problems.append(str(exc))
            if proxy_command() is None:
                problems.append(f"no {PROXY} in the course venv")
            if not port_free(settings.port):
                problems.append(f"port {settings.port} (HUB_PORT) is busy")
            if problems:
                print("hub check:", *problems, sep="\n  ", file=sys.stderr)
                return 2
            print(f"hub check: ok (roster {settings.roster}, exchange {settings.exchange}, port {settings.port})")
        else:
            serve(settings)
    except HubError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
