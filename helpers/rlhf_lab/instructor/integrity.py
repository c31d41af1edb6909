"""Pre-flight integrity checks of submitted notebooks, run BEFORE ``nbgrader autograde``.

nbgrader restores locked cells from their checksums and re-reads points and kernels from the
gradebook, but it grades whatever runs: it does not notice a notebook that is not JSON (the whole
student fails), a notebook renamed or taken from the other assignment, a test cell deleted or
moved above the locked ``grading.start()`` cell, an extra ``numpy.py`` beside the notebook that
shadows the real module, or a student cell that rebinds ``np.testing.assert_allclose``. This module
checks every ``submitted/<student>/<assignment>/`` folder against ``release/<assignment>/`` and
statically scans every cell a student can edit, and reports each problem as a :class:`Finding`
(student, notebook, cell, line, a plain message).

Policy: what blocks grading and what only warns
-----------------------------------------------
``block`` findings withhold points, for instructor review, from exactly the autograded cells the
problem can have influenced; ``warn`` findings are reported and change nothing.

=========================================  =====  =============================================
finding                                    level  effect
=========================================  =====  =============================================
notebook is not valid JSON / nbformat      block  file moved to quarantine (so nbgrader can
                                                  grade the student's other notebooks); all its
                                                  autograded cells score 0
notebook missing                           block  nbgrader scores it 0 (nothing to run)
notebook renamed (cells match a missing    block  the expected notebook scores 0; the message
expected notebook)                                names both files so the instructor can rename
notebook of the other assignment under an  block  quarantined (never executed); scores 0
expected name
unknown extra notebook / extra file        warn   nbgrader ignores unknown notebooks; extra
                                                  files are copied beside the notebook
nbgrader's own ``timestamp.txt`` and       none   written by ``nbgrader submit`` into every
``submission_secret.txt`` (exchange)              submission; not reported
extra file or folder that shadows an       block  quarantined (never importable); every
importable module (``numpy.py``, ...)             autograded cell of the assignment withheld
symbolic link                              block  quarantined; assignment withheld
wrong kernel name / language               warn   nbgrader runs the release's kernel anyway
locked test cell edited                    block  that test withheld (nbgrader restores the
                                                  original and its auto score is kept visible)
locked given cell edited                   warn   nbgrader restores it
locked ``grading.start()`` cell edited     block  whole notebook withheld
test / given cell deleted                  block  that test (or, for a given cell, the tests
                                                  after it) withheld
locked cell duplicated                     block  tests from the first duplicate on withheld
answer cell duplicated (copy and paste)    warn   nbgrader grades the last copy
nbgrader cells reordered, or code before   block  whole notebook withheld (code running before
the locked first cell                             the snapshot can subvert every test)
student cell rebinding np/jnp/jax/         block  every autograded cell after that cell in the
builtins/unittest/grading/rlhf_lab attrs,         notebook withheld (they ran in a kernel the
``sys.modules``/``setprofile``/``settrace``,      student had altered)
``os._exit``/``sys.exit``/signals/
subprocesses, ``NBGRADER_EXECUTION`` or any
other grading detection, ``__eq__``/
``__bool__`` returning a constant, ctypes/
gc/frame introspection, exec of
non-literal code, gradebook access
uses of the course library in an answer    warn   the hidden tests themselves refuse delegated
cell, environment reads, file writes,             tasks (:func:`rlhf_lab.grading.call`)
threads
student folder with spaces/non-ASCII       warn   graded normally; listed for roster matching
student folder nbgrader cannot address     block  not graded (nbgrader globs the name)
(``*?[]``, leading dot)
=========================================  =====  =============================================

Since hidden tests are decided outside the kernel by the judge and kernels run in a sandbox, the
rows about what code does inside the kernel or about cells nbgrader restores (rebinding names,
grading detection, blocked calls and imports, shell magics, code before the first cell, an edited
locked test or first cell, reordered cells: :data:`KERNEL_ONLY`) are *warnings* that withhold
nothing: they can no longer change a grade. Grading with ``RLHF_NO_SANDBOX=1`` keeps them blocking.

A withheld cell gets ``manual_score = 0`` in the gradebook (nbgrader's own override; the
autograder's ``auto_score`` is kept, so an instructor who clears the override in formgrader
restores it), its notebook is ``flagged`` and the reason is written as a comment on the
notebook's answer cells, which nbgrader shows in the feedback. Everything is also written to
``integrity/<assignment>.json`` in the course root (files that must not run go to
``integrity/quarantine/<student>/<assignment>/``, each with a ``.finding.json`` saying why).

Command line::

    python -m rlhf_lab.instructor.integrity ASSIGNMENT [--student ID ...] [--no-quarantine] [--json PATH]
"""
from __future__ import annotations

import ast
import dataclasses
import json
import os
import re
import shutil
import sys
import unicodedata
from pathlib import Path
from typing import Iterable

import nbformat

from .course import COURSE_ID, Course, course_root, default_db_url, ensure_venv_on_path

BLOCK = "block"
WARN = "warn"
#: Everything the pre-flight writes lives under ``<course root>/integrity/`` (a pipeline output).
OUTPUT_DIR = "integrity"
#: Files ``nbgrader submit`` adds to every submission in the exchange (``collect`` copies them into
#: ``submitted/``): the submission time and the secret that ties released feedback to it. They are
#: nbgrader's, not extra files of the student (small text files only; anything larger is an extra).
NBGRADER_EXCHANGE_FILES = ("timestamp.txt", "submission_secret.txt")
QUARANTINE = "integrity/quarantine"
#: Findings about what a student's code would do inside its kernel, or about cells nbgrader restores.
#: Hidden tests are decided by the judge outside the kernel (rlhf_lab.instructor.judge) from the
#: outputs of the student's functions, and kernels run in a sandbox without the gradebook, the course
#: files or the network (rlhf_lab.instructor.sandbox), so none of these can change a grade: they are
#: reported for review and withhold nothing. Grading without the sandbox (RLHF_NO_SANDBOX=1) keeps
#: them blocking, because there the kernel can reach the course's files.
KERNEL_ONLY = frozenset({
    "tamper-attribute", "rebind-builtin", "fake-dunder", "grading-detection", "blocked-call", "blocked-import",
    "grader-access", "shell", "magic", "magic-cell", "code-before-start", "edited-start", "edited-test",
    "reordered",
})
KERNEL_ONLY_NOTE = "(changes no grade: the judge decides outside the kernel; listed for review)"


def judged_policy(findings: list, sandboxed: bool | None = None) -> list:
    """``findings`` with every :data:`KERNEL_ONLY` finding turned into a warning that withholds nothing."""
    if sandboxed is None:
        sandboxed = os.environ.get("RLHF_NO_SANDBOX", "") in ("", "0")
    if not sandboxed:
        return findings
    out = []
    for f in findings:
        if f.code in KERNEL_ONLY and f.severity == BLOCK:
            message = f.message.replace(", so the notebook is withheld for review", "").replace(
                " and are withheld for review", "").replace("; points withheld for review", "")
            f = dataclasses.replace(f, severity=WARN, withhold=(), message=f"{message} {KERNEL_ONLY_NOTE}")
        out.append(f)
    return out
REPORT_TEMPLATE = "integrity/{assignment}.json"
COMMENT_TAG = "[integrity]"


# --------------------------------------------------------------------------------------- findings
@dataclasses.dataclass(frozen=True)
class Finding:
    """One problem with one student's submission."""

    student: str
    assignment: str
    notebook: str | None  # file name inside the assignment folder (None: the folder itself)
    cell: int | None  # index of the cell in the submitted notebook
    grade_id: str | None  # nbgrader id of that cell, when it has one
    line: int | None  # 1-based line inside the cell
    code: str  # short machine-readable kind, e.g. "tamper-attribute"
    severity: str  # BLOCK or WARN
    message: str  # plain English, for the instructor (and, when blocking, the student)
    withhold: tuple = ()  # ((notebook_name, grade_id), ...) whose points are withheld
    action: str = ""  # what the pre-flight did ("quarantined to ...")

    @property
    def blocking(self) -> bool:
        return self.severity == BLOCK

    def where(self) -> str:
        parts = [f"student {self.student!r}", f"{self.assignment}/{self.notebook}" if self.notebook else self.assignment]
        if self.cell is not None:
            parts.append(f"cell {self.cell}" + (f" ({self.grade_id})" if self.grade_id else ""))
        if self.line is not None:
            parts.append(f"line {self.line}")
        return ", ".join(parts)

    def text(self) -> str:
        return f"{self.severity.upper()}: {self.where()}: {self.message}" + (f" [{self.action}]" if self.action else "")

    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d["withhold"] = [list(x) for x in self.withhold]
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "Finding":
        d = dict(d)
        d["withhold"] = tuple(tuple(x) for x in d.get("withhold", ()))
        return cls(**d)


