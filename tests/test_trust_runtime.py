"""What a student leaves behind is never trusted: hostile answer cells that attack while autograded.

The cases are :mod:`fixtures.hostile_runtime` (links, FIFOs, huge and deep files made by the kernel;
active HTML in outputs and written answers; forged gradients; answers that exhaust the grader).
The class (a correct classmate and one student per case) is graded for real, in two private
copies of the course, through the two ways a course grades:

* ``course``: the course command, :func:`rlhf_lab.instructor.classrun.pipeline.run_class` (collect ->
  pre-flight -> one ``nbgrader autograde`` per student, sequentially -> overrides -> feedback ->
  export), as ``tests/test_trust.py`` grades the hostile class;
* ``bare``: what Formgrader's buttons run: ``python -m nbgrader autograde a1_ppo_objective --student
  <s> --force`` per student in the course's environment (the pre-flight comes from the config's
  hooks), then ``nbgrader generate_feedback`` and ``nbgrader export``.

Every case is checked on both paths against its grade cells (``auto_zero``/``zero``/``full``) and
its invariants (:data:`fixtures.hostile_runtime.CHECKS`), and both paths must give the same grades
cell by cell. While a path runs, a watchdog samples the RSS of each student's ``nbgrader
autograde`` process, and unblocks (and records) a grader process that hangs on a FIFO a student
left behind, so one such student cannot stall the module: the record fails that student's case.

Per-cell timeout 30 s, per-student timeout :data:`STUDENT_TIMEOUT`. Wall time on a 2-core machine:
printed at the end of each path. By default the suite grades :data:`DEFAULT_CASES` (one case of each
mechanism); ``RLHF_RUNTIME_CASES=all`` grades every case, ``RLHF_RUNTIME_CASES=r10,r30`` only the
control and the cases whose ids start with those prefixes.
"""
from __future__ import annotations

import csv
import dataclasses
import hashlib
import html.parser
import json
import os
import re
import stat
import subprocess
import sys
import threading
import time
from pathlib import Path

import nbformat
import pytest

from course_support import fresh_course, own_db, session_base, write_submissions
from fixtures import hostile_runtime as hr
from rlhf_lab.instructor.classrun import orchestrator, pipeline

A = hr.A
CASES, FILES = hr.build_cases()
#: The cases the suite grades by default, on both paths: one of each kind whose invariants need a
#: whole class run (a link over the notebook to a classmate's, script in an output, a rebound
#: jax.grad, a slow answer against the one deadline): about 6 minutes of one core. The mechanisms of
#: the other cases have faster tests of their own (test_planted_files: FIFOs and links through bare
#: nbgrader; test_sandbox_scratch; test_html_safety(_browser); test_judge: huge and deep answers;
#: test_program and test_judge: NumPy losses, rewrites of JAX and forged programs). Every case on both paths:
#: ``RLHF_RUNTIME_CASES=all`` (about an hour).
DEFAULT_CASES = "r10,r30,r41,r55"
_CHOSEN = os.environ.get("RLHF_RUNTIME_CASES", DEFAULT_CASES)
_ONLY = [] if _CHOSEN == "all" else [p for p in _CHOSEN.split(",") if p]
if _ONLY:
    CASES = [c for c in CASES if c.student == hr.CONTROL or any(c.student.startswith(p) for p in _ONLY)]
BY_ID = {c.student: c for c in CASES}
PATHS = ("course", "bare")
STUDENT_TIMEOUT = 240  # seconds for one student's nbgrader autograde (the slowest honest case: ~130 s)
FEEDBACK_TIMEOUT = 900
RSS_MARGIN = 256 * 2 ** 20  # bytes over the control's peak a grader process may use for one case
#: Top-level entries of the course root a grading run writes (everything else must stay as it was).
OUTPUTS = set(pipeline.OUTPUTS) | {".cache", "gradebook.db-journal", "submissions_in"}
MARK = re.compile(rb"RTMARK_r\d\d")


