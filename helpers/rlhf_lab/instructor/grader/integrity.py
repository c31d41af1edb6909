"""Pre-flight integrity checks of submitted files, run BEFORE ``nbgrader autograde``.

Hidden tests are decided outside the student's kernel by the judge (:mod:`rlhf_lab.instructor.grader.judge`,
checks in :mod:`rlhf_lab.judging`) from the values the student's functions return on inputs the
kernel cannot predict, and every kernel runs under bubblewrap with only the student's folder and a
library build without the functions the notebook asks for (:mod:`rlhf_lab.instructor.grader.sandbox`,
:mod:`rlhf_lab.instructor.grader.library_build`). Nothing a student cell does inside its kernel can change
a grade, so this module reads what the code does only to report it for review (the ``library-copy``,
``rebinding`` and ``introspection`` rows below). It checks the submitted *files*: every
``submitted/<student>/<assignment>/`` folder against ``release/<assignment>/``. nbgrader restores
locked cells from their checksums and re-reads points and kernels from the gradebook, but it
refuses or misgrades some files: a notebook that is not JSON, renamed or taken from the other
assignment, a duplicated locked cell or a locked cell whose metadata was edited (nbgrader drops the
whole notebook), a symbolic link or a FIFO (copied as its target, or a hang). Each problem is a
:class:`Finding` (student, notebook, cell, line, a plain message); what nbgrader would choke on is
repaired or moved aside so the student's other work is graded.

Policy: a finding withholds points only where the files make the grade meaningless
----------------------------------------------------------------------------------
``block`` findings withhold points, for instructor review, from exactly the autograded cells the
problem concerns; ``warn`` findings are reported and change nothing.

=========================================  =====  =============================================
finding                                    level  effect
=========================================  =====  =============================================
notebook is not valid JSON / nbformat      block  moved to quarantine (so nbgrader can grade
(``invalid-notebook``)                            the student's other notebooks); its autograded
                                                  cells score 0 (there is nothing to run)
notebook missing (``missing-notebook``)    block  scores 0 (nothing was submitted)
notebook renamed: its cells match a        block  the expected notebook scores 0; the message
missing expected one (``renamed-notebook``)       names both files so the instructor can rename
notebook of the other assignment under an  block  quarantined (never executed); scores 0
expected name (``other-assignment``)
test cell deleted (``deleted-test``)       block  that test scores 0 (nbgrader does not run it)
read-only given cell deleted               block  the tests after it withheld: nbgrader does not
(``deleted-given``)                               restore it, so they ran without the code and
                                                  data the release gives them
student folder nbgrader cannot address:    block  that student is not graded, named readably
not UTF-8, a newline or control character,        (``ascii()``); the rest of the class is
``* ? [ ]``, a leading dot                        (``student-id-unusable``)
student folder with spaces, commas,        warn   graded normally; listed for roster matching
quotes or non-ASCII (``student-id-characters``)   (the CSV export quotes the field)
symbolic link / FIFO / device / socket /   warn   moved out of the submission as it is (the
hard link (``symlink``, ``special-file``)         link, never its target); nothing follows it
file over 100 MiB, sparse or not           warn   moved out of the submission (never copied)
(``oversized-file``)
the student's folder or assignment folder  block  the link moved out (never followed); the
is a link or not a folder (``folder-link``)       student is not graded (the class is)
file name not UTF-8 or with a control      warn   moved out of the submission
character (``file-name``)
extra file, or one that shadows an         warn   nbgrader copies extra files beside the
importable module (``extra-file``,                notebook; a shadowing one (``numpy.py``) is
``shadow-module``)                                moved out first
unknown extra notebook                     warn   nbgrader ignores it
nbgrader's ``timestamp.txt`` /             none   written by ``nbgrader submit``; not reported
``submission_secret.txt``
locked cell duplicated                     warn   repaired: the first copy kept, the others
(``duplicate-cell``)                              dropped (nbgrader would refuse the notebook)
answer cell duplicated                     warn   repaired: the last copy graded, the earlier
(``duplicate-answer``)                            ones kept as plain code cells
cell saved as another type (``cell-type``) warn   repaired: the release's type restored
locked cell metadata edited                warn   repaired: the release's metadata restored
(``edited-metadata``)                             (nbgrader would refuse the checksum)
locked test / given / first cell edited    warn   nbgrader restores the original text
cells reordered (``reordered``)            warn   graded in the submitted order
code before the locked first cell          warn   it runs in the student's sandboxed kernel
(``code-before-start``; a display magic           like any other cell; ``%matplotlib widget``
only: ``magic-before-start``)                     above it is harmless
wrong kernel name / language, points or    warn   nbgrader uses the release's values
locks changed
answer function equal to a library         warn   reported for review; the answer is judged on
function up to names (``library-copy``)           its outputs like any other
a statement in an answer or added cell     block  the test cells at or below that cell are
that rebinds an attribute of JAX, NumPy,          withheld for review (:mod:`.rebinding`); one
builtins or the course library, or                finding per statement, at most 10 per
``sys.modules`` (``rebinding``)                   notebook, then one summing up the rest
a statement that reads frames, the         block  the same (``jax.config.update(...)``,
garbage collector, tracing or ``ctypes``          ``np.random.seed(0)`` and reading attributes
(``introspection``)                               are not findings)
=========================================  =====  =============================================

Repairs and moves happen only when ``quarantine`` is true (the default; ``--no-quarantine`` only
reports). A repaired notebook is rewritten in place and its original kept as
``integrity/quarantine/<student>/<assignment>/<notebook>.before-repair``.

Grading without the sandbox (``RLHF_NO_SANDBOX=1`` / ``--no-sandbox``) prints that grades are not
protected (:mod:`rlhf_lab.instructor.grader.sandbox`); this pre-flight does not pretend to make up for it.

A withheld cell gets ``manual_score = 0`` in the gradebook (nbgrader's own override; the
autograder's ``auto_score`` is kept, so an instructor who clears the override in formgrader
restores it), its notebook is ``flagged`` and the reason is written as a comment on the
notebook's answer cells, which nbgrader shows in the feedback. Everything is also written to
``integrity/<assignment>.json`` in the course root (files that must not run go to
``integrity/quarantine/<student>/<assignment>/``, each with a ``.finding.json`` saying why).

Command line::

    python -m rlhf_lab.instructor.grader.integrity ASSIGNMENT [--student ID ...] [--no-quarantine] [--json PATH]
"""
from __future__ import annotations