@dataclasses.dataclass
class IntegrityReport:
    """All findings of one pre-flight run of one assignment."""

    assignment: str
    findings: list  # [Finding]
    students: list  # students checked

    def blocking(self, student: str | None = None) -> list:
        return [f for f in self.findings if f.blocking and (student is None or f.student == student)]

    def warnings(self, student: str | None = None) -> list:
        return [f for f in self.findings if not f.blocking and (student is None or f.student == student)]

    def for_student(self, student: str) -> list:
        return [f for f in self.findings if f.student == student]

    def withheld(self, student: str) -> dict:
        """``{notebook_name: {grade_id: [reasons]}}`` for one student."""
        out: dict = {}
        for f in self.blocking(student):
            for nb, gid in f.withhold:
                out.setdefault(nb, {}).setdefault(gid, []).append(f.message)
        return out

    def ungradable(self) -> list:
        """Students nbgrader must not be run for (their folder name cannot be addressed)."""
        return sorted({f.student for f in self.findings if f.code == "student-id-unusable"})

    def to_dict(self) -> dict:
        return {"assignment": self.assignment, "students": self.students,
                "findings": [f.to_dict() for f in self.findings]}

    def text(self) -> str:
        if not self.findings:
            return f"{self.assignment}: no integrity problems in {len(self.students)} submission(s)"
        lines = [f"{self.assignment}: {len(self.blocking())} blocking, {len(self.warnings())} warning(s)"]
        lines += ["  " + f.text() for f in self.findings]
        return "\n".join(lines)


# ---------------------------------------------------------------------------- release structure
@dataclasses.dataclass(frozen=True)
class CellSpec:
    grade_id: str
    index: int
    cell_type: str
    kind: str  # "given" (locked, no points), "test", "answer", "autoanswer", "manual", "task"
    points: float
    source: str

    @property
    def autograded(self) -> bool:
        """Cells whose points the autograder decides (tests and autograded answers)."""
        return self.kind in ("test", "autoanswer")


@dataclasses.dataclass
class NotebookSpec:
    name: str  # file name, e.g. "build_step_1.ipynb"
    cells: list  # [CellSpec] in release order
    kernel_name: str
    language: str
    first_code_index: int | None = None  # index of the first code cell in the release

    @property
    def ids(self) -> list:
        return [c.grade_id for c in self.cells]

    def by_id(self, gid: str) -> CellSpec | None:
        for c in self.cells:
            if c.grade_id == gid:
                return c
        return None

    @property
    def autograded_ids(self) -> list:
        return [c.grade_id for c in self.cells if c.autograded]

def _nbg(cell) -> dict:
    return cell.get("metadata", {}).get("nbgrader", {}) or {}


def _kind(md: dict, cell_type: str) -> str:
    if md.get("task"):
        return "task"
    if md.get("solution") and md.get("grade"):
        return "autoanswer" if cell_type == "code" else "manual"
    if md.get("solution"):
        return "answer"
    if md.get("grade"):
        return "test" if cell_type == "code" else "manual"
    return "given"


def _source(cell) -> str:
    src = cell.get("source", "")
    return "".join(src) if isinstance(src, list) else str(src)


def notebook_spec(path: Path) -> NotebookSpec:
    """The nbgrader structure of a release notebook."""
    nb = nbformat.read(str(path), as_version=4)
    cells = []
    first_code = next((i for i, c in enumerate(nb.cells) if c.cell_type == "code"), None)
    for i, cell in enumerate(nb.cells):
        md = _nbg(cell)
        if md.get("grade_id"):
            cells.append(CellSpec(md["grade_id"], i, cell.cell_type, _kind(md, cell.cell_type),
                                  float(md.get("points", 0) or 0), _source(cell)))
    ks = nb.metadata.get("kernelspec", {}) or {}
    return NotebookSpec(path.name, cells, ks.get("name", ""), ks.get("language", "python"), first_code)


def release_specs(root: Path, assignment: str) -> dict:
    """``{file name: NotebookSpec}`` for ``release/<assignment>/``."""
    folder = Path(root) / "release" / assignment
    if not folder.is_dir():
        raise FileNotFoundError(f"{folder} does not exist: run `nbgrader generate_assignment {assignment}` first")
    return {p.name: notebook_spec(p) for p in sorted(folder.glob("*.ipynb"))}


def _other_assignments(root: Path, assignment: str) -> dict:
    """``{frozenset(grade ids): (assignment, notebook)}`` for every other released notebook with ids."""
    out = {}
    rel = Path(root) / "release"
    if rel.is_dir():
        for adir in sorted(p for p in rel.iterdir() if p.is_dir() and p.name != assignment):
            for p in sorted(adir.glob("*.ipynb")):
                try:
                    ids = frozenset(notebook_spec(p).ids)
                except Exception:  # noqa: BLE001 - a broken release file is not the student's problem
                    continue
                if ids:
                    out[ids] = (adir.name, p.name)
    return out


# ------------------------------------------------------------------------------------ static scan
#: Names of modules whose attributes the tests rely on (by canonical module name prefix).
WATCHED_MODULES = ("numpy", "jax", "builtins", "unittest", "rlhf_lab", "math", "operator", "IPython",
                   "nbgrader", "pytest", "scipy", "sys", "os", "importlib", "types", "inspect", "gc",
                   "functools")
#: Default bindings of a notebook's namespace (before any import is seen).
DEFAULT_ALIASES = {"np": "numpy", "numpy": "numpy", "jnp": "jax.numpy", "jax": "jax", "builtins": "builtins",
                   "unittest": "unittest", "grading": "rlhf_lab.grading", "rlhf_lab": "rlhf_lab", "sys": "sys",
                   "os": "os", "math": "math", "operator": "operator", "__builtins__": "builtins"}
#: Names whose rebinding (other than by importing the expected module) subverts the tests.
PROTECTED_NAMES = {
    "np": "numpy", "numpy": "numpy", "jnp": "jax.numpy", "jax": "jax", "grading": "rlhf_lab.grading",
    "rlhf_lab": "rlhf_lab", "unittest": "unittest",
}
#: Built-ins nobody rebinds by accident and tests rely on: rebinding them blocks.
PROTECTED_BUILTINS = {
    "float", "int", "bool", "abs", "isinstance", "issubclass", "print", "type", "repr", "getattr", "setattr",
    "hasattr", "callable", "object", "super", "exec", "eval", "compile", "__import__", "AssertionError",
    "Exception", "BaseException", "ValueError", "TypeError", "KeyError", "RuntimeError", "NotImplementedError",
    "StopIteration", "SystemExit", "KeyboardInterrupt",
}
#: Built-ins students often shadow innocently (``sum = 0``): a warning only. If a test uses one, the
#: grader's runtime check (:func:`rlhf_lab.grading.tampering_report`) fails that test with a message.
SHADOWABLE_BUILTINS = {
    "len", "range", "sum", "min", "max", "round", "str", "all", "any", "list", "tuple", "dict", "set", "id",
    "hash", "iter", "next", "map", "zip", "sorted", "open", "input", "filter", "format", "vars", "dir",
}
FAKE_DUNDERS = {"__eq__", "__ne__", "__bool__", "__lt__", "__le__", "__gt__", "__ge__", "__len__",
                "__array__", "__array_ufunc__", "__array_function__", "__array_priority__", "__float__",
                "__int__", "__index__", "__abs__", "__sub__", "__rsub__", "__instancecheck__",
                "__subclasscheck__", "__hash__", "__getattr__", "__getattribute__", "__jax_array__"}