# =============================================================================== what changed
def entry(path: Path):
    """``(type, mode, digest)`` of one entry, links and special files never opened."""
    st = os.lstat(path)
    mode = stat.S_IMODE(st.st_mode)
    if stat.S_ISLNK(st.st_mode):
        return ("link", mode, os.readlink(path))
    if stat.S_ISDIR(st.st_mode):
        return ("dir", mode, "")
    if not stat.S_ISREG(st.st_mode):
        return ("special", mode, stat.S_IFMT(st.st_mode))
    if st.st_size > 64 * 2 ** 20:
        return ("file", mode, f"{st.st_size}:{st.st_mtime_ns}")
    return ("file", mode, hashlib.sha256(path.read_bytes()).hexdigest())


def tree(root: Path, skip) -> dict:
    """``{relative path: entry}`` of the course tree, without the folders ``skip(relative)`` names."""
    out = {}
    for folder, dirs, names in os.walk(root):
        rel_folder = os.path.relpath(folder, root)
        dirs[:] = [d for d in dirs if not skip(os.path.normpath(os.path.join(rel_folder, d)))]
        for name in dirs + names:
            rel = os.path.normpath(os.path.join(rel_folder, name))
            if not skip(rel):
                try:
                    out[rel] = entry(Path(folder, name))
                except OSError as exc:
                    out[rel] = ("unreadable", 0, str(exc))
    return out


def changed(before: dict, after: dict) -> list:
    return sorted(k for k in set(before) | set(after) if before.get(k) != after.get(k))


def outputs_only(rel: str) -> bool:
    """The grading run's own outputs (see :data:`OUTPUTS`)."""
    return rel.split(os.sep)[0] in OUTPUTS


def own_or_outputs(student: str):
    """For one student's bare autograde: its own folders and the gradebook's bookkeeping."""
    own = {os.path.join(top, student) for top in ("autograded", "feedback", "submitted")}
    book = {"gradebook.db", "gradebook.db-journal", "integrity", ".autograde_runs", ".cache", "submissions_in"}
    return lambda rel: rel in own or rel.split(os.sep)[0] in book or any(rel.startswith(o + os.sep) for o in own)


# ================================================================================== the watchdog
class Watchdog(threading.Thread):
    """Samples each student's ``nbgrader autograde`` RSS, and unblocks grader processes of ``root``
    stuck on a FIFO for over ``stall`` seconds (opening every FIFO under autograded/ and feedback/
    for reading and writing, which releases a blocked ``open``); every unblocking is recorded."""

    def __init__(self, root: Path, stall: float = 15.0):
        super().__init__(daemon=True)
        self.root, self.stall = str(root), stall
        self.rss: dict = {}
        self.unblocked: dict = {}  # {student: [FIFO paths relative to the root]}
        self.stop = threading.Event()
        self._stuck_since: dict = {}

    def run(self) -> None:
        import psutil

        while not self.stop.wait(0.25):
            for proc in psutil.process_iter(["pid", "cmdline"]):
                cmd = proc.info["cmdline"] or []
                if "nbgrader" not in " ".join(cmd[:4]):
                    continue
                try:
                    if proc.cwd() != self.root:
                        continue
                    rss = proc.memory_info().rss
                    wchan = Path(f"/proc/{proc.pid}/wchan").read_text()
                except (psutil.Error, OSError):
                    continue
                student = student_of(cmd)
                if "autograde" in cmd and student:
                    self.rss[student] = max(self.rss.get(student, 0), rss)
                self._check_stuck(proc.pid, wchan)

    def _check_stuck(self, pid: int, wchan: str) -> None:
        if wchan not in ("wait_for_partner", "fifo_open", "pipe_read", "pipe_write", "pipe_wait"):
            self._stuck_since.pop(pid, None)
            return
        since = self._stuck_since.setdefault(pid, time.monotonic())
        if time.monotonic() - since > self.stall:
            self._unblock()
            self._stuck_since.pop(pid, None)

    def _unblock(self) -> None:
        for top in ("autograded", "feedback"):
            for folder, _, names in os.walk(os.path.join(self.root, top)):
                for name in names:
                    path = os.path.join(folder, name)
                    try:
                        if not stat.S_ISFIFO(os.lstat(path).st_mode):
                            continue
                        fd = os.open(path, os.O_RDWR | os.O_NONBLOCK)
                    except OSError:
                        continue
                    rel = os.path.relpath(path, self.root)
                    self.unblocked.setdefault(rel.split(os.sep)[1], []).append(rel)
                    threading.Timer(2.0, os.close, (fd,)).start()

    def __enter__(self):
        self.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        self.join(timeout=10)