import copy
import dataclasses
import functools
import json
import os
import sys
import unicodedata
from pathlib import Path
from typing import Iterable

import nbformat

from . import safe_files
from ..course import COURSE_ID, Course, course_root, default_db_url, ensure_venv_on_path

BLOCK = "block"
WARN = "warn"
#: Everything the pre-flight writes lives under ``<course root>/integrity/`` (a pipeline output).
OUTPUT_DIR = "integrity"
#: Files ``nbgrader submit`` adds to every submission in the exchange (``collect`` copies them into
#: ``submitted/``): the submission time and the secret that ties released feedback to it. They are
#: nbgrader's, not extra files of the student (small text files only; anything larger is an extra).
NBGRADER_EXCHANGE_FILES = ("timestamp.txt", "submission_secret.txt")
QUARANTINE = "integrity/quarantine"
REPORT_TEMPLATE = "integrity/{assignment}.json"
COMMENT_TAG = "[integrity]"
#: Largest notebook the pre-flight reads (a larger one is an ``invalid-notebook``).
MAX_NOTEBOOK_BYTES = safe_files.MAX_FILE_BYTES


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
        """Students nbgrader must not be run for (their folder name cannot be addressed, or their
        folder is a link)."""
        return sorted({f.student for f in self.findings if f.code in ("student-id-unusable", "folder-link")})

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
    nbgrader: dict = dataclasses.field(default_factory=dict, compare=False)  # the release's metadata

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
                                  float(md.get("points", 0) or 0), _source(cell),
                                  dict(md)))
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


# ------------------------------------------------------------------------------ notebook checks
@functools.lru_cache(maxsize=1)
def _shadowable_names() -> frozenset:
    """Top-level module names an extra file beside the notebook could shadow: the standard library,
    the course's stack, and every top-level module or package on this interpreter's ``sys.path``
    (read from the folders, which takes milliseconds; ``importlib.metadata`` took over a second)."""
    names = set(sys.stdlib_module_names) | set(sys.builtin_module_names)
    names |= {"numpy", "jax", "jaxlib", "rlhf_lab", "grading", "IPython", "ipykernel", "matplotlib", "scipy",
              "nbgrader", "pytest", "sitecustomize", "usercustomize", "nbformat", "traitlets", "zmq",
              "ml_dtypes", "opt_einsum", "ipywidgets", "comm", "jupyter_client", "pandas", "torch"}
    for entry in sys.path:
        try:
            listing = os.scandir(entry or ".")
        except OSError:
            continue
        with listing:
            for item in listing:
                stem, _, suffix = item.name.partition(".")
                if not stem.isidentifier() or item.name.endswith((".dist-info", ".egg-info")):
                    continue
                if suffix in ("py", "pyc") or suffix.endswith(("so", "pyd")) or (not suffix and item.is_dir()):
                    names.add(stem)
    return frozenset(names)