#: Calls (by canonical dotted name) that block, with the reason.
BLOCKED_CALLS = {
    "os._exit": "terminates the kernel (os._exit)",
    "os.abort": "terminates the kernel (os.abort)",
    "os.kill": "sends signals to processes (os.kill)",
    "os.killpg": "sends signals to processes (os.killpg)",
    "os.fork": "forks the kernel (os.fork)",
    "os.forkpty": "forks the kernel",
    "os.system": "runs shell commands (os.system)",
    "os.popen": "runs shell commands (os.popen)",
    "sys.exit": "exits the kernel (sys.exit)",
    "builtins.exit": "exits the kernel (exit())",
    "builtins.quit": "exits the kernel (quit())",
    "sys.setprofile": "replaces the profiler the grader uses to detect delegation (sys.setprofile)",
    "sys.settrace": "installs a trace function (sys.settrace)",
    "sys.getprofile": "reads the grader's profiler (sys.getprofile)",
    "sys.gettrace": "reads the trace function (sys.gettrace)",
    "threading.setprofile": "installs a profiler in threads (threading.setprofile)",
    "threading.settrace": "installs a trace function in threads (threading.settrace)",
    "sys._getframe": "inspects the grader's stack frames (sys._getframe)",
    "inspect.currentframe": "inspects the grader's stack frames (inspect.currentframe)",
    "inspect.stack": "inspects the grader's stack frames (inspect.stack)",
    "inspect.getouterframes": "inspects the grader's stack frames",
    "inspect.getsource": "copies source code of other modules (inspect.getsource)",
    "inspect.getsourcelines": "copies source code of other modules",
    "gc.get_referrers": "reaches objects through the garbage collector (gc.get_referrers)",
    "gc.get_referents": "reaches objects through the garbage collector (gc.get_referents)",
    "gc.get_objects": "reaches objects through the garbage collector (gc.get_objects)",
    "importlib.reload": "reloads a module (importlib.reload)",
    "builtins.setattr": None,  # decided by its target (see _check_call)
    "builtins.delattr": None,
    "builtins.globals": None,
    "builtins.vars": None,
    "signal.signal": "changes signal handling, which can defeat the per-cell timeout (signal.signal)",
    "signal.alarm": "schedules signals (signal.alarm)",
    "signal.setitimer": "schedules signals (signal.setitimer)",
    "signal.pthread_kill": "sends signals (signal.pthread_kill)",
    "types.FunctionType": "builds functions from raw code objects (types.FunctionType)",
    "types.CodeType": "builds raw code objects (types.CodeType)",
    "builtins.type": None,  # three-argument type() with fake dunders, see _check_call
}
BLOCKED_IMPORTS = {
    "ctypes": "loads ctypes (raw memory access can rewrite any object the tests use)",
    "_ctypes": "loads ctypes (raw memory access)",
    "cffi": "loads cffi (raw memory access)",
    "subprocess": "runs other programs (subprocess)",
    "multiprocessing": "starts other processes (multiprocessing)",
    "pty": "starts other processes (pty)",
    "signal": "changes signal handling (signal)",
    "nbgrader": "imports nbgrader (grading detection or gradebook access)",
    "sqlite3": "opens databases (the gradebook is an SQLite file)",
    "sqlalchemy": "opens databases (gradebook access)",
    "psycopg2": "opens databases (gradebook access)",
    "marshal": "loads raw code objects (marshal)",
    "gc": None,  # fine unless one of the gc calls above is used
}
WARN_IMPORTS = {
    "threading": "starts threads (a thread can change state while tests run)",
    "_thread": "starts threads",
    "psutil": "inspects processes (possible grading detection)",
    "shutil": "copies/removes files",
    "socket": "opens network connections",
    "requests": "opens network connections",
    "urllib": "opens network connections",
}
WARN_CALLS = {
    "os.getenv": "reads environment variables",
    "os.getcwd": "inspects the working directory (possible grading detection)",
    "os.getppid": "inspects the parent process (possible grading detection)",
    "pathlib.Path.cwd": "inspects the working directory (possible grading detection)",
    "os.remove": "removes files", "os.unlink": "removes files", "os.rename": "renames files",
    "os.replace": "replaces files", "os.chmod": "changes file permissions", "os.rmdir": "removes folders",
}
BLOCKED_ATTRS = {
    "f_back": "walks up the grader's stack frames", "f_locals": "reads the grader's local variables",
    "f_globals": "reads the grader's globals", "tb_frame": "inspects stack frames", "gi_frame": "inspects frames",
    "__code__": "touches raw code objects (__code__)", "__globals__": "reads another function's globals",
    "__closure__": "reads another function's closure", "co_code": "touches raw byte code",
    "__subclasses__": "walks the class hierarchy (sandbox escape)", "__builtins__": "reaches the builtins module",
    "__dict__": None,  # decided by the object it is taken from
}
DETECTION_WORDS = re.compile(r"nbgrader|autograd(e|ed|er|ing)|_rlhf_trusted", re.IGNORECASE)
SENSITIVE_PATH_WORDS = re.compile(r"gradebook|\.db\b|rlhf_lab|helpers/|nbgrader|release/|source/|site-packages|\.\./",
                                  re.IGNORECASE)
SHELL_MAGICS = {"system", "sx", "bash", "sh", "script", "writefile", "run", "load", "load_ext", "env", "set_env",
                "capture", "pip", "conda", "cd", "macro", "store"}
SAFE_MAGICS = {"matplotlib", "time", "timeit", "config", "precision", "who", "whos", "pinfo", "prun", "debug",
               "load_ext autoreload", "autoreload", "xmode", "pdb", "html", "latex", "markdown", "javascript"}


@dataclasses.dataclass(frozen=True)
class ScanHit:
    line: int
    code: str
    severity: str
    message: str


def _strip_magics(source: str) -> tuple[str, list[ScanHit]]:
    """Replace IPython magic and shell lines by ``pass`` (keeping line numbers); judge them on the way."""
    hits: list[ScanHit] = []
    out = []
    lines = source.splitlines()
    cell_magic = None
    for n, line in enumerate(lines, start=1):
        stripped = line.strip()
        indent = line[: len(line) - len(line.lstrip())]
        if n == 1 and stripped.startswith("%%"):
            cell_magic = stripped[2:].split()[0] if len(stripped) > 2 else ""
            if cell_magic not in ("time", "timeit", "capture", "html", "markdown", "latex", "javascript"):
                hits.append(ScanHit(n, "magic-cell", BLOCK,
                                    f"runs the cell as '%%{cell_magic}' (shell or other code the scan cannot check)"))
            out.append("pass")
            continue
        if stripped.startswith(("!", "%")) or re.match(r"^[\w.]+\s*=\s*[!%]", stripped):
            body = stripped.split("=", 1)[1].strip() if not stripped.startswith(("!", "%")) else stripped
            if body.startswith("!"):
                hits.append(ScanHit(n, "shell", BLOCK, "runs a shell command (!...)"))
            else:
                name = body.lstrip("%").split()[0] if body.lstrip("%") else ""
                if name in SHELL_MAGICS:
                    sev = BLOCK if name in ("system", "sx", "bash", "sh", "script", "writefile", "run", "load",
                                            "load_ext", "env", "set_env") else WARN
                    hits.append(ScanHit(n, "magic", sev, f"uses the %{name} magic"))
                if DETECTION_WORDS.search(body):
                    hits.append(ScanHit(n, "grading-detection", BLOCK,
                                        "mentions the grader (nbgrader/autograde) in a magic"))
            out.append(indent + "pass")
            continue
        if stripped.endswith("?") and not stripped.startswith("#") and re.match(r"^[\w.]+\?{1,2}$", stripped):
            out.append(indent + "pass")
            continue
        out.append(line)
    return "\n".join(out), hits