def student_of(cmd: list) -> str:
    """The student id of an ``nbgrader ... --student=<s>`` / ``--student <s>`` command line."""
    for i, arg in enumerate(cmd):
        if arg.startswith("--student="):
            return arg.split("=", 1)[1]
        if arg == "--student" and i + 1 < len(cmd):
            return cmd[i + 1]
    return ""


# ================================================================================ graded paths
@dataclasses.dataclass
class Graded:
    """One path's run of the class."""

    name: str
    root: Path
    db_url: str
    runs: dict  # {student: (finished by itself, seconds, reason)}
    rows: dict  # {(student, notebook, grade_id): (auto_score, final score, max_score)}
    log: bytes  # every byte of the grader's logs and stdout/stderr
    watchdog: Watchdog
    tree_changes: dict  # {student or "*": [changed paths outside the allowed folders]}
    csv_rows: list
    seconds: float
    steps: dict  # {"feedback": CommandRun-like ok, ...}
    marks: dict = dataclasses.field(default_factory=dict)  # {marker: [paths holding it]}


def gradebook_rows(db_url: str) -> dict:
    """Every grade of :data:`A`, straight from the gradebook."""
    from nbgrader.api import Gradebook

    rows = {}
    with Gradebook(db_url, pipeline.COURSE_ID) as gb:
        for sub in gb.find_assignment(A).submissions:
            for snb in sub.notebooks:
                for g in snb.grades:
                    rows[(sub.student.id, snb.name, g.name)] = (g.auto_score, float(g.score), float(g.max_score))
    return rows


def class_files() -> dict:
    return {s: FILES[s] for s in BY_ID}


def _environment(monkeypatch) -> None:
    monkeypatch.setenv("RLHF_CELL_TIMEOUT", str(hr.CELL_TIMEOUT))
    monkeypatch.setenv("RLHF_KERNEL_MEMORY_MB", "4096")
    monkeypatch.setattr(orchestrator, "DEFAULT_STUDENT_TIMEOUT", float(STUDENT_TIMEOUT))


def _logs(root: Path, extra: bytes = b"") -> bytes:
    """The grader's logs in ``root`` (``*.log``, run records, the class report) and ``extra``."""
    chunks = [extra]
    for folder, dirs, names in os.walk(root):
        rel = os.path.relpath(folder, root).split(os.sep)
        if rel[0] in ("autograded", "feedback", "submitted", "submissions_in", "source", "release", "examples"):
            dirs[:] = []
            continue
        for name in names:
            if name.endswith((".log", ".json")) or name == pipeline.REPORT_NAME:
                path = Path(folder, name)
                if path.is_file() and not path.is_symlink() and path.stat().st_size < 64 * 2 ** 20:
                    chunks.append(path.read_bytes())
    return b"\n".join(chunks)