class _Checker:
    """Checks one student's assignment folder against the release (and repairs what nbgrader would choke on)."""

    def __init__(self, root: Path, assignment: str, specs: dict, others: dict, quarantine: bool):
        self.root = root
        self.assignment = assignment
        self.specs = specs
        self.others = others
        self.quarantine = quarantine  # False: report only, change no file
        self.shadowable = _shadowable_names()

    def check_folder_itself(self, student: str, student_dir: Path, folder: Path) -> list[Finding]:
        """The ``folder-link`` finding when the student's folder or assignment folder is a link or
        not a folder ([] when both are plain folders); the link is moved out, never followed."""
        import stat

        for path in (student_dir, folder):
            try:
                st = os.lstat(path)
            except OSError:
                return []
            if stat.S_ISDIR(st.st_mode):
                continue
            what = safe_files.kind_of(st)
            rel = path.relative_to(self.root)
            finding = Finding(student=student, assignment=self.assignment, notebook=None, cell=None, grade_id=None,
                              line=None, code="folder-link", severity=BLOCK, withhold=self.all_autograded(),
                              message=f"{rel} is a {what}, not a folder of the student's files; it was never "
                                      "followed and this student is not graded (the rest of the class is): "
                                      "collect the submission again as a plain folder and grade again")
            if not self.quarantine:
                return [finding]
            moved = safe_files.move_aside(path, self.root / QUARANTINE / student / self.assignment / ".folder")
            return [dataclasses.replace(finding, action=f"moved to {Path(moved).relative_to(self.root)}"
                                        if moved else "removed")]
        return []

    def all_autograded(self) -> tuple:
        return tuple((nb, gid) for nb, spec in self.specs.items() for gid in spec.autograded_ids)

    def check_student(self, student: str, folder: Path) -> list[Finding]:
        out: list[Finding] = []
        F = lambda **kw: Finding(student=student, assignment=self.assignment, **kw)  # noqa: E731
        # -- the student's folder name
        shown = readable_name(student)
        unusable = _unusable_name(student)
        if unusable:
            out.append(F(notebook=None, cell=None, grade_id=None, line=None, code="student-id-unusable",
                         severity=BLOCK, withhold=self.all_autograded(),
                         message=f"the folder name {shown} {unusable}; this student is not graded (the rest of "
                                 "the class is): rename the folder and grade again"))
            return out
        if student != unicodedata.normalize("NFC", student):
            out.append(F(notebook=None, cell=None, grade_id=None, line=None, code="student-id-unicode",
                         severity=WARN, message="the folder name is not in Unicode NFC form (often a macOS zip); "
                                                "the same student may appear twice in the gradebook"))
        if not student.isascii() or any(ch.isspace() or ch in ",;\"'" for ch in student):
            out.append(F(notebook=None, cell=None, grade_id=None, line=None, code="student-id-characters",
                         severity=WARN, message=f"the folder name {shown} has spaces, punctuation or non-ASCII "
                                                "characters; it is graded normally, check that it matches the "
                                                "roster"))
        present = {}
        extras = []
        for path in sorted(_walk(folder)):
            rel = path.relative_to(folder)
            if any(part in (".ipynb_checkpoints", "__pycache__") for part in rel.parts):
                continue
            special = _special_kind(path)
            if special.startswith("file of "):
                out.append(self._quarantine(F(
                    notebook=_readable_rel(rel), cell=None, grade_id=None, line=None, code="oversized-file",
                    severity=WARN, message=f"{_readable_rel(rel)} is a {special}, more than the "
                                           f"{safe_files.MAX_FILE_BYTES // (1024 * 1024)} MiB accepted (a sparse "
                                           "file counts at the size it claims); it was never read or copied: it "
                                           "was moved out of the submission"), student, path))
                continue
            if special:
                out.append(self._quarantine(F(
                    notebook=_readable_rel(rel), cell=None, grade_id=None, line=None,
                    code="symlink" if special == "symbolic link" else "special-file", severity=WARN,
                    message=f"{_readable_rel(rel)} is a {special}; it is never followed, read or copied as its "
                            "target: it was moved out of the submission"
                            + (" (a notebook that is only a link counts as not submitted)"
                               if rel.suffix == ".ipynb" else "")), student, path))
                continue
            bad_name = _unusable_file_name(rel)
            if bad_name:
                out.append(self._quarantine(F(
                    notebook=_readable_rel(rel), cell=None, grade_id=None, line=None, code="file-name",
                    severity=WARN, message=f"the file name {_readable_rel(rel)} {bad_name}; the file was moved "
                                           "out of the submission"), student, path))
                continue
            if path.is_dir():
                if len(rel.parts) == 1 and rel.name in self.shadowable and (path / "__init__.py").exists():
                    out.append(self._quarantine(F(
                        notebook=str(rel), cell=None, grade_id=None, line=None, code="shadow-module",
                        severity=WARN,
                        message=f"the folder {rel}/ would be imported instead of the real '{rel.name}' module "
                                "in the student's kernel; it was moved out of the submission and the notebook "
                                "graded without it"), student, path))
                continue
            if len(rel.parts) == 1 and path.suffix == ".ipynb":
                present[path.name] = path
            elif len(rel.parts) == 1 and path.name in NBGRADER_EXCHANGE_FILES and os.lstat(path).st_size <= 4096:
                continue  # written by `nbgrader submit` into every exchange submission: not the student's
            else:
                extras.append((rel, path))
        for rel, path in extras:
            if len(rel.parts) == 1 and path.suffix in (".py", ".pyc", ".so", ".pth") and \
                    path.stem.split(".")[0] in self.shadowable | {"sitecustomize", "usercustomize"} or \
                    path.suffix == ".pth" or len(rel.parts) > 1 and rel.parts[0] in self.shadowable:
                out.append(self._quarantine(F(
                    notebook=str(rel), cell=None, grade_id=None, line=None, code="shadow-module", severity=WARN,
                    message=f"the extra file {rel} would be imported instead of the real "
                            f"'{rel.parts[0].split('.')[0]}' module in the student's kernel; it was moved out of "
                            "the submission and the notebook graded without it"), student, path))
            else:
                out.append(F(notebook=str(rel), cell=None, grade_id=None, line=None, code="extra-file",
                             severity=WARN, message=f"extra file {rel} ({os.lstat(path).st_size} bytes) is not part "
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
            else:
                repaired, repairs = self.repair_notebook(student, name, parsed[name])
                if repairs and self.quarantine:
                    nb_findings = self._save_repair(student, path, repaired, nb_findings, repairs)
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
        """Move ``path`` (the link itself, never its target) to the quarantine folder; record why.

        Only ``lstat`` and ``rename`` touch it (:func:`.safe_files.move_aside`): across file systems
        a link or special file is removed, never copied as its target."""
        if not self.quarantine:
            return finding
        dest_dir = self.root / QUARANTINE / student / self.assignment
        moved = safe_files.move_aside(path, dest_dir)
        dest = Path(moved) if moved is not None else None
        where = f"moved to {dest.relative_to(self.root)}" if dest is not None else "removed"
        finding = dataclasses.replace(finding, action=where)
        (dest_dir / (path.name + ".finding.json")).write_text(json.dumps(finding.to_dict(), indent=1) + "\n")
        return finding

    def _save_repair(self, student: str, path: Path, repaired, findings: list, repairs: set) -> list:
        """Write the repaired notebook in place (the original goes to quarantine); mark the findings."""
        dest_dir = self.root / QUARANTINE / student / self.assignment
        dest_dir.mkdir(parents=True, exist_ok=True)
        original = dest_dir / (path.name + ".before-repair")
        if os.path.lexists(original):
            os.unlink(original)
        safe_files.copy_file_safely(path, original, MAX_NOTEBOOK_BYTES)
        # a new file renamed over the old name: never written through a link swapped in meanwhile
        safe_files.write_bytes_replacing(path, (nbformat.writes(repaired) + "\n").encode("utf-8"))
        out = []
        k = 0
        for f in findings:
            if f.code in repairs:
                f = dataclasses.replace(f, action=f"repaired in place (original kept as {original.relative_to(self.root)})")
                (dest_dir / f"{path.name}.repair-{k}.finding.json").write_text(json.dumps(f.to_dict(), indent=1) + "\n")
                k += 1
            out.append(f)
        return out

    # -- one notebook -------------------------------------------------------------------------
    def repair_notebook(self, student: str, name: str, nb):
        """``(notebook nbgrader can grade, finding codes repaired)``: what nbgrader would refuse, fixed.

        * a locked cell (given or test) that appears more than once: the first copy is kept, the
          others dropped (nbgrader refuses a notebook with a duplicated grade id, so without this the
          whole notebook would score 0);
        * an answer cell that appears more than once: the last copy keeps the nbgrader metadata (it is
          the one whose definitions the kernel keeps), the earlier copies stay as plain code cells;
        * a cell saved with another type (markdown or raw instead of code, or the reverse): its type is
          restored from the release, its text kept.
        """
        spec: NotebookSpec = self.specs[name]
        nb = copy.deepcopy(nb)
        repairs: set = set()
        last = {}
        for i, c in enumerate(nb.cells):
            gid = _nbg(c).get("grade_id")
            if gid:
                last[gid] = i
        keep, seen = [], set()
        for i, c in enumerate(nb.cells):
            gid = _nbg(c).get("grade_id")
            cspec = spec.by_id(gid) if gid else None
            if cspec is not None and gid in seen:
                if cspec.kind in ("answer", "manual", "autoanswer"):
                    pass  # handled below (the last copy keeps the id)
                else:
                    repairs.add("duplicate-cell")
                    continue
            if cspec is not None and cspec.kind in ("answer", "manual", "autoanswer") and last[gid] != i:
                c = copy.deepcopy(c)
                c.metadata.pop("nbgrader", None)
                if c.cell_type != "code" and cspec.cell_type == "code":
                    c = _with_type(c, "code")
                repairs.add("duplicate-answer")
            elif cspec is not None and c.cell_type != cspec.cell_type:
                c = _with_type(c, cspec.cell_type)
                repairs.add("cell-type")
            if cspec is not None and cspec.kind in ("given", "test") and cspec.nbgrader and \
                    _nbg(c) != cspec.nbgrader:
                c = copy.deepcopy(c)
                c.metadata["nbgrader"] = copy.deepcopy(cspec.nbgrader)
                repairs.add("edited-metadata")
            if gid:
                seen.add(gid)
            keep.append(c)
        nb.cells = keep
        return nb, repairs

    def check_notebook(self, student: str, name: str, nb) -> list[Finding]:
        """Every finding of one submitted notebook (the module docstring's table gives their severity)."""
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
        # duplicates: the pre-flight repairs both kinds (see repair_notebook)
        seen = {}
        for i, gid in sub_ids:
            if gid in seen:
                cspec = spec.by_id(gid)
                if cspec is not None and cspec.kind in ("answer", "manual", "autoanswer"):
                    out.append(F(cell=i, grade_id=gid, line=None, code="duplicate-answer", severity=WARN,
                                 message=f"the answer cell {gid!r} appears more than once (first as cell "
                                         f"{seen[gid]}, again as cell {i}); the last copy is graded, the earlier "
                                         "ones run as ordinary code"))
                elif cspec is not None:
                    out.append(F(cell=i, grade_id=gid, line=None, code="duplicate-cell", severity=WARN,
                                 message=f"the locked cell {gid!r} appears more than once (first as cell "
                                         f"{seen[gid]}, again as cell {i}); the first copy is kept and the "
                                         "duplicate dropped, so the rest of the notebook is graded"))
            else:
                seen[gid] = i
        # missing cells
        for cspec in spec.cells:
            if cspec.grade_id in seen:
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
                             message=f"the read-only cell {cspec.grade_id!r} was deleted (nbgrader does not put it "
                                     "back); the tests after it ran without the code it gives, so they are "
                                     "withheld for review"))
            else:
                out.append(F(cell=None, grade_id=cspec.grade_id, line=None, code="deleted-answer", severity=WARN,
                             message=f"the answer cell {cspec.grade_id!r} was deleted"))
        # order (first copies, which are the ones kept for locked cells)
        order = [g for g in seen if g in spec_ids]
        expected_order = [g for g in spec.ids if g in set(order)]
        if order != expected_order:
            first_bad = next(i for i, (a, b) in enumerate(zip(order, expected_order)) if a != b)
            out.append(F(cell=seen.get(order[first_bad]), grade_id=order[first_bad], line=None, code="reordered",
                         severity=WARN,
                         message=f"the notebook's cells were reordered ({order[first_bad]!r} is where "
                                 f"{expected_order[first_bad]!r} should be); graded in the submitted order (a test "
                                 "that runs before its answer is defined fails)"))
        # code before the locked first code cell
        start_spec = _start_spec(spec)
        if start_spec is not None and start_spec.grade_id in seen:
            start_at = seen[start_spec.grade_id]
            early = [i for i, c in enumerate(nb.cells[:start_at]) if c.cell_type == "code" and _source(c).strip()]
            if early:
                harmless = all(_only_harmless_magics(_source(nb.cells[i])) for i in early)
                out.append(F(cell=early[0], grade_id=_nbg(nb.cells[early[0]]).get("grade_id"), line=None,
                             code="magic-before-start" if harmless else "code-before-start", severity=WARN,
                             message=(f"a display magic ({_source(nb.cells[early[0]]).strip().splitlines()[0][:60]}) "
                                      f"runs before the locked first cell {start_spec.grade_id!r}; harmless"
                                      if harmless else
                                      f"code runs before the locked first cell {start_spec.grade_id!r}; it runs in "
                                      "the student's own sandboxed kernel and the judge grades the outputs")))
        # locked cells edited; cell types
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
                             message=f"the cell {gid!r} (cell {i}) was saved as {c.cell_type}, not "
                                     f"{cspec.cell_type}; its type was restored so it is graded with the rest"))
            md = _nbg(c)
            if cspec.kind in ("test", "given") and _norm(_source(c)) != _norm(cspec.source):
                if cspec.kind == "test":
                    out.append(F(cell=i, grade_id=gid, line=None, code="edited-test", severity=WARN,
                                 message=f"the locked test cell {gid!r} was edited; nbgrader ran the original"))
                elif start_spec is not None and gid == start_spec.grade_id:
                    out.append(F(cell=i, grade_id=gid, line=None, code="edited-start", severity=WARN,
                                 message=f"the locked first cell {gid!r} was edited; nbgrader restores the original"))
                else:
                    out.append(F(cell=i, grade_id=gid, line=None, code="edited-given", severity=WARN,
                                 message=f"the read-only cell {gid!r} was edited; nbgrader restores the original"))
            if cspec.points and float(md.get("points", cspec.points) or 0) != cspec.points:
                out.append(F(cell=i, grade_id=gid, line=None, code="points-changed", severity=WARN,
                             message=f"the points of {gid!r} were changed to {md.get('points')}; nbgrader uses "
                                     f"{cspec.points:g}"))
            locked_md = bool(md.get("locked")) if not md.get("solution") else False
            spec_locked = cspec.kind in ("given", "test")
            if spec_locked and (not locked_md or md.get("solution") or md.get("grade") != (cspec.kind == "test")):
                out.append(F(cell=i, grade_id=gid, line=None, code="edited-metadata", severity=WARN,
                             message=f"the nbgrader metadata of the locked cell {gid!r} (cell {i}) was edited; "
                                     "nbgrader restores the release's"))
        # answers that are a library function up to names, comments and formatting: for review only
        for copy_ in _library_copies(nb):
            out.append(F(cell=None, grade_id=copy_.cell, line=copy_.line, code="library-copy", severity=WARN,
                         message=f"{copy_}; reported for review (the answer is judged on its outputs)"))
        # statements that rebind JAX, NumPy, builtins or the course library: withheld for review
        out.extend(_rebinding_findings(F, name, spec, nb))
        return out