def _dotted(node) -> list[str] | None:
    """``a.b.c`` -> ["a", "b", "c"]; calls like ``get_ipython().x`` -> ["get_ipython()", "x"]."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        parts.append(node.id)
    elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
        parts.append(node.func.id + "()")
    else:
        return None
    return parts[::-1]


def _const_return(fn) -> object:
    """The constant a function always returns, or a sentinel if it does not obviously do so."""
    body = fn.body if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)) else None
    if isinstance(fn, ast.Lambda):
        return fn.body.value if isinstance(fn.body, ast.Constant) else _NOT_CONST
    if body is None:
        return _NOT_CONST
    stmts = [s for s in body if not (isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant))]
    returns = [s for s in ast.walk(fn) if isinstance(s, ast.Return)]
    if returns and all(isinstance(r.value, ast.Constant) for r in returns):
        values = {repr(r.value.value) for r in returns}
        if len(values) == 1:
            return returns[0].value.value
    if len(stmts) == 1 and isinstance(stmts[0], ast.Return) and isinstance(stmts[0].value, ast.Constant):
        return stmts[0].value.value
    return _NOT_CONST


_NOT_CONST = object()
_BUILTIN_NAMES = set(dir(__import__("builtins"))) | {"exit", "quit", "get_ipython", "display"}


class _Scanner(ast.NodeVisitor):
    """Walk one cell's AST and collect :class:`ScanHit` s (see the module docstring for the rules)."""

    def __init__(self, aliases: dict, depth: int = 0):
        self.aliases = aliases  # local name -> canonical dotted module/object name
        self.hits: list[ScanHit] = []
        self.depth = depth

    # -- helpers ---------------------------------------------------------------------------
    def hit(self, node, code: str, severity: str, message: str) -> None:
        self.hits.append(ScanHit(getattr(node, "lineno", 1), code, severity, message))

    def canonical(self, node) -> str | None:
        parts = _dotted(node)
        if not parts:
            return None
        head = parts[0]
        if head in self.aliases:
            return ".".join([self.aliases[head]] + parts[1:])
        if head in ("get_ipython()", "get_ipython"):
            return ".".join(["get_ipython()"] + parts[1:])
        if head in _BUILTIN_NAMES:
            return ".".join(["builtins." + head] + parts[1:])
        return None

    @staticmethod
    def watched(name: str | None) -> bool:
        return bool(name) and name.split(".")[0] in WATCHED_MODULES

    # -- imports -------------------------------------------------------------------------------
    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            top = alias.name.split(".")[0]
            self._judge_import(node, alias.name)
            bound = alias.asname or top
            target = alias.name if alias.asname else top
            self._bind_import(node, bound, target)

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        module = node.module or ""
        judged = self._judge_import(node, module) if module != "rlhf_lab" else False
        for alias in node.names:
            full = f"{module}.{alias.name}" if module else alias.name
            if not judged or full == "rlhf_lab.grading":
                self._judge_import(node, full)
            if alias.name == "*":
                if module.split(".")[0] in ("numpy", "jax", "rlhf_lab", "builtins", "unittest"):
                    self.hit(node, "star-import", WARN, f"'from {module} import *' may shadow names the tests use")
                continue
            self._bind_import(node, alias.asname or alias.name, full)

    def _judge_import(self, node, name: str) -> bool:
        """Record a hit if importing ``name`` is suspicious; True if something was recorded."""
        top = name.split(".")[0]
        for key, why in BLOCKED_IMPORTS.items():
            if (name == key or name.startswith(key + ".") or top == key) and why:
                self.hit(node, "blocked-import", BLOCK, why)
                return True
        for key, why in WARN_IMPORTS.items():
            if name == key or top == key:
                self.hit(node, "import-warning", WARN, why)
                return True
        if name == "rlhf_lab.grading" or name.startswith("rlhf_lab.grading."):
            self.hit(node, "grader-access", BLOCK, "imports the grader (rlhf_lab.grading) in a student cell")
            return True
        if top == "rlhf_lab" and name != "rlhf_lab":
            self.hit(node, "library-use", WARN,
                     f"imports {name} from the course library in a student cell; hidden tests refuse tasks "
                     "delegated to it")
            return True
        if name == "rlhf_lab":
            self.hit(node, "library-use", WARN, "imports the course library in a student cell; hidden tests refuse "
                                                "tasks delegated to it")
            return False
        return False

    def _bind_import(self, node, bound: str, target: str) -> None:
        expected = PROTECTED_NAMES.get(bound)
        if expected is not None and target != expected and not (bound == "grading" and target == "rlhf_lab.grading"):
            self.hit(node, "rebind-name", BLOCK, f"binds the name '{bound}' to {target} instead of {expected}")
        if bound in PROTECTED_BUILTINS:
            self.hit(node, "rebind-builtin", BLOCK, f"shadows the built-in '{bound}' with an import of {target}")
        self.aliases[bound] = target

    # -- bindings ----------------------------------------------------------------------------
    def _target(self, target, node, verb: str) -> None:
        if isinstance(target, (ast.Tuple, ast.List)):
            for elt in target.elts:
                self._target(elt, node, verb)
            return
        if isinstance(target, ast.Starred):
            self._target(target.value, node, verb)
            return
        if isinstance(target, ast.Name):
            name = target.id
            if name in PROTECTED_NAMES:
                self.hit(node, "rebind-name", BLOCK,
                         f"{verb} the name '{name}' that the tests use for {PROTECTED_NAMES[name]}")
            elif name in PROTECTED_BUILTINS:
                self.hit(node, "rebind-builtin", BLOCK, f"{verb} the built-in '{name}'")
            elif name in SHADOWABLE_BUILTINS:
                self.hit(node, "shadow-builtin", WARN,
                         f"{verb} the built-in '{name}' (a test that uses it fails with a tampering message)")
            self.aliases.pop(name, None)
            return
        if isinstance(target, ast.Attribute):
            owner = self.canonical(target.value)
            if target.attr in FAKE_DUNDERS:
                self.hit(node, "fake-dunder", BLOCK,
                         f"{verb} the special method {target.attr} of an object (a fake comparison)")
            elif owner and (self.watched(owner) or owner.startswith("get_ipython()")):
                self.hit(node, "tamper-attribute", BLOCK,
                         f"{verb} {owner}.{target.attr} (an attribute of a module the tests rely on)")
            elif target.attr in BLOCKED_ATTRS and BLOCKED_ATTRS[target.attr]:
                self.hit(node, "tamper-internals", BLOCK, f"{verb} {target.attr}: {BLOCKED_ATTRS[target.attr]}")
            return
        if isinstance(target, ast.Subscript):
            owner = self.canonical(target.value)
            base = target.value
            if owner and (self.watched(owner) or owner.endswith("__dict__")):
                self.hit(node, "tamper-attribute", BLOCK, f"{verb} an entry of {owner}")
            elif isinstance(base, ast.Call) and isinstance(base.func, ast.Name) and base.func.id in ("globals", "vars", "locals"):
                self.hit(node, "tamper-namespace", BLOCK, f"{verb} an entry of {base.func.id}() (rebinding names indirectly)")
            elif isinstance(base, ast.Attribute) and base.attr == "__dict__":
                self.hit(node, "tamper-namespace", BLOCK, f"{verb} an entry of an object's __dict__")

    def visit_Assign(self, node: ast.Assign) -> None:
        for t in node.targets:
            self._target(t, node, "reassigns")
        self.generic_visit(node)

    def visit_AugAssign(self, node: ast.AugAssign) -> None:
        self._target(node.target, node, "modifies")
        self.generic_visit(node)

    def visit_AnnAssign(self, node: ast.AnnAssign) -> None:
        if node.value is not None:
            self._target(node.target, node, "reassigns")
        self.generic_visit(node)

    def visit_Delete(self, node: ast.Delete) -> None:
        for t in node.targets:
            self._target(t, node, "deletes")
        self.generic_visit(node)

    def visit_For(self, node: ast.For) -> None:
        self._target(node.target, node, "rebinds (loop variable)")
        self.generic_visit(node)

    def visit_With(self, node: ast.With) -> None:
        for item in node.items:
            if item.optional_vars is not None:
                self._target(item.optional_vars, node, "rebinds (with ... as)")
        self.generic_visit(node)

    def visit_NamedExpr(self, node: ast.NamedExpr) -> None:
        self._target(node.target, node, "reassigns (:=)")
        self.generic_visit(node)

    def visit_FunctionDef(self, node) -> None:
        if node.name in PROTECTED_NAMES or node.name in PROTECTED_BUILTINS:
            self._target(ast.Name(id=node.name), node, "redefines")
        for deco in node.decorator_list:
            self.visit(deco)
        self.generic_visit(node)

    visit_AsyncFunctionDef = visit_FunctionDef

    def visit_ClassDef(self, node: ast.ClassDef) -> None:
        if node.name in PROTECTED_NAMES or node.name in PROTECTED_BUILTINS:
            self._target(ast.Name(id=node.name), node, "redefines")
        for stmt in node.body:
            name, fn = None, None
            if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef)):
                name, fn = stmt.name, stmt
            elif isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Name):
                name, fn = stmt.targets[0].id, stmt.value
            if name in FAKE_DUNDERS:
                value = _const_return(fn) if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)) else _NOT_CONST
                if value is not _NOT_CONST:
                    self.hit(stmt, "fake-dunder", BLOCK,
                             f"class {node.name} defines {name} that always returns {value!r} "
                             "(an answer that compares equal to anything)")
                else:
                    self.hit(stmt, "custom-dunder", WARN, f"class {node.name} defines {name}")
        self.generic_visit(node)

    # -- uses ----------------------------------------------------------------------------------
    def visit_Call(self, node: ast.Call) -> None:
        name = self.canonical(node.func)
        if name:
            self._check_call(node, name)
        elif isinstance(node.func, ast.Attribute) and node.func.attr in ("setprofile", "settrace", "_getframe"):
            self.hit(node, "tamper-profiler", BLOCK, f"calls {node.func.attr} (profiler/trace/frame access)")
        self.generic_visit(node)

    def _check_call(self, node: ast.Call, name: str) -> None:
        short = name
        if short in BLOCKED_CALLS and BLOCKED_CALLS[short]:
            self.hit(node, "blocked-call", BLOCK, BLOCKED_CALLS[short])
            return
        if short in ("builtins.setattr", "builtins.delattr") and node.args:
            owner = self.canonical(node.args[0])
            attr = node.args[1].value if len(node.args) > 1 and isinstance(node.args[1], ast.Constant) else None
            if attr in FAKE_DUNDERS:
                self.hit(node, "fake-dunder", BLOCK, f"sets the special method {attr} with {short.split('.')[1]}()")
            elif owner and self.watched(owner):
                self.hit(node, "tamper-attribute", BLOCK,
                         f"changes {owner}{'.' + attr if attr else ''} with {short.split('.')[1]}()")
            elif attr is None:
                self.hit(node, "dynamic-setattr", WARN, f"{short.split('.')[1]}() with a computed attribute name")
            return
        if short in ("builtins.globals", "builtins.vars", "builtins.locals"):
            if short == "builtins.vars" and node.args and self.watched(self.canonical(node.args[0])):
                self.hit(node, "tamper-namespace", BLOCK, f"takes vars() of {self.canonical(node.args[0])}")
            return
        if short == "builtins.type" and len(node.args) == 3 and isinstance(node.args[2], ast.Dict):
            keys = {k.value for k in node.args[2].keys if isinstance(k, ast.Constant)}
            fake = sorted(keys & FAKE_DUNDERS)
            if fake:
                self.hit(node, "fake-dunder", BLOCK, f"builds a class with {', '.join(fake)} via type()")
            return
        if short in ("builtins.exec", "builtins.eval", "builtins.compile"):
            arg = node.args[0] if node.args else None
            if isinstance(arg, ast.Constant) and isinstance(arg.value, str) and self.depth < 3:
                inner = scan_code(arg.value, dict(self.aliases), depth=self.depth + 1)
                for h in inner:
                    self.hits.append(ScanHit(node.lineno, h.code, h.severity, h.message + f" (inside {short[9:]}())"))
            else:
                self.hit(node, "dynamic-code", BLOCK,
                         f"runs code built at run time with {short[9:]}(), which the integrity scan cannot check")
            return
        if short in ("builtins.__import__", "importlib.import_module"):
            arg = node.args[0] if node.args else None
            if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
                self._judge_import(node, arg.value)
            else:
                self.hit(node, "dynamic-import", BLOCK, "imports a module whose name is computed at run time")
            return
        if short == "builtins.open" or short.endswith((".write_text", ".write_bytes", ".unlink", ".rename",
                                                         ".replace", ".rmdir", ".chmod", ".touch")):
            self._check_file_call(node, short)
            return
        if short.startswith("get_ipython()") or short == "builtins.get_ipython":
            self.hit(node, "ipython-internals", BLOCK,
                     "uses get_ipython() (can hook into cell execution, change the namespace or run hidden code)")
            return
        if short.startswith(("subprocess.", "multiprocessing.", "pty.", "ctypes.", "os.exec", "os.spawn",
                             "os.posix_spawn")):
            self.hit(node, "blocked-call", BLOCK, f"calls {short} (other processes or raw memory)")
            return
        if short in WARN_CALLS:
            self.hit(node, "call-warning", WARN, WARN_CALLS[short])
            return
        if short.startswith("shutil."):
            self.hit(node, "file-write", WARN, f"calls {short} (copies/removes files)")

    def _check_file_call(self, node: ast.Call, name: str) -> None:
        mode = None
        if name == "builtins.open":
            if len(node.args) > 1 and isinstance(node.args[1], ast.Constant):
                mode = node.args[1].value
            for kw in node.keywords:
                if kw.arg == "mode" and isinstance(kw.value, ast.Constant):
                    mode = kw.value.value
            writes = mode is not None and any(ch in str(mode) for ch in "wax+")
        else:
            writes = True
        texts = [n.value for n in ast.walk(node) if isinstance(n, ast.Constant) and isinstance(n.value, str)]
        sensitive = [t for t in texts if SENSITIVE_PATH_WORDS.search(t)]
        if sensitive:
            self.hit(node, "file-tamper", BLOCK if writes else WARN,
                     f"{'writes' if writes else 'reads'} {sensitive[0]!r} (course, grader or gradebook files)")
        elif writes:
            self.hit(node, "file-write", WARN, "writes or changes files")

    def visit_Attribute(self, node: ast.Attribute) -> None:
        why = BLOCKED_ATTRS.get(node.attr)
        if why:
            self.hit(node, "tamper-internals", BLOCK, f"uses .{node.attr}: {why}")
        elif node.attr == "__dict__":
            owner = self.canonical(node.value)
            if owner and self.watched(owner):
                self.hit(node, "tamper-namespace", BLOCK, f"takes {owner}.__dict__")
        name = self.canonical(node)
        if name and name.startswith("rlhf_lab.grading.") and isinstance(node.ctx, ast.Load):
            self.hit(node, "grader-access", BLOCK,
                     f"uses the grader ({name.replace('rlhf_lab.', '')}) in a student cell")
        elif name and name.startswith("sys.modules") and isinstance(node.ctx, ast.Load):
            self.hit(node, "sys-modules", BLOCK, "touches sys.modules (can swap the modules the tests import)")
        elif name and name.startswith(("sys.meta_path", "sys.path_hooks", "sys.path_importer_cache")):
            self.hit(node, "import-hooks", BLOCK, f"touches {name} (import machinery)")
        elif name in ("os.environ",):
            self.hit(node, "env-read", WARN, "reads environment variables")
        self.generic_visit(node)

    def visit_Name(self, node: ast.Name) -> None:
        if node.id == "__builtins__":
            self.hit(node, "tamper-internals", BLOCK, "uses __builtins__ directly")
        elif node.id == "get_ipython" and isinstance(node.ctx, ast.Load):
            self.hit(node, "ipython-internals", BLOCK,
                     "uses get_ipython() (can hook into cell execution, change the namespace or run hidden code)")

    def visit_Expr(self, node: ast.Expr) -> None:
        if isinstance(node.value, ast.Constant):
            return  # a docstring or bare string cannot change behaviour
        self.generic_visit(node)

    def visit_Constant(self, node: ast.Constant) -> None:
        if isinstance(node.value, str) and DETECTION_WORDS.search(node.value):
            self.hit(node, "grading-detection", BLOCK,
                     f"mentions the grader ({DETECTION_WORDS.search(node.value).group(0)!r}): code that behaves "
                     "differently when it is graded")

    def visit_Raise(self, node: ast.Raise) -> None:
        exc = node.exc.func if isinstance(node.exc, ast.Call) else node.exc
        if isinstance(exc, ast.Name) and exc.id in ("SystemExit", "KeyboardInterrupt"):
            self.hit(node, "blocked-call", BLOCK, f"raises {exc.id} (stops the kernel's execution)")
        self.generic_visit(node)