def _marks(root: Path) -> dict:
    """``{marker: [relative paths of regular files that contain it]}`` over the whole course tree."""
    out: dict = {}
    for folder, dirs, names in os.walk(root):
        if os.path.relpath(folder, root).split(os.sep)[0] == "submissions_in":
            dirs[:] = []
            continue
        for name in names:
            path = os.path.join(folder, name)
            try:
                st = os.lstat(path)
                if not stat.S_ISREG(st.st_mode) or st.st_size > 64 * 2 ** 20:
                    continue
                with open(path, "rb") as fh:
                    found = set(MARK.findall(fh.read()))
            except OSError:
                continue
            for m in found:
                out.setdefault(m.decode(), []).append(os.path.relpath(path, root))
    return out


def _csv_rows(path: Path) -> list:
    if not path.is_file():
        return []
    with open(path, newline="", encoding="utf-8") as fh:
        return list(csv.DictReader(fh))


@pytest.fixture(scope="module")
def course_path(tmp_path_factory):
    """The class through the course command (sequential: the cores are shared)."""
    mp = pytest.MonkeyPatch()
    _environment(mp)
    root = fresh_course(tmp_path_factory.mktemp("runtime_course") / "course", session_base(tmp_path_factory))
    subs = write_submissions(root / "submissions_in", class_files())
    before = tree(root, outputs_only)
    started = time.perf_counter()
    try:
        with Watchdog(root) as dog:
            result = pipeline.run_class(subs, root=root, db_url=own_db(root), names=[A], fresh=False,
                                        regenerate=False, release_pending_feedback=True)
    finally:
        mp.undo()
    seconds = time.perf_counter() - started
    runs = {r.student: (r.ok and not getattr(r, "timed_out", False), r.seconds, r.reason or "") for r in result.runs}
    tails = "\n".join(getattr(r, "log_tail", "") or "" for r in result.runs).encode("utf-8", "replace")
    graded = Graded("course", root, own_db(root), runs, gradebook_rows(own_db(root)), _logs(root, tails), dog,
                    {"*": changed(before, tree(root, outputs_only))}, _csv_rows(result.csv_path), seconds,
                    {"stages": result.seconds})
    graded.marks = _marks(root)
    print(f"\n[runtime/course] {len(BY_ID)} students in {seconds:.0f} s; stages {result.seconds}", flush=True)
    yield graded
    _drop_big_files(root)


def _nbgrader(root: Path, args: list, timeout: float) -> tuple[int, bytes, float]:
    """``python -m nbgrader ARGS`` in ``root`` with the course's environment: (returncode, output, seconds);
    returncode None when it had to be killed at ``timeout``."""
    started = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-m", "nbgrader", *args], cwd=root,
                            env=pipeline.nbgrader_env(root, own_db(root)), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=timeout)
        code = proc.returncode
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, 9)
        out, _ = proc.communicate()
        code = None
    return code, out, time.perf_counter() - started


@pytest.fixture(scope="module")
def bare_path(tmp_path_factory):
    """The class through bare nbgrader, one ``autograde --student`` per student (Formgrader's button)."""
    mp = pytest.MonkeyPatch()
    _environment(mp)
    root = fresh_course(tmp_path_factory.mktemp("runtime_bare") / "course", session_base(tmp_path_factory))
    write_submissions(root / "submitted", class_files())
    before_all = tree(root, outputs_only)
    runs, log, changes, steps = {}, [], {}, {}
    started = time.perf_counter()
    try:
        with Watchdog(root) as dog:
            for student in sorted(BY_ID):
                skip = own_or_outputs(student)
                before = tree(root, skip)
                code, out, secs = _nbgrader(root, ["autograde", A, "--student", student, "--force"], STUDENT_TIMEOUT)
                runs[student] = (code == 0, secs, "" if code == 0 else f"exit {code}: {out[-300:]!r}")
                changes[student] = changed(before, tree(root, skip))
                log.append(out)
            code, out, secs = _nbgrader(root, ["generate_feedback", A, "--force"], FEEDBACK_TIMEOUT)
            log.append(out)
            steps["feedback"] = code == 0
            if code != 0:  # as the course does: each student alone, so one cannot cost the others
                for student in sorted(BY_ID):
                    c, o, _ = _nbgrader(root, ["generate_feedback", A, "--student", student, "--force"], 300)
                    log.append(o)
            code, out, _ = _nbgrader(root, ["export", "--to", str(root / "grades.csv")], 300)
            log.append(out)
            steps["export"] = code == 0
    finally:
        mp.undo()
    seconds = time.perf_counter() - started
    changes["*"] = changed(before_all, tree(root, outputs_only))
    graded = Graded("bare", root, own_db(root), runs, gradebook_rows(own_db(root)), _logs(root, b"\n".join(log)),
                    dog, changes, _csv_rows(root / "grades.csv"), seconds, steps)
    graded.marks = _marks(root)
    print(f"\n[runtime/bare] {len(BY_ID)} students in {seconds:.0f} s; steps {steps}", flush=True)
    yield graded
    _drop_big_files(root)