def readable_name(name: str) -> str:
    """``name`` quoted on one printable line: bytes that are not UTF-8 as ``\\xNN``, a newline as ``\\n``."""
    try:
        text = os.fsencode(name).decode("utf-8", "backslashreplace")
    except (UnicodeError, ValueError):
        text = name.encode("utf-8", "backslashreplace").decode("ascii")
    return "'" + "".join(ch if ch.isprintable() else ascii(ch)[1:-1] for ch in text) + "'"


def _unusable_name(name: str) -> str:
    """Why nbgrader cannot be given this folder name ("" when it can)."""
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        return "is not valid UTF-8"
    if any(ch in name for ch in "*?[]"):
        return "contains characters nbgrader treats as a pattern (* ? [ ])"
    if name.startswith(".") or "/" in name or "\\" in name:
        return "is a hidden or path-like name"
    if any(unicodedata.category(ch) == "Cc" for ch in name):
        return "contains a newline or another control character"
    return ""


def _unusable_file_name(rel: Path) -> str:
    """Why a file inside a submission cannot be kept ("" when it can)."""
    for part in rel.parts:
        why = _unusable_name(part) if not part.startswith(".") else ""
        if why and why != "is a hidden or path-like name":
            return why
    return ""


def _readable_rel(rel: Path) -> str:
    return "/".join(ascii(p)[1:-1] if _unusable_name(p) else p for p in rel.parts)