def scan_code(source: str, aliases: dict | None = None, depth: int = 0) -> list[ScanHit]:
    """Statically scan one cell's source; ``aliases`` (name -> module) is updated with its imports."""
    aliases = dict(DEFAULT_ALIASES) if aliases is None else aliases
    code, hits = _strip_magics(source)
    try:
        tree = ast.parse(code)
    except SyntaxError as exc:
        return hits + [ScanHit(exc.lineno or 1, "syntax-error", WARN,
                               f"the cell has a syntax error ({exc.msg}); it will fail when run")]
    scanner = _Scanner(aliases, depth)
    scanner.visit(tree)
    seen, out = set(), []
    for h in sorted(hits + scanner.hits, key=lambda h: (h.line, h.severity != BLOCK)):
        key = (h.line, h.code, h.message)
        if key not in seen:
            seen.add(key)
            out.append(h)
    return out


def _given_aliases(cells) -> dict:
    """Module aliases bound by the notebook's locked cells (they are restored, so they are trusted)."""
    aliases = dict(DEFAULT_ALIASES)
    for cell in cells:
        if cell.get("cell_type") != "code":
            continue
        code, _ = _strip_magics(_source(cell))
        try:
            tree = ast.parse(code)
        except SyntaxError:
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                for a in node.names:
                    aliases[a.asname or a.name.split(".")[0]] = a.name if a.asname else a.name.split(".")[0]
            elif isinstance(node, ast.ImportFrom) and node.module:
                for a in node.names:
                    if a.name != "*":
                        aliases[a.asname or a.name] = f"{node.module}.{a.name}"
    return aliases