def _drop_big_files(root: Path) -> None:
    """Remove what the sparse-file case left (up to a GiB, twice) once the module is done."""
    for folder, _, names in os.walk(root):
        for name in names:
            path = os.path.join(folder, name)
            try:
                if stat.S_ISREG(os.lstat(path).st_mode) and os.lstat(path).st_size > 64 * 2 ** 20:
                    os.unlink(path)
            except OSError:
                pass


@pytest.fixture(params=PATHS)
def graded(request) -> Graded:
    return request.getfixturevalue(f"{request.param}_path")


# ================================================================================= active HTML
ACTIVE_ATTRS = ("href", "src", "action", "formaction", "xlink:href", "data", "srcdoc")


class ActiveHTML(html.parser.HTMLParser):
    """Real tags and attributes (never escaped text) of an HTML text that carry ``marker``."""

    def __init__(self, marker: str):
        super().__init__(convert_charrefs=True)
        self.marker, self.found, self._script = marker, [], False

    def handle_starttag(self, tag, attrs):
        for name, value in attrs:
            value = value or ""
            if name.startswith("on") and self.marker in value:
                self.found.append(f"<{tag} {name}=...{self.marker}>")
            if name in ACTIVE_ATTRS and (value.strip().lower().startswith("javascript:") or name == "srcdoc") \
                    and self.marker in value:
                self.found.append(f"<{tag} {name}=...{self.marker}>")
        self._script = tag == "script"

    def handle_startendtag(self, tag, attrs):
        self.handle_starttag(tag, attrs)
        self._script = False

    def handle_endtag(self, tag):
        self._script = False

    def handle_data(self, data):
        if self._script and self.marker in data:
            self.found.append(f"<script>...{self.marker}</script>")


def active_html(text: str, marker: str) -> list:
    parser = ActiveHTML(marker)
    parser.feed(text)
    parser.close()
    return parser.found


def active_outputs(path: Path, marker: str) -> list:
    """Active content of the student's in the outputs of an autograded notebook."""
    try:
        nb = nbformat.read(str(path), as_version=4)
    except Exception:  # noqa: BLE001 - an unreadable notebook has no outputs to show
        return []
    found = []
    for cell in nb.cells:
        for out in cell.get("outputs", []):
            for mime, data in (out.get("data") or {}).items():
                text = "".join(data) if isinstance(data, list) else str(data)
                if marker not in text:
                    continue
                if "javascript" in mime or "ecmascript" in mime:
                    found.append(f"{mime} output")
                elif mime in ("text/html", "image/svg+xml", "text/markdown"):
                    found += [f"{mime}: {f}" for f in active_html(text, marker)]
    return found


# ===================================================================================== verdicts
def _own(rel: str, student: str) -> bool:
    return any(rel == os.path.join(top, student) or rel.startswith(os.path.join(top, student) + os.sep)
               for top in ("autograded", "feedback", "submitted", "submissions_in",
                           os.path.join("integrity", "quarantine")))


def _folder(g: Graded, top: str, student: str) -> Path:
    return g.root / top / student / A