def _walk(folder: Path):
    """Every path under ``folder`` (``lstat`` only, :func:`.safe_files.walk`): plain files and folders,
    then what the walk refused (links, FIFOs, sockets, devices, hard links), never entered or opened."""
    refused: list = []
    found = [Path(p) for p, _ in safe_files.walk(folder, refused, max_bytes=None, max_links=None)]
    return found + [Path(r.path) for r in refused]


def _special_kind(path: Path) -> str:
    """"symbolic link", "named pipe (FIFO)", "hard link ...", "file of N MiB" ... for anything that is
    not a plain file or folder within :data:`.safe_files.MAX_FILE_BYTES` ("" for those)."""
    try:
        st = os.lstat(path)
    except OSError:
        return ""
    found = safe_files.refusal(path, st, max_bytes=safe_files.MAX_FILE_BYTES)
    if found is None:
        return ""
    if found.kind == "hard link":
        return found.reason[len("is a "):]
    if found.kind == "too large":
        return f"file of {st.st_size / (1024 * 1024):.1f} MiB"
    return found.kind


def _with_type(cell, cell_type: str):
    """A copy of ``cell`` with another cell type (text and metadata kept)."""
    c = copy.deepcopy(cell)
    c["cell_type"] = cell_type
    if cell_type == "code":
        c.setdefault("outputs", [])
        c.setdefault("execution_count", None)
    else:
        c.pop("outputs", None)
        c.pop("execution_count", None)
    c.pop("attachments", None) if cell_type == "code" else None
    return c