# ------------------------------------------------------------------------------ notebook checks
def _shadowable_names() -> set:
    """Top-level module names an extra file beside the notebook could shadow."""
    names = set(sys.stdlib_module_names) | set(sys.builtin_module_names)
    names |= {"numpy", "jax", "jaxlib", "rlhf_lab", "grading", "IPython", "ipykernel", "matplotlib", "scipy",
              "nbgrader", "pytest", "sitecustomize", "usercustomize", "nbformat", "traitlets", "zmq",
              "ml_dtypes", "opt_einsum", "ipywidgets", "comm", "jupyter_client", "pandas", "torch"}
    try:
        from importlib.metadata import packages_distributions

        names |= set(packages_distributions())
    except Exception:  # noqa: BLE001
        pass
    return names


class _Checker:
    """Checks one student's assignment folder against the release."""

    def __init__(self, root: Path, assignment: str, specs: dict, others: dict, quarantine: bool):
        self.root = root
        self.assignment = assignment
        self.specs = specs
        self.others = others
        self.quarantine = quarantine
        self.shadowable = _shadowable_names()

    def all_autograded(self) -> tuple:
        return tuple((nb, gid) for nb, spec in self.specs.items() for gid in spec.autograded_ids)

    def check_student(self, student: str, folder: Path) -> list[Finding]:
        out: list[Finding] = []
        F = lambda **kw: Finding(student=student, assignment=self.assignment, **kw)  # noqa: E731
        # -- the student's folder name
        if any(ch in student for ch in "*?[]") or student.startswith(".") or "/" in student or "\\" in student:
            out.append(F(notebook=None, cell=None, grade_id=None, line=None, code="student-id-unusable",
                         severity=BLOCK, withhold=self.all_autograded(),
                         message=f"the folder name {student!r} contains characters nbgrader treats as a "
                                 "pattern (* ? [ ]) or a path; rename the folder and grade again"))
            return out
        if student != unicodedata.normalize("NFC", student):
            out.append(F(notebook=None, cell=None, grade_id=None, line=None, code="student-id-unicode",
                         severity=WARN, message="the folder name is not in Unicode NFC form (often a macOS zip); "
                                                "the same student may appear twice in the gradebook"))
        if not student.isascii() or any(ch.isspace() for ch in student):
            out.append(F(notebook=None, cell=None, grade_id=None, line=None, code="student-id-characters",
                         severity=WARN, message="the folder name has spaces or non-ASCII characters; it is "
                                                "graded normally, check that it matches the roster"))
        present = {}
        extras = []
        for path in sorted(folder.rglob("*")):
            rel = path.relative_to(folder)
            if any(part in (".ipynb_checkpoints", "__pycache__") for part in rel.parts):
                continue
            if path.is_symlink():
                out.append(self._quarantine(F(notebook=str(rel), cell=None, grade_id=None, line=None,
                                              code="symlink", severity=BLOCK, withhold=self.all_autograded(),
                                              message=f"{rel} is a symbolic link (it could expose or overwrite "
                                                      "files outside the submission); points withheld for review"),
                                            student, path))
                continue
            if path.is_dir():
                if len(rel.parts) == 1 and rel.name in self.shadowable and (path / "__init__.py").exists():
                    out.append(self._quarantine(F(
                        notebook=str(rel), cell=None, grade_id=None, line=None, code="shadow-module",
                        severity=BLOCK, withhold=self.all_autograded(),
                        message=f"the folder {rel}/ would be imported instead of the real '{rel.name}' module "
                                "while grading; it was quarantined and all points withheld for review"),
                        student, path))
                continue
            if len(rel.parts) == 1 and path.suffix == ".ipynb":
                present[path.name] = path
            elif len(rel.parts) == 1 and path.name in NBGRADER_EXCHANGE_FILES and path.stat().st_size <= 4096:
                continue  # written by `nbgrader submit` into every exchange submission: not the student's
            else:
                extras.append((rel, path))
        for rel, path in extras:
            if len(rel.parts) == 1 and path.suffix in (".py", ".pyc", ".so", ".pth") and \
                    path.stem.split(".")[0] in self.shadowable | {"sitecustomize", "usercustomize"}:
                out.append(self._quarantine(F(
                    notebook=str(rel), cell=None, grade_id=None, line=None, code="shadow-module", severity=BLOCK,
                    withhold=self.all_autograded(),
                    message=f"the extra file {rel} would be imported instead of the real "
                            f"'{path.stem.split('.')[0]}' module while grading; it was quarantined and all points "
                            "withheld for review"), student, path))
            elif path.suffix == ".pth" or len(rel.parts) > 1 and rel.parts[0] in self.shadowable:
                out.append(self._quarantine(F(
                    notebook=str(rel), cell=None, grade_id=None, line=None, code="shadow-module", severity=BLOCK,
                    withhold=self.all_autograded(),
                    message=f"the extra file {rel} could change what the notebook imports; quarantined, points "
                            "withheld for review"), student, path))
            else:
                out.append(F(notebook=str(rel), cell=None, grade_id=None, line=None, code="extra-file",
                             severity=WARN, message=f"extra file {rel} ({path.stat().st_size} bytes) is not part "
                                                    "of the assignment; nbgrader copies it beside the notebooks"))
        # -- notebooks
        parsed = {}
        for name, path in sorted(present.items()):
            nb, problem = _read(path)
            if problem:
                spec = self.specs.get(name)
                wh = tuple((name, g) for g in spec.autograded_ids) if spec else ()
                out.append(self._quarantine(F(
                    notebook=name, cell=None, grade_id=None, line=None, code="invalid-notebook", severity=BLOCK,
                    withhold=wh, message=f"{name} is not a valid notebook ({problem}); it cannot be run or graded, "
                                         "so it scores 0; the student's other notebooks are graded"),
                    student, path))
                continue
            parsed[name] = nb
        expected = set(self.specs)
        missing = sorted(expected - set(parsed) - {f.notebook for f in out if f.code == "invalid-notebook"})
        unknown = sorted(set(parsed) - expected)
        renamed_to = {}
        for name in unknown:
            ids = {_nbg(c).get("grade_id") for c in parsed[name].cells if _nbg(c).get("grade_id")}
            match = max(missing, key=lambda m: len(ids & set(self.specs[m].ids)), default=None)
            if match and len(ids & set(self.specs[match].ids)) >= max(1, len(self.specs[match].ids) // 2):
                renamed_to[match] = name
                out.append(F(notebook=name, cell=None, grade_id=None, line=None, code="renamed-notebook",
                             severity=BLOCK, withhold=tuple((match, g) for g in self.specs[match].autograded_ids),
                             message=f"{name} looks like {match} under another name; nbgrader grades only "
                                     f"{match}, which is missing, so it scores 0 (rename the file to {match} and "
                                     "grade again if the instructor accepts it)"))
            else:
                other = self._other_assignment(ids)
                what = f" (it belongs to the assignment {other[0]})" if other else ""
                out.append(F(notebook=name, cell=None, grade_id=None, line=None, code="unknown-notebook",
                             severity=WARN, message=f"{name} is not a notebook of {self.assignment}{what}; "
                                                    "nbgrader ignores it"))
        for name in missing:
            if name in renamed_to:
                continue
            out.append(F(notebook=name, cell=None, grade_id=None, line=None, code="missing-notebook",
                         severity=BLOCK, withhold=tuple((name, g) for g in self.specs[name].autograded_ids),
                         message=f"{name} was not submitted; it scores 0"))
        for name in sorted(set(parsed) & expected):
            path = present[name]
            nb_findings = self.check_notebook(student, name, parsed[name])
            if any(f.code == "other-assignment" for f in nb_findings):
                nb_findings = [self._quarantine(f, student, path) if f.code == "other-assignment" else f
                               for f in nb_findings]
            out.extend(nb_findings)
        return out

    def _other_assignment(self, ids: set):
        best, score = None, 0
        for other_ids, where in self.others.items():
            overlap = len(ids & other_ids)
            if overlap > score:
                best, score = where, overlap
        return best if score else None

    def _quarantine(self, finding: Finding, student: str, path: Path) -> Finding:
        if not self.quarantine:
            return finding
        dest_dir = self.root / QUARANTINE / student / self.assignment
        dest_dir.mkdir(parents=True, exist_ok=True)
        dest = dest_dir / path.name
        if dest.exists() or dest.is_symlink():
            shutil.rmtree(dest) if dest.is_dir() and not dest.is_symlink() else dest.unlink()
        shutil.move(str(path), str(dest))
        finding = dataclasses.replace(finding, action=f"moved to {dest.relative_to(self.root)}")
        (dest_dir / (path.name + ".finding.json")).write_text(json.dumps(finding.to_dict(), indent=1) + "\n")
        return finding

    # -- one notebook -------------------------------------------------------------------------
    def check_notebook(self, student: str, name: str, nb) -> list[Finding]:
        """Every finding of one submitted notebook, under the judged policy (:func:`judged_policy`)."""
        return judged_policy(self._check_notebook(student, name, nb))

    def _check_notebook(self, student: str, name: str, nb) -> list[Finding]:
        spec: NotebookSpec = self.specs[name]
        out: list[Finding] = []

        def F(**kw):
            return Finding(student=student, assignment=self.assignment, notebook=name, **kw)

        everything = tuple((name, g) for g in spec.autograded_ids)
        sub_ids = [(i, _nbg(c).get("grade_id")) for i, c in enumerate(nb.cells) if _nbg(c).get("grade_id")]
        ids_only = [g for _, g in sub_ids]
        spec_ids = set(spec.ids)
        # the whole notebook from another assignment under an expected name
        if sub_ids and not (set(ids_only) & spec_ids):
            other = self._other_assignment(set(ids_only))
            what = f"the assignment {other[0]} ({other[1]})" if other else "a different notebook"
            out.append(F(cell=None, grade_id=None, line=None, code="other-assignment", severity=BLOCK,
                         withhold=everything,
                         message=f"{name} contains {what}, not {self.assignment}/{name}; it was not run and "
                                 "scores 0"))
            return out
        # kernel
        ks = nb.metadata.get("kernelspec", {}) or {}
        if ks.get("name") != spec.kernel_name:
            out.append(F(cell=None, grade_id=None, line=None, code="kernel-name", severity=WARN,
                         message=f"the notebook asks for the kernel {ks.get('name')!r}, not {spec.kernel_name!r}; "
                                 "nbgrader grades it with the release's kernel"))
        elif (ks.get("language") or "python") != (spec.language or "python"):
            out.append(F(cell=None, grade_id=None, line=None, code="kernel-language", severity=WARN,
                         message=f"the notebook's kernel language is {ks.get('language')!r}; nbgrader grades it "
                                 "with the release's kernel"))
        # positions of each test in the submission (last duplicate wins, as in nbgrader)
        position = {}
        for i, gid in sub_ids:
            position[gid] = i

        def after(index: int) -> tuple:
            return tuple((name, g) for g in spec.autograded_ids if g in position and position[g] > index)

        # duplicates (a copied answer cell is an everyday accident; a copied locked cell is not)
        seen = {}
        for i, gid in sub_ids:
            if gid in seen:
                cspec = spec.by_id(gid)
                if cspec is not None and cspec.kind in ("answer", "manual"):
                    out.append(F(cell=i, grade_id=gid, line=None, code="duplicate-answer", severity=WARN,
                                 message=f"the answer cell {gid!r} appears more than once (first as cell "
                                         f"{seen[gid]}); nbgrader grades the last copy"))
                else:
                    wh = after(seen[gid]) + (((name, gid),) if cspec is not None and cspec.autograded else ())
                    out.append(F(cell=i, grade_id=gid, line=None, code="duplicate-cell", severity=BLOCK,
                                 withhold=tuple(dict.fromkeys(wh)),
                                 message=f"the locked cell {gid!r} appears more than once (first as cell "
                                         f"{seen[gid]}); nbgrader keeps only the last copy, so the tests after "
                                         "the first copy are withheld for review"))
            else:
                seen[gid] = i
        # missing cells
        for cspec in spec.cells:
            if cspec.grade_id in position:
                continue
            if cspec.kind == "test" or cspec.kind == "autoanswer":
                out.append(F(cell=None, grade_id=cspec.grade_id, line=None, code="deleted-test", severity=BLOCK,
                             withhold=((name, cspec.grade_id),),
                             message=f"the test cell {cspec.grade_id!r} was deleted; nbgrader does not run a "
                                     "deleted test, so it scores 0"))
            elif cspec.kind == "given":
                later = tuple((name, c.grade_id) for c in spec.cells if c.autograded and c.index > cspec.index)
                out.append(F(cell=None, grade_id=cspec.grade_id, line=None, code="deleted-given", severity=BLOCK,
                             withhold=later,
                             message=f"the read-only cell {cspec.grade_id!r} was deleted; the tests after it ran "
                                     "without it and are withheld for review"))
            else:
                out.append(F(cell=None, grade_id=cspec.grade_id, line=None, code="deleted-answer", severity=WARN,
                             message=f"the answer cell {cspec.grade_id!r} was deleted"))
        # order (the copies nbgrader keeps, i.e. the last ones, must follow the release order)
        order = sorted((g for g in position if g in spec_ids), key=position.get)
        expected_order = [g for g in spec.ids if g in set(order)]
        if order != expected_order:
            first_bad = next(i for i, (a, b) in enumerate(zip(order, expected_order)) if a != b)
            out.append(F(cell=position.get(order[first_bad]), grade_id=order[first_bad], line=None, code="reordered",
                         severity=BLOCK, withhold=everything,
                         message=f"the notebook's cells were reordered ({order[first_bad]!r} is where "
                                 f"{expected_order[first_bad]!r} should be); tests may have run before the code they "
                                 "check or after code meant to run later, so the notebook is withheld for review"))
        # code before the locked first code cell (the grading snapshot)
        start_spec = _start_spec(spec)
        if start_spec is not None and start_spec.grade_id in position:
            start_at = seen[start_spec.grade_id]
            early = [i for i, c in enumerate(nb.cells[:start_at]) if c.cell_type == "code" and _source(c).strip()]
            if early:
                out.append(F(cell=early[0], grade_id=_nbg(nb.cells[early[0]]).get("grade_id"), line=None,
                             code="code-before-start", severity=BLOCK, withhold=everything,
                             message=f"code runs before the locked first cell {start_spec.grade_id!r} (which starts "
                                     "the tamper-proof grader), so every test of the notebook is withheld for "
                                     "review"))
        # locked cells edited
        for i, c in enumerate(nb.cells):
            gid = _nbg(c).get("grade_id")
            cspec = spec.by_id(gid) if gid else None
            if cspec is None:
                if gid:
                    out.append(F(cell=i, grade_id=gid, line=None, code="unknown-cell", severity=WARN,
                                 message=f"the cell id {gid!r} is not part of {name}; nbgrader treats it as "
                                         "an ordinary cell"))
                continue
            if c.cell_type != cspec.cell_type:
                out.append(F(cell=i, grade_id=gid, line=None, code="cell-type", severity=WARN,
                             message=f"the cell {gid!r} was changed from {cspec.cell_type} to {c.cell_type}; "
                                     "nbgrader changes it back"))
            md = _nbg(c)
            if cspec.kind in ("test", "given") and _norm(_source(c)) != _norm(cspec.source):
                if cspec.kind == "test":
                    out.append(F(cell=i, grade_id=gid, line=None, code="edited-test", severity=BLOCK,
                                 withhold=((name, gid),),
                                 message=f"the locked test cell {gid!r} was edited; nbgrader ran the original test "
                                         "but its points are withheld for review"))
                elif start_spec is not None and gid == start_spec.grade_id:
                    out.append(F(cell=i, grade_id=gid, line=None, code="edited-start", severity=BLOCK,
                                 withhold=everything,
                                 message=f"the locked first cell {gid!r} (which starts the tamper-proof grader) was "
                                         "edited; nbgrader restored it, but the notebook is withheld for review"))
                else:
                    out.append(F(cell=i, grade_id=gid, line=None, code="edited-given", severity=WARN,
                                 message=f"the read-only cell {gid!r} was edited; nbgrader restores the original"))
            if cspec.points and float(md.get("points", cspec.points) or 0) != cspec.points:
                out.append(F(cell=i, grade_id=gid, line=None, code="points-changed", severity=WARN,
                             message=f"the points of {gid!r} were changed to {md.get('points')}; nbgrader uses "
                                     f"{cspec.points:g}"))
            locked_md = bool(md.get("locked")) if not md.get("solution") else False
            spec_locked = cspec.kind in ("given", "test")
            if spec_locked and not locked_md and _norm(_source(c)) == _norm(cspec.source):
                out.append(F(cell=i, grade_id=gid, line=None, code="unlocked", severity=WARN,
                             message=f"the cell {gid!r} was unlocked in its metadata; nbgrader locks it again"))
        # static scan of every cell the student can change
        locked_ids = {c.grade_id for c in spec.cells if c.kind in ("given", "test")}
        aliases = _given_aliases([c for c in nb.cells if _nbg(c).get("grade_id") in locked_ids])
        for i, c in enumerate(nb.cells):
            if c.cell_type != "code":
                continue
            gid = _nbg(c).get("grade_id")
            if gid in locked_ids and spec.by_id(gid) is not None:
                continue  # restored from the release by nbgrader before it runs
            for h in scan_code(_source(c), aliases):
                out.append(F(cell=i, grade_id=gid, line=h.line, code=h.code, severity=h.severity,
                             withhold=after(i) if h.severity == BLOCK else (), message=h.message))
        return out


def _start_spec(spec: NotebookSpec) -> CellSpec | None:
    """The release's first code cell when it is a locked given cell (``grading.start()``)."""
    for c in spec.cells:
        if c.cell_type == "code":
            return c if c.kind == "given" and c.index == spec.first_code_index else None
    return None


def _norm(source: str) -> str:
    return "\n".join(line.rstrip() for line in source.strip().splitlines())


def _read(path: Path):
    """Parse and validate a notebook file: (notebook, None) or (None, why it is broken)."""
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        return None, "not UTF-8 text"
    try:
        raw = json.loads(text)
    except json.JSONDecodeError as exc:
        return None, f"invalid JSON at line {exc.lineno}, column {exc.colno}: {exc.msg}"
    if not isinstance(raw, dict) or "cells" not in raw:
        return None, "JSON without a 'cells' list"
    try:
        nb = nbformat.reads(text, as_version=4)
        nbformat.validate(nb)
    except Exception as exc:  # noqa: BLE001 - any schema problem makes it ungradable
        msg = str(exc).splitlines()[0][:200]
        return None, f"not a valid nbformat 4 notebook: {msg}"
    return nb, None


# ------------------------------------------------------------------------------------ the driver
def _course_root(root) -> Path:
    """The course root of ``root``: a :class:`~.course.Course`, a folder, or None (the default course)."""
    if isinstance(root, Course):
        return root.path_root
    return course_root(root)


def preflight(assignment: str, root=None, students: Iterable[str] | None = None,
              quarantine: bool = True, write: bool = True) -> IntegrityReport:
    """Check every ``submitted/<student>/<assignment>/`` folder; quarantine what must not run.

    Findings recorded by an earlier run for files that are now in quarantine are kept, so a
    re-run reports the same problems. Writes ``integrity/<assignment>.json`` in the course root.
    """
    root = _course_root(root)
    specs = release_specs(root, assignment)
    others = _other_assignments(root, assignment)
    checker = _Checker(root, assignment, specs, others, quarantine)
    sub = root / "submitted"
    wanted = set(students) if students is not None else None
    folders = sorted(p for p in sub.iterdir() if p.is_dir() and (p / assignment).is_dir()) if sub.is_dir() else []
    findings, checked = [], []
    for folder in folders:
        student = folder.name
        if wanted is not None and student not in wanted:
            continue
        checked.append(student)
        fresh = checker.check_student(student, folder / assignment)
        keys = {(f.code, f.notebook) for f in fresh}
        qdir = root / QUARANTINE / student / assignment
        old = []
        if qdir.is_dir():
            for rec in sorted(qdir.glob("*.finding.json")):
                try:
                    f = Finding.from_dict(json.loads(rec.read_text()))
                except Exception:  # noqa: BLE001
                    continue
                src = folder / assignment / rec.name[: -len(".finding.json")]
                if (f.code, f.notebook) not in keys and not src.exists():
                    old.append(f)
        # a notebook in quarantine is not "missing": its own finding explains it
        quarantined = {f.notebook for f in old}
        fresh = [f for f in fresh if not (f.code == "missing-notebook" and f.notebook in quarantined)]
        findings.extend(old + fresh)
    report = IntegrityReport(assignment, findings, checked)
    if write:
        path = root / REPORT_TEMPLATE.format(assignment=assignment)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(report.to_dict(), indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    return report


def scan_notebook_file(path, release_path) -> list[Finding]:
    """Check one notebook file against its release notebook (no quarantine, no gradebook)."""
    path, release_path = Path(path), Path(release_path)
    spec = notebook_spec(release_path)
    checker = _Checker(release_path.parent.parent.parent, release_path.parent.name, {release_path.name: spec}, {},
                       quarantine=False)
    nb, problem = _read(path)
    if problem:
        return [Finding("?", release_path.parent.name, path.name, None, None, None, "invalid-notebook", BLOCK,
                        problem)]
    return checker.check_notebook("?", release_path.name, nb)


# ------------------------------------------------------------------------------- grade overrides
@dataclasses.dataclass(frozen=True)
class Override:
    student: str
    assignment: str
    notebook: str
    grade_id: str
    auto_score: float | None
    max_score: float
    reason: str


def apply_overrides(report: IntegrityReport, root=None, db_url: str | None = None) -> list[Override]:
    """Withhold the points of every cell a blocking finding names (nbgrader manual-score override).

    For each withheld cell: ``manual_score = 0`` (the autograder's ``auto_score`` is kept), the
    notebook is ``flagged`` for review and the reasons go into the comment of the notebook's answer
    cells (shown in the feedback). A student nbgrader never recorded (every notebook broken) gets a
    submission created so the zero and the reason are in the gradebook and the CSV. Idempotent.
    """
    from nbgrader.api import Gradebook, MissingEntry

    if isinstance(root, Course):
        db_url = db_url or root.db_url
    root = _course_root(root)
    ensure_venv_on_path()
    db_url = db_url or default_db_url(root)
    done: list[Override] = []
    students = sorted({f.student for f in report.blocking()})
    try:
        specs = release_specs(root, report.assignment)
    except FileNotFoundError:
        specs = {}
    with Gradebook(db_url, COURSE_ID) as gb:
        for student in students:
            withheld = report.withheld(student)
            reasons_all = [f"{f.where()}: {f.message}" for f in report.blocking(student)]
            if student in report.ungradable():
                continue  # nbgrader cannot address the folder; the report is the record
            try:
                gb.find_submission(report.assignment, student)
            except MissingEntry:
                gb.update_or_create_student(student)
                gb.update_or_create_submission(report.assignment, student)
            for nb_file, cells in sorted(withheld.items()):
                nb_name = Path(nb_file).stem
                try:
                    snb = gb.find_submission_notebook(nb_name, report.assignment, student)
                except MissingEntry:
                    continue
                for gid, reasons in sorted(cells.items()):
                    try:
                        grade = gb.find_grade(gid, nb_name, report.assignment, student)
                    except MissingEntry:
                        continue
                    grade.manual_score = 0.0
                    grade.needs_manual_grade = False
                    done.append(Override(student, report.assignment, nb_name, gid, grade.auto_score,
                                         float(grade.max_score), reasons[0]))
                snb.flagged = True
                nb_reasons = [f"{f.where()}: {f.message}" for f in report.blocking(student)
                              if any(w[0] == nb_file for w in f.withhold)] or reasons_all
                text = (f"{COMMENT_TAG} Points withheld for instructor review:\n- "
                        + "\n- ".join(dict.fromkeys(nb_reasons)))
                target = _comment_cell(specs.get(nb_file), cells)
                for comment in snb.comments:
                    current = comment.manual_comment or ""
                    if COMMENT_TAG in current:
                        current = current.split(COMMENT_TAG)[0].rstrip()
                    if target is None or comment.name == target:
                        current = (current + "\n\n" if current else "") + text
                    comment.manual_comment = current or None
            gb.db.commit()
    return done


def _comment_cell(spec: NotebookSpec | None, withheld: dict) -> str | None:
    """The answer cell whose comment carries the reason: the one just before the first withheld test."""
    if spec is None:
        return None
    answers = [c for c in spec.cells if c.kind in ("answer", "autoanswer", "manual") and c.cell_type == "code"]
    if not answers:
        answers = [c for c in spec.cells if c.kind in ("answer", "autoanswer", "manual")]
    if not answers:
        return None
    first = min((c.index for c in spec.cells if c.grade_id in withheld), default=None)
    before = [c for c in answers if first is None or c.index < first]
    return (before[-1] if before else answers[0]).grade_id


def _main(argv=None) -> int:
    import argparse

    parser = argparse.ArgumentParser(description="Pre-flight integrity checks of submitted notebooks")
    parser.add_argument("assignment")
    parser.add_argument("--root", default=None)
    parser.add_argument("--student", action="append", default=None)
    parser.add_argument("--no-quarantine", action="store_true")
    args = parser.parse_args(argv)
    report = preflight(args.assignment, args.root, args.student, quarantine=not args.no_quarantine)
    print(report.text())
    return 1 if report.blocking() else 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(_main())