def _entries(folder: Path):
    for sub, dirs, names in os.walk(folder):
        for name in dirs + names:
            yield Path(sub, name)


def check_grades(case, g: Graded) -> list:
    problems = []
    for key in case.auto_zero:
        nb, gid = key.split("/")
        row = g.rows.get((case.student, nb, gid))
        if row is None or row[0] not in (0, 0.0):
            problems.append(f"{key}: the autograder gave {row and row[0]}, expected 0")
    for key in case.zero:
        nb, gid = key.split("/")
        row = g.rows.get((case.student, nb, gid))
        if row is None or row[1] != 0:
            problems.append(f"{key}: final score {row and row[1]}, expected 0 (or withheld)")
    for key in case.full:
        nb, gid = key.split("/")
        row = g.rows.get((case.student, nb, gid))
        if row is None or row[1] != row[2]:
            problems.append(f"{key}: final score {row and row[1]} of {row and row[2]}, expected full points")
    return problems


#: The grader's own records of a run. A pre-flight finding quotes the statement it reports (for the
#: instructor, in the gradebook's comment, the integrity report and the run's log), so a student
#: whose code the pre-flight reported has its marker there by design.
REPORTS = ("gradebook.db", "grading_report.json", os.path.join("integrity", A + ".json"), ".autograde_runs")