#: Line magics that only change how output is shown (one above the first locked cell is harmless).
DISPLAY_MAGICS = ("matplotlib", "config InlineBackend", "precision", "load_ext autoreload", "autoreload",
                  "xmode")


def _only_harmless_magics(source: str) -> bool:
    lines = [ln.strip() for ln in source.splitlines() if ln.strip() and not ln.strip().startswith("#")]
    return bool(lines) and all(ln.startswith("%") and not ln.startswith("%%")
                               and ln[1:].startswith(DISPLAY_MAGICS) for ln in lines)


_FINGERPRINTS: list = []  # [fingerprints of the installed library], computed once per process


def _library_copies(nb) -> list:
    """Answer-cell functions that are a library function up to names (text only; nothing runs):
    :func:`rlhf_lab.instructor.grader.library_build.suspicious_copies`, with the library read once."""
    import ast

    from . import library_build as lb

    try:
        if not _FINGERPRINTS:
            _FINGERPRINTS.append(lb.reference_fingerprints())
        refs = _FINGERPRINTS[0]
        found = []
        for index, cell in enumerate(nb.cells):
            meta = _nbg(cell)
            if cell.get("cell_type") != "code" or not meta.get("solution"):
                continue
            try:
                tree = ast.parse(lb._strip_magics(_source(cell)))
            except SyntaxError:
                continue
            for node in ast.walk(tree):
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    match = refs.get(lb.normalised(node))
                    if match is not None:
                        found.append(lb.Finding(str(meta.get("grade_id") or f"cell {index}"), node.name, match,
                                                node.lineno))
        return found
    except Exception:  # noqa: BLE001 - a review aid must never stop the pre-flight
        return []


