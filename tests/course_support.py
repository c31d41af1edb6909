"""Shared, session-scoped support for tests that run the REAL nbgrader pipeline on the course.

Import what you need in a test module (``tests/`` is on ``sys.path``; see conftest.py)::

    from course_support import bundled_class, course_template, run_custom_class, ...

Expensive things happen once per pytest session and are memoised at module level, so importing a
fixture into several test modules never runs the class twice.

API
---
``REPO``
    The repository root (the course root).
``course_template(base) -> Path``
    A copy of the course (``nbgrader_config.py``, ``source/``, ``release/``, ``examples/``) in which
    ``nbgrader generate_assignment`` has run for every assignment, so its SQLite ``gradebook.db``
    knows every notebook and graded cell. Built once per session under ``base`` (under pytest-xdist,
    once for all the session's processes, in the folder they share).
``seeded_template(base) -> Path``
    That template plus the compile-cache seeds of the graded assignments (the source notebooks run
    once in the sandbox, about 100 s), in a folder of its own, built once per session when a test
    first asks for a course to grade in.
``fresh_course(dest, base, seeds=True) -> Path``
    A new copy of the seeded template at ``dest`` (gradebook included): a private course to grade
    into. ``seeds=False`` copies the template without seeds, for a test that never runs a kernel
    (then no test of the fast part waits for the seeds).
``own_db(root) -> str``
    ``sqlite:///<root>/gradebook.db``: pass it as ``db_url`` to pipeline functions on a copy.
``bundled_class(base) -> ClassRun``
    The bundled example class (``examples/submissions``: correct, unchanged release, one student
    per mistake recipe, noisy-but-correct) through collect -> autograde (one nbgrader process per
    student, on :func:`class_grader`'s workers) -> feedback -> export, in its own copy of the
    template. Once per session.
    ``ClassRun`` is :class:`rlhf_lab.instructor.classrun.pipeline.ClassRun`: ``.root``, ``.runs``
    (:class:`StudentRun` per student and assignment: ok / reason / notes / seconds),
    ``.grades`` (:class:`Grades`: ``.cell(student, assignment, grade_id)``, ``.by_cell(...)``,
    ``.totals``, ``.tests(assignment)``), ``.feedback``, ``.csv_path``, ``.collected``.
``run_custom_class(dest, submissions, base, names=None, grader=None) -> ClassRun``
    Grade YOUR submissions in a fresh copy of the template. ``submissions`` maps
    ``student -> assignment -> notebook name -> NotebookNode | str | bytes`` (str/bytes are written
    verbatim, e.g. invalid JSON; ``None`` omits the notebook). ``grader`` replaces the sequential
    loop (signature of :func:`rlhf_lab.instructor.classrun.pipeline.run_class`'s ``grader``).
``correct_submission(assignment)`` / ``release_submission(assignment)``
    ``{notebook name: NotebookNode}`` built from the committed release (and source solutions).
``replace_cell(nb, grade_id, code)``
    A copy of a notebook with one cell's source replaced.
``mistakes()``
    ``{student_id: Mistake}`` of the bundled class (recipe, assignment, notebook, grade_id, fails).
``load_module(path, name)``
    A Python file that is not in a package (``tools/*.py``, ``examples/mistakes/*.py``) as a module.
``kill_tree(proc) -> int``
    SIGKILL a started process and everything it started (a crash of a whole run); how many died.
``LIBRARY_LOG``
    A compiled pattern for library log noise (XLA's C++ log lines, absl's start-up warning,
    fontconfig's errors): what must never reach a student's feedback or the instructor's terminal.

pytest fixtures (session scope): ``course_template_dir``, ``seeded_template_dir``, ``bundled_class_run``.
"""
from __future__ import annotations

import importlib.util
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

REPO = Path(__file__).resolve().parents[1]
_bin = str(Path(sys.executable).parent)
if os.environ.get("PATH", "").split(os.pathsep)[0] != _bin:
    os.environ["PATH"] = _bin + os.pathsep + os.environ.get("PATH", "")
os.environ.setdefault("JAX_PLATFORMS", "cpu")

from fixtures import submissions  # noqa: E402
from rlhf_lab.instructor.classrun import pipeline  # noqa: E402
from rlhf_lab.instructor.classrun.pipeline import ClassRun  # noqa: E402

_CACHE: dict = {}