def _quoted_by_preflight(g: Graded, student: str) -> bool:
    """Did the pre-flight report a statement of ``student``'s code (rebinding, introspection)?"""
    try:
        report = json.loads((g.root / "integrity" / f"{A}.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return any(f.get("student") == student and f.get("code") in ("rebinding", "introspection")
               for f in report.get("findings", []))


def check_tree(case, g: Graded) -> list:
    problems = []
    if g.name == "bare" and g.tree_changes.get(case.student):
        problems.append(f"its autograde changed files outside its own folders: {g.tree_changes[case.student][:6]}")
    quoted = _quoted_by_preflight(g, case.student)
    for rel in g.marks.get(case.marker, []):
        if quoted and (rel in REPORTS or rel.startswith(REPORTS[-1] + os.sep)):
            continue  # the finding's quote of the student's statement
        if not _own(rel, case.student):
            problems.append(f"its marker {case.marker} is in {rel} (a file outside its own folders)")
    return problems[:8]


def check_classmate(case, g: Graded) -> list:
    problems = []
    c = hr.CONTROL
    for key in BY_ID[c].full:
        nb, gid = key.split("/")
        row = g.rows.get((c, nb, gid))
        if row is None or row[1] != row[2]:
            problems.append(f"the classmate's {key}: {row}, expected full points")
    if case.student == c:
        return problems
    for top in ("autograded", "feedback"):
        folder = _folder(g, top, c)
        for p in _entries(folder):
            if p.is_symlink() or not (p.is_file() or p.is_dir()):
                problems.append(f"the classmate's {p.relative_to(g.root)} is a link or special file")
    for rel in g.marks.get(case.marker, []):
        if _own(rel, c):
            problems.append(f"the classmate's {rel} holds this student's marker")
    pages = sorted(p.name for p in _folder(g, "feedback", c).glob("*.html"))
    if pages != [hr.NB + ".html", hr.NB2 + ".html"]:
        problems.append(f"the classmate's feedback pages: {pages}")
    return problems


def check_completes(case, g: Graded) -> list:
    problems = []
    ok, secs, reason = g.runs.get(case.student, (False, 0, "not run"))
    if not ok:
        problems.append(f"its autograde did not finish by itself after {secs:.0f} s: {reason[:200]}")
    if case.student in g.watchdog.unblocked:
        problems.append(f"a grader process hung on its FIFO(s) {g.watchdog.unblocked[case.student][:3]} "
                        "and had to be unblocked")
    return problems


def check_leftovers(case, g: Graded) -> list:
    problems = []
    for top in ("autograded", "feedback"):
        for p in _entries(g.root / top / case.student):
            st = os.lstat(p)
            rel = p.relative_to(g.root)
            if stat.S_ISLNK(st.st_mode) or not (stat.S_ISREG(st.st_mode) or stat.S_ISDIR(st.st_mode)):
                problems.append(f"{rel!s:.120}: a {'link' if stat.S_ISLNK(st.st_mode) else 'special file'}")
            elif st.st_mode & (stat.S_ISUID | stat.S_ISGID) or st.st_mode & stat.S_IWOTH:
                problems.append(f"{rel!s:.120}: mode {oct(stat.S_IMODE(st.st_mode))}")
            if len(problems) > 5:
                return problems
    submitted = set(FILES[case.student][A])
    allowed = {Path(n).stem + ".html" for n in submitted if n.endswith(".ipynb")} | \
        {n for n in submitted if not n.endswith(".ipynb")}
    fb = _folder(g, "feedback", case.student)
    extra = sorted(str(p.relative_to(fb)) for p in _entries(fb) if str(p.relative_to(fb)) not in allowed)
    if extra:
        problems.append(f"its feedback folder holds what its kernel left behind: {[e[:60] for e in extra[:5]]}"
                        + (f" and {len(extra) - 5} more" if len(extra) > 5 else ""))
    return problems


def check_html(case, g: Graded) -> list:
    problems = []
    for path in sorted(_folder(g, "autograded", case.student).glob("*.ipynb")):
        if path.is_file() and not path.is_symlink():
            problems += [f"autograded {path.name}: {f}" for f in active_outputs(path, case.marker)]
    pages = sorted(_folder(g, "feedback", case.student).glob("*.html"))
    if not pages:
        problems.append("no feedback page to check")
    for page in pages:
        if page.is_file() and not page.is_symlink():
            found = active_html(page.read_text(encoding="utf-8", errors="replace"), case.marker)
            problems += [f"feedback {page.name}: {f}" for f in found]
    return problems


def _errors(g: Graded, student: str, key: str) -> list:
    nb, gid = key.split("/")
    path = _folder(g, "autograded", student) / f"{nb}.ipynb"
    try:
        notebook = nbformat.read(str(path), as_version=4)
    except Exception:  # noqa: BLE001
        return []
    for cell in notebook.cells:
        if cell.get("metadata", {}).get("nbgrader", {}).get("grade_id") == gid:
            return [f"{o.get('ename')}: {o.get('evalue') or ''.join(o.get('traceback', []))}"
                    for o in cell.get("outputs", []) if o.get("output_type") == "error"]
    return []


def check_message(case, g: Graded) -> list:
    problems = []
    for key in sorted(set(case.auto_zero) | set(case.zero)):
        errors = [e for e in _errors(g, case.student, key) if len(e.split(": ", 1)[-1].strip()) > 10]
        if not errors:
            problems.append(f"{key}: no error output with a message in the autograded notebook")
    return problems


def check_rss(case, g: Graded) -> list:
    base = g.watchdog.rss.get(hr.CONTROL)
    got = g.watchdog.rss.get(case.student)
    if base is None or got is None:
        return [f"no RSS sample (control {base}, student {got})"]
    if got > base + RSS_MARGIN:
        return [f"nbgrader autograde peaked at {got >> 20} MiB, the control at {base >> 20} MiB "
                f"(margin {RSS_MARGIN >> 20} MiB)"]
    return []


def check_log(case, g: Graded) -> list:
    n = g.log.count(case.marker.encode())
    return [f"the grader's log/stdout holds {n} copies of the kernel's bytes ({case.marker})"] if n else []


def check_deadline(case, g: Graded) -> list:
    honest = [g.runs[s][1] for s in BY_ID if BY_ID[s].kind == "html" and s in g.runs and g.runs[s][0]]
    base = sorted(honest)[len(honest) // 2] if honest else 60.0
    secs = g.runs.get(case.student, (False, 0.0, ""))[1]
    limit = base + 1.5 * hr.CELL_TIMEOUT
    if secs > limit:
        return [f"its autograde took {secs:.0f} s, an honest one {base:.0f} s: the slow judged cell was given "
                f"more than one {hr.CELL_TIMEOUT} s deadline (limit {limit:.0f} s)"]
    return []


CHECKERS = {"tree": check_tree, "classmate": check_classmate, "completes": check_completes,
            "leftovers": check_leftovers, "html": check_html, "message": check_message, "rss": check_rss,
            "log": check_log, "deadline": check_deadline}


def problems_of(case, g: Graded) -> list:
    out = [f"[grades] {p}" for p in check_grades(case, g)]
    for name in case.checks:
        out += [f"[{name}] {p}" for p in CHECKERS[name](case, g)]
    return out


# ======================================================================================== tests
def test_the_class_of_runtime_cases_is_complete():
    """At least 40 attacks, every class of the issue, one unique marker each, nothing committed."""
    cases, files = hr.build_cases()
    assert len(cases) >= 41 and cases[0].student == hr.CONTROL
    kinds = {c.kind for c in cases}
    assert kinds == {"control", "files", "html", "gradient", "resources"}
    assert len({c.marker for c in cases}) == len(cases)
    for c in cases:
        assert set(c.checks) <= set(hr.CHECKS) and set(hr.BASE_CHECKS) <= set(c.checks)
        assert (c.marker in json.dumps(files[c.student])) is (c.student != hr.CONTROL), c.student
    assert not (Path(__file__).parent.parent / "examples" / "hostile" / cases[1].student).exists()


@pytest.mark.slow
@pytest.mark.timeout(7200)
@pytest.mark.parametrize("case", CASES, ids=[c.student for c in CASES])
def test_runtime_case_keeps_its_invariants(graded, case):
    problems = problems_of(case, graded)
    assert not problems, f"{graded.name} path, {case.student} ({case.title}):\n  " + "\n  ".join(problems)


@pytest.mark.slow
@pytest.mark.timeout(7200)
def test_the_course_tree_outside_the_outputs_is_unchanged(graded):
    """source/, release/, nbgrader_config.py, examples/: as they were (content, mode, type)."""
    assert not graded.tree_changes["*"], graded.tree_changes["*"][:10]


@pytest.mark.slow
@pytest.mark.timeout(7200)
def test_feedback_and_export_ran_for_the_whole_class(graded):
    ids = {r["student_id"] for r in graded.csv_rows if r.get("assignment") == A}
    assert ids == set(BY_ID), sorted(set(BY_ID) ^ ids)
    missing = [s for s in BY_ID if not list(_folder(graded, "feedback", s).glob("*.html"))
               and BY_ID[s].kind != "files"]
    assert not missing, f"no feedback page for {missing}"


@pytest.mark.slow
@pytest.mark.timeout(7200)
def test_both_paths_give_the_same_grades_cell_by_cell(course_path, bare_path):
    keys = sorted(set(course_path.rows) | set(bare_path.rows))
    diff = {k: (course_path.rows.get(k), bare_path.rows.get(k)) for k in keys
            if (course_path.rows.get(k) or (None, None))[:2] != (bare_path.rows.get(k) or (None, None))[:2]}
    assert not diff, "\n".join(f"{k}: course {a}, bare {b}" for k, (a, b) in sorted(diff.items())[:20])
    print(f"\n[runtime] wall time: course {course_path.seconds:.0f} s, bare {bare_path.seconds:.0f} s", flush=True)


def test_the_default_selection_covers_every_kind():
    """The suite's default cases include every kind of attack, and each prefix names a case."""
    cases, _ = hr.build_cases()
    chosen = [c for c in cases if any(c.student.startswith(p) for p in DEFAULT_CASES.split(","))]
    assert len(chosen) == len(DEFAULT_CASES.split(","))
    assert {c.kind for c in chosen} == {"files", "html", "gradient", "resources"}