#: At most this many ``rebinding`` / ``introspection`` findings per notebook (then one for the rest).
MAX_REBINDING_FINDINGS = 10
_REBINDING_WHY = ("grades come from the judge and the grader's own jax.grad; code that rewrites JAX, NumPy, "
                  "builtins or the course library is reviewed by the instructor before these points count; "
                  "remove it and ask for a regrade")
_INTROSPECTION_WHY = ("grades come from the judge and the grader's own jax.grad; code that reaches into the "
                      "kernel's frames, objects or tracing is reviewed by the instructor before these points "
                      "count; remove it and ask for a regrade")


def _rebinding_findings(F, name: str, spec: NotebookSpec, nb) -> list:
    """``rebinding`` / ``introspection`` findings of one notebook (:func:`.rebinding.scan_cells`).

    Cells read: every code cell except the release's locked cells (given and test cells, matched by
    grade id: nbgrader runs the release's text for those, so that text is what is read for the
    names they import, and nothing in them is reported). Each hit withholds the test cells at or
    below its cell in the submitted notebook. ``F`` builds a :class:`Finding` of this notebook."""
    from . import rebinding

    try:
        locked = {c.grade_id: c for c in spec.cells if c.kind in ("given", "test")}
        sources, scanned, tests_at = [], set(), {}
        for i, cell in enumerate(nb.cells):
            gid = _nbg(cell).get("grade_id")
            cspec = spec.by_id(gid) if gid else None
            if cspec is not None and cspec.kind == "test":
                tests_at.setdefault(gid, i)
            if gid in locked:
                sources.append(locked[gid].source if locked[gid].cell_type == "code" else "")
                continue
            # an answer cell saved as another type is restored to code by the repair and runs
            is_code = (cspec.cell_type if cspec is not None else cell.get("cell_type")) == "code"
            sources.append(_source(cell) if is_code else "")
            if is_code:
                scanned.add(i)
        hits = [(i, hit) for i, hit in rebinding.scan_cells(sources) if i in scanned]
    except Exception:  # noqa: BLE001 - a text check must never stop the pre-flight
        return []

    def withheld(index: int) -> tuple:
        return tuple((name, gid) for gid, at in sorted(tests_at.items(), key=lambda kv: kv[1]) if at >= index)

    out = []
    for i, hit in hits[:MAX_REBINDING_FINDINGS]:
        text = hit.text if len(hit.text) <= 120 else hit.text[:117] + "..."
        if hit.kind == rebinding.REBIND:
            code, message = "rebinding", f"`{text}` rewrites {hit.target}; {_REBINDING_WHY}"
        else:
            code, message = "introspection", f"`{text}` reaches into the kernel ({hit.target}); {_INTROSPECTION_WHY}"
        out.append(F(cell=i, grade_id=_nbg(nb.cells[i]).get("grade_id"), line=hit.line, code=code,
                     severity=BLOCK, withhold=withheld(i), message=message))
    rest = hits[MAX_REBINDING_FINDINGS:]
    if rest:
        i, hit = rest[0]
        cells = ", ".join(str(c) for c in dict.fromkeys(c for c, _ in rest))
        only_introspection = all(h.kind != rebinding.REBIND for _, h in rest)
        out.append(F(cell=i, grade_id=_nbg(nb.cells[i]).get("grade_id"), line=hit.line,
                     code="introspection" if only_introspection else "rebinding", severity=BLOCK,
                     withhold=withheld(i),
                     message=f"{len(rest)} more statement(s) like these (in cell(s) {cells}) are not listed one by "
                             f"one; {_INTROSPECTION_WHY if only_introspection else _REBINDING_WHY}"))
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
        text = safe_files.read_text(path, MAX_NOTEBOOK_BYTES)
    except safe_files.UnsafeFileError as exc:  # changed since the walk looked at it
        return None, f"not a plain file any more ({exc.refusal.reason})"
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
    safe_files.add_course_root(root)
    specs = release_specs(root, assignment)
    others = _other_assignments(root, assignment)
    checker = _Checker(root, assignment, specs, others, quarantine)
    sub = root / "submitted"
    wanted = set(students) if students is not None else None
    folders = sorted(p for p in sub.iterdir() if _submission_entry(p, assignment)) if sub.is_dir() else []
    findings, checked = [], []
    for folder in folders:
        student = folder.name
        if wanted is not None and student not in wanted:
            continue
        checked.append(student)
        linked = checker.check_folder_itself(student, folder, folder / assignment)
        fresh = linked if linked else checker.check_student(student, folder / assignment)
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
        path.write_text(json.dumps(report.to_dict(), indent=1, ensure_ascii=False) + "\n", encoding="utf-8",
                        errors="backslashreplace")  # a folder name that is not UTF-8 stays readable
    return report


def _submission_entry(student_dir: Path, assignment: str) -> bool:
    """Whether ``submitted/<student>/<assignment>`` exists as anything (a folder, or a link or file
    where the folder should be: those are findings, see :meth:`_Checker.check_folder_itself`)."""
    try:
        os.lstat(student_dir / assignment)
        return True
    except OSError:
        return os.path.islink(student_dir)  # a linked student folder whose target lacks the assignment


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