#: XLA's C++ log lines ("E1202 01:16:02.770867  7659 cpu_aot_loader.cc:220] ..."), absl's notes and
#: fontconfig's complaint when a sandboxed kernel cannot read its configuration.
LIBRARY_LOG = re.compile(r"[IWEF]\d{4} \d\d:\d\d:\d\d\.\d+ +\d+ \S+\.(cc|h):\d+\]|cpu_aot_loader"
                         r"|Assume version compatibility|absl::InitializeLog|TF_CPP_MIN_LOG_LEVEL|Fontconfig error")


def _build_template(dest: Path) -> Path:
    root = pipeline.copy_course(dest, REPO)
    pipeline.check_config(root, own_db(root))
    pipeline.generate(root, pipeline.assignments(root), db_url=own_db(root))
    return root


def _build_seeded(dest: Path, template: Path) -> Path:
    from rlhf_lab.instructor.grader import compile_cache

    shutil.copytree(template, dest, symlinks=True)
    for assignment in pipeline.graded_assignments(dest):  # copied from the repository's .cache when unchanged
        compile_cache.ensure_seed(dest, assignment)
    return dest


def _shared_build(base: Path, name: str, build) -> Path:
    """``build(folder)`` once per session for all its processes: the first to ask builds it in the
    folder they share (the parent of each process's base temporary folder) while holding a lock, the
    others wait for it; a build that failed part-way in another process is started again."""
    if name not in _CACHE:
        import fcntl

        home = _CACHE.get("shared") or Path(base)
        with open(home / f"{name}.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes, even on failure
            root, done = home / name, home / f"{name}.complete"
            if not done.exists():
                if root.exists():
                    shutil.rmtree(root)
                build(root)
                done.write_text("built\n")
        _CACHE[name] = root.resolve()
    return _CACHE[name]


def course_template(base: Path) -> Path:
    """The generated course template (see module docstring); built once per session for all its
    processes (:func:`_shared_build`). Tests only copy it (:func:`fresh_course`) or read it."""
    return _shared_build(base, "course_template", _build_template)


def seeded_template(base: Path) -> Path:
    """:func:`course_template` with the graded assignments' compile-cache seeds, in its own folder
    (built once per session, as the template; tests only copy it)."""
    template = course_template(base)
    return _shared_build(base, "course_template_seeded", lambda dest: _build_seeded(dest, template))


def own_db(root: Path) -> str:
    """The SQLite gradebook inside ``root``, passed explicitly so an inherited ``$RLHF_COURSE_DB``
    (for example a test's monkeypatched value) can never redirect the shared runs."""
    return "sqlite:///" + str(Path(root) / "gradebook.db")


def fresh_course(dest: Path, base: Path, seeds: bool = True) -> Path:
    """A private copy of the generated template at ``dest`` (gradebook included), with the
    compile-cache seeds unless ``seeds=False`` (a test that runs no kernel)."""
    template = seeded_template(base) if seeds else course_template(base)
    dest = Path(dest)
    shutil.copytree(template, dest, ignore=shutil.ignore_patterns("submitted", "autograded", "feedback"))
    (dest / "autograded").mkdir(exist_ok=True)
    return dest.resolve()


def bundled_class(base: Path) -> ClassRun:
    """The bundled example class, graded once per session (see module docstring)."""
    if "bundled" not in _CACHE:
        root = fresh_course(Path(base) / "bundled_class", base)
        _CACHE["bundled"] = pipeline.run_class(root / "examples" / "submissions", root=root,
                                               db_url=own_db(root), fresh=False, regenerate=False,
                                               grader=class_grader())
    return _CACHE["bundled"]


def class_grader():
    """The autograde step of the session's class runs: Dask with ``RLHF_TEST_WORKERS`` workers
    (default 2, the machine's cores), or the sequential loop (``None``) when that is 0 or 1.

    The same grades either way (``tests/test_parallel.py`` compares the two cell by cell, and
    ``tests/test_trust.py`` regrades part of this class with the sequential loop and compares)."""
    workers = int(os.environ.get("RLHF_TEST_WORKERS", "2") or 0)
    if workers <= 1:
        return None
    from rlhf_lab.instructor.classrun import parallel

    return parallel.dask_grader(workers=workers)


def write_submissions(folder: Path, subs: dict) -> Path:
    """Write ``student -> assignment -> notebook -> content`` under ``folder``; returns it."""
    folder = Path(folder)
    for student, by_assignment in subs.items():
        for assignment, nbs in by_assignment.items():
            adir = folder / student / assignment
            adir.mkdir(parents=True, exist_ok=True)
            for name, content in nbs.items():
                if content is None:
                    continue
                path = adir / (name if name.endswith(".ipynb") or "." in name else name + ".ipynb")
                if isinstance(content, bytes):
                    path.write_bytes(content)
                elif isinstance(content, str):
                    path.write_text(content, encoding="utf-8")
                else:
                    path.write_text(submissions.dumps(content), encoding="utf-8")
    return folder


def run_custom_class(dest: Path, subs: dict, base: Path, names=None, grader=None) -> ClassRun:
    """Grade ``subs`` (see module docstring) in a fresh template copy at ``dest``."""
    root = fresh_course(dest, base)
    folder = write_submissions(root / "custom_submissions", subs)
    if names is None:
        names = sorted({a for by_a in subs.values() for a in by_a})
    return pipeline.run_class(folder, root=root, db_url=own_db(root), names=names, fresh=False,
                              regenerate=False, grader=grader)


def correct_submission(assignment: str) -> dict:
    return submissions.correct_submission(assignment, REPO)


def release_submission(assignment: str) -> dict:
    return submissions.release_submission(assignment, REPO)


def replace_cell(nb, grade_id: str, code: str):
    return submissions.replace_cell(nb, grade_id, code)


def mistakes() -> dict:
    return submissions.mistake_students(submissions.all_mistakes(REPO))


#: The in-kernel message of a task handed to the course library.
DELEGATION_MESSAGE = "must be implemented, not delegated"


def autograde_mistakes() -> dict:
    """The mistakes whose recipe also describes the autograded outcome.

    Delegation recipes are left out: while autograding, the kernel's library build lacks the
    function, so an import of it fails inside the student's answer cell (and can take later
    definitions of that cell's notebook with it), while the in-kernel notebook tests see the
    library's message. The trust report's delegation cases (h12, h15-h17) hold those outcomes.
    """
    return {sid: m for sid, m in mistakes().items()
            if DELEGATION_MESSAGE not in " ".join(str(v) for v in m.messages.values())}


def read_notebook(path: Path):
    return nbformat.read(path, as_version=4)


def load_module(path: Path, name: str):
    """The Python file at ``path`` (not part of a package) loaded as module ``name``."""
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def kill_tree(proc: subprocess.Popen) -> int:
    """SIGKILL the process and everything it started (a crash of the whole run); returns how many."""
    import psutil

    try:
        parent = psutil.Process(proc.pid)
        procs = parent.children(recursive=True) + [parent]
    except psutil.NoSuchProcess:
        return 0
    for p in procs:
        try:
            p.kill()
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(procs, timeout=30)
    proc.wait(timeout=30)
    return len(procs)


@pytest.fixture(scope="session")
def course_template_dir(tmp_path_factory) -> Path:
    return course_template(_session_base(tmp_path_factory))


@pytest.fixture(scope="session")
def seeded_template_dir(tmp_path_factory) -> Path:
    return seeded_template(_session_base(tmp_path_factory))


@pytest.fixture(scope="session")
def bundled_class_run(tmp_path_factory) -> ClassRun:
    return bundled_class(_session_base(tmp_path_factory))


def _session_base(tmp_path_factory) -> Path:
    if "base" not in _CACHE:
        _CACHE["base"] = tmp_path_factory.mktemp("course_support")
        if os.environ.get("PYTEST_XDIST_WORKER"):  # .../pytest-N/popen-gwK: pytest-N is the session's
            _CACHE["shared"] = tmp_path_factory.getbasetemp().parent
    return _CACHE["base"]


def session_base(tmp_path_factory) -> Path:
    """The session's scratch folder for course copies (pass it as ``base`` above)."""
    return _session_base(tmp_path_factory)


def course_config():
    """The course's ``nbgrader_config.py`` as nbgrader loads it, rooted at this repository (the environment restored after)."""
    from traitlets.config.loader import PyFileConfigLoader

    saved = dict(os.environ)
    try:
        os.environ.update(RLHF_COURSE_ROOT=str(REPO), RLHF_COURSE_DB="sqlite:///" + str(REPO / "gradebook.db"))
        return PyFileConfigLoader("nbgrader_config.py", path=str(REPO)).load_config()
    finally:
        os.environ.clear()
        os.environ.update(saved)
