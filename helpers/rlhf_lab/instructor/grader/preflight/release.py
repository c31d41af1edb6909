"""What the release says a notebook is: its nbgrader cells (ids, kinds, points, text), its kernel.

:func:`release_specs` reads ``release/<assignment>/`` once per pre-flight; every check compares a
submitted notebook with its :class:`NotebookSpec`. :func:`other_assignments` indexes the other
released notebooks by their grade ids (to name a notebook handed in under the wrong assignment).
:func:`course_root_of` resolves the course every entry point is given. May import nbformat and
:mod:`rlhf_lab.instructor.course`.
"""
from __future__ import annotations

import dataclasses
from pathlib import Path

import nbformat

from ...course import Course, course_root


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


def nbg(cell) -> dict:
    """A cell's nbgrader metadata ({} when it has none)."""
    return cell.get("metadata", {}).get("nbgrader", {}) or {}


def cell_kind(md: dict, cell_type: str) -> str:
    if md.get("task"):
        return "task"
    if md.get("solution") and md.get("grade"):
        return "autoanswer" if cell_type == "code" else "manual"
    if md.get("solution"):
        return "answer"
    if md.get("grade"):
        return "test" if cell_type == "code" else "manual"
    return "given"


def cell_source(cell) -> str:
    src = cell.get("source", "")
    return "".join(src) if isinstance(src, list) else str(src)


def notebook_spec(path: Path) -> NotebookSpec:
    """The nbgrader structure of a release notebook."""
    nb = nbformat.read(str(path), as_version=4)
    cells = []
    first_code = next((i for i, c in enumerate(nb.cells) if c.cell_type == "code"), None)
    for i, cell in enumerate(nb.cells):
        md = nbg(cell)
        if md.get("grade_id"):
            cells.append(CellSpec(md["grade_id"], i, cell.cell_type, cell_kind(md, cell.cell_type),
                                  float(md.get("points", 0) or 0), cell_source(cell),
                                  dict(md)))
    ks = nb.metadata.get("kernelspec", {}) or {}
    return NotebookSpec(path.name, cells, ks.get("name", ""), ks.get("language", "python"), first_code)


def release_specs(root: Path, assignment: str) -> dict:
    """``{file name: NotebookSpec}`` for ``release/<assignment>/``."""
    folder = Path(root) / "release" / assignment
    if not folder.is_dir():
        raise FileNotFoundError(f"{folder} does not exist: run `nbgrader generate_assignment {assignment}` first")
    return {p.name: notebook_spec(p) for p in sorted(folder.glob("*.ipynb"))}


def other_assignments(root: Path, assignment: str) -> dict:
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


def best_other_assignment(ids: set, others: dict):
    """``(assignment, notebook)`` of the other released notebook sharing most grade ids (None: none)."""
    best, score = None, 0
    for other_ids, where in others.items():
        overlap = len(ids & other_ids)
        if overlap > score:
            best, score = where, overlap
    return best if score else None


def start_spec(spec: NotebookSpec) -> CellSpec | None:
    """The release's first code cell when it is a locked given cell (``grading.start()``)."""
    for c in spec.cells:
        if c.cell_type == "code":
            return c if c.kind == "given" and c.index == spec.first_code_index else None
    return None


def norm(source: str) -> str:
    """Cell text compared without trailing spaces or surrounding blank lines."""
    return "\n".join(line.rstrip() for line in source.strip().splitlines())


def course_root_of(root) -> Path:
    """The course root of ``root``: a :class:`~rlhf_lab.instructor.course.Course`, a folder, or None
    (the default course)."""
    if isinstance(root, Course):
        return root.path_root
    return course_root(root)
