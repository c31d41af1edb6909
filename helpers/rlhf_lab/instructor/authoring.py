"""Authoring the course: the notebooks in ``source/`` are what instructors edit.

Instructors open ``source/<assignment>/*.ipynb`` in JupyterLab (``make lab``) and edit them with
nbgrader's Create Assignment toolbar. Three things keep that safe:

* :func:`normalise` is the one place that removes what Jupyter adds when a notebook is opened,
  run or saved (outputs, execution counts, the kernel's ``language_info``, widget state, per-cell
  execution timings). The course's JupyterLab runs it on every save
  (``jupyter/instructor/jupyter_server_config.py`` sets it as the contents manager's
  ``pre_save_hook``) and every sync check compares notebooks through it, so opening and saving a
  notebook without changing it never breaks anything. It is built on nbstripout's
  ``strip_output``.
* Every notebook of ``source/`` is paired (jupytext, ``jupytext.toml`` at the course root) with a
  ``py:percent`` text file under ``content/``, nbgrader metadata kept in each cell header, so
  reviews and diffs read as code. The pairs live outside ``source/`` because
  ``nbgrader generate_assignment`` copies every other file of a source folder into the release.
  :func:`pair_diff` lists the pairs that are out of sync.
* :func:`lint` checks the rules the course relies on and names the notebook, the cell id and the
  rule of every violation (see :data:`RULES`).

Command line (``make lint``, ``make pairs``, ``make normalise``)::

    python -m rlhf_lab.instructor.authoring lint            # exit 1 on any violation
    python -m rlhf_lab.instructor.authoring pairs [--check] # write (or check) content/*.py
    python -m rlhf_lab.instructor.authoring normalise       # rewrite source/ and release/ notebooks
"""
from __future__ import annotations

import argparse
import copy
import re
import sys
from dataclasses import dataclass
from pathlib import Path

import nbformat

#: The locked first code cell of every graded notebook, exactly.
START_CELL = "from rlhf_lab import grading\ngrading.start()"

#: Notebook-level and cell-level keys that Jupyter adds and the course never keeps.
EXTRA_KEYS = (
    "metadata.language_info",
    "metadata.jupytext",
    "metadata.widgets",
    "metadata.toc",
    "metadata.varInspector",
    "metadata.vscode",
    "cell.metadata.execution",
    "cell.metadata.collapsed",
    "cell.metadata.scrolled",
    "cell.metadata.jupyter",
    "cell.metadata.trusted",
)

#: rule name -> what it requires (a violation names the notebook, the cell id and the rule).
RULES = {
    "clean": "no outputs, execution counts or Jupyter-added metadata (run `make normalise`)",
    "cell-id": "every cell has an id, unique in its notebook",
    "start-cell": "the first code cell is the locked `grading.start()` cell, exactly",
    "grade-id": "every nbgrader cell has a grade id, unique in its notebook and not used by another assignment "
                "(the pre-flight tells a notebook of another assignment by its grade ids)",
    "points": "every graded cell has points > 0",
    "points-table": "the notebook's points cell lists every graded cell with its points, and its totals "
                    "equal the metadata",
    "test-cell": "every test cell starts with a one-line comment `# <grade_id>: <what it checks>`, then one "
                 "hidden region holding only `grading.judge(\"<grade_id>\")` (the check lives in "
                 "rlhf_lab.judging), then the visible checks",
    "cell-kind": "every cell is one of the course's kinds: locked text, locked given code, an answer "
                 "(solution region), a locked test, a written answer (graded markdown with a rubric) or a "
                 "free Predict cell",
    "task-points": "the points a task heading states (`### Task 1.1: ... (6 points)`, also `Tasks 2.8 to 2.12 "
                   "(5 points ...)`) equal the points of the graded cells below it, up to the next task heading "
                   "(headings in one cell count together)",
    "answer-read": "every answer cell is read by the hidden check of a test cell below it (the check's "
                   "`needs` reach the cell through the names it defines); an answer nothing reads cannot be "
                   "graded: make it given code or add a check",
}


@dataclass(frozen=True)
class Finding:
    """One violation of a lint rule."""

    notebook: str
    cell_id: str
    rule: str
    message: str

    def __str__(self) -> str:
        return f"{self.notebook} [{self.cell_id}] {self.rule}: {self.message}"


# ------------------------------------------------------------------------------------------------
# normalising


def normalise(nb):
    """The canonical form of a notebook: what Jupyter adds when running or saving it, removed.

    Returns a new notebook (the argument is not changed): no outputs, no execution counts, none of
    :data:`EXTRA_KEYS`; cell ids, sources and nbgrader metadata are kept exactly.
    """
    from nbstripout import strip_output

    out = copy.deepcopy(nb)
    return strip_output(out, keep_output=False, keep_count=False, keep_id=True,
                        extra_keys=list(EXTRA_KEYS), drop_empty_cells=False)


def normalised_text(nb) -> str:
    """The file text of :func:`normalise` (nbformat's own writer, as Jupyter writes notebooks)."""
    return nbformat.writes(normalise(nb)) + "\n"


def normalise_file(path: str | Path) -> bool:
    """Rewrite ``path`` in canonical form; returns True when the file changed."""
    path = Path(path)
    before = path.read_text(encoding="utf-8")
    after = normalised_text(nbformat.reads(before, as_version=4))
    if after != before:
        path.write_text(after, encoding="utf-8")
        return True
    return False


def pre_save_hook(model, path, contents_manager=None, **kwargs):
    """Jupyter server pre-save hook: save notebooks of ``source/`` and ``release/`` in canonical form.

    Set as ``c.ContentsManager.pre_save_hook`` by the course's instructor JupyterLab configuration.
    Other notebooks (a student's scratch work, ``autograded/``) are saved untouched.
    """
    if model.get("type") != "notebook" or not model.get("content"):
        return
    parts = Path(path).parts
    if not parts or parts[0] not in ("source", "release"):
        return
    nb = nbformat.from_dict(model["content"])
    model["content"] = normalise(nb)


# ------------------------------------------------------------------------------------------------
# pairs (jupytext)


def course_notebooks(root: Path, where: str = "source") -> list[Path]:
    """Every notebook under ``root/where``, sorted (checkpoints excluded)."""
    return sorted(p for p in (root / where).rglob("*.ipynb") if ".ipynb_checkpoints" not in p.parts)


def pair_path(root: Path, notebook: Path) -> Path:
    """``source/<a>/<nb>.ipynb`` -> ``content/<a>/<nb>.py`` (the jupytext.toml pairing)."""
    rel = notebook.relative_to(root / "source")
    return root / "content" / rel.with_suffix(".py")


def pair_text(root: Path, notebook: Path) -> str:
    """The py:percent text jupytext writes for ``notebook`` with the course's jupytext.toml."""
    import jupytext
    from jupytext.config import load_jupytext_configuration_file

    config = load_jupytext_configuration_file(str(root / "jupytext.toml"))
    nb = jupytext.read(notebook)
    return jupytext.writes(nb, fmt="py:percent", config=config)


def pair_diff(root: Path) -> list[str]:
    """Pairs that are missing or out of sync, and text files whose notebook is gone."""
    problems = []
    notebooks = course_notebooks(root)
    for nb in notebooks:
        py = pair_path(root, nb)
        rel = nb.relative_to(root)
        if not py.exists():
            problems.append(f"{rel}: its text pair {py.relative_to(root)} is missing")
        elif py.read_text(encoding="utf-8") != pair_text(root, nb):
            problems.append(f"{rel}: its text pair {py.relative_to(root)} is out of sync")
    wanted = {pair_path(root, nb) for nb in notebooks}
    for py in sorted((root / "content").rglob("*.py")) if (root / "content").is_dir() else []:
        if py not in wanted:
            problems.append(f"{py.relative_to(root)}: no notebook in source/ is paired with it")
    return problems


def write_pairs(root: Path) -> list[Path]:
    """(Re)write every text pair from its notebook; returns the files written."""
    written = []
    for nb in course_notebooks(root):
        py = pair_path(root, nb)
        text = pair_text(root, nb)
        if not py.exists() or py.read_text(encoding="utf-8") != text:
            py.parent.mkdir(parents=True, exist_ok=True)
            py.write_text(text, encoding="utf-8")
            written.append(py)
    return written


# ------------------------------------------------------------------------------------------------
# lint


def _nbg(cell) -> dict:
    return cell.get("metadata", {}).get("nbgrader", {}) or {}


def is_test_cell(cell) -> bool:
    m = _nbg(cell)
    return cell.cell_type == "code" and bool(m.get("grade")) and not m.get("solution")


def is_written_answer(cell) -> bool:
    m = _nbg(cell)
    return cell.cell_type == "markdown" and bool(m.get("grade")) and bool(m.get("solution"))


def is_predict_cell(cell) -> bool:
    return cell.cell_type == "markdown" and not _nbg(cell) and cell.source.lstrip().startswith("**Predict")


def graded_points(nb) -> dict[str, tuple[int, str]]:
    """``{grade_id: (points, "autograded" | "by hand")}`` of a notebook's graded cells."""
    out = {}
    for cell in nb.cells:
        m = _nbg(cell)
        if m.get("grade"):
            out[m.get("grade_id")] = (m.get("points"), "graded by hand" if cell.cell_type == "markdown" else "autograded")
    return out


_TABLE_ROW = re.compile(r"^\|\s*`([^`]+)`\s*\|\s*(\d+(?:\.\d+)?)\s*\|\s*([^|]+?)\s*\|\s*$")
_HERE = re.compile(r"This notebook: \*\*(\d+(?:\.\d+)?) points\*\*")
_WHOLE = re.compile(r"is worth \*\*(\d+) points\*\*: (\d+) autograded and (\d+) graded by hand")


def _points_cell(nb):
    for cell in nb.cells:
        if cell.cell_type == "markdown" and _HERE.search(cell.source):
            return cell
    return None


def _lint_points(name: str, nb, assignment_totals: tuple[float, float] | None) -> list[Finding]:
    found = []
    cell = _points_cell(nb)
    graded = graded_points(nb)
    if cell is None:
        if graded:
            found.append(Finding(name, "-", "points-table", "no points cell (`This notebook: **N points**` and a "
                                 "`| graded cell | points | how |` table)"))
        return found
    cid = cell.get("id", "?")
    rows = {}
    for line in cell.source.splitlines():
        m = _TABLE_ROW.match(line.strip())
        if m:
            rows[m.group(1)] = (float(m.group(2)), m.group(3))
    for gid, (points, how) in graded.items():
        if gid not in rows:
            found.append(Finding(name, cid, "points-table", f"graded cell {gid!r} ({points} points) is not in the table"))
        elif rows[gid][0] != float(points or 0):
            found.append(Finding(name, cid, "points-table",
                                 f"the table gives {gid!r} {rows[gid][0]:g} points, its metadata {points}"))
        elif rows[gid][1] != how:
            found.append(Finding(name, cid, "points-table", f"the table says {gid!r} is {rows[gid][1]!r}, it is {how!r}"))
    for gid in sorted(set(rows) - set(graded)):
        found.append(Finding(name, cid, "points-table", f"the table lists {gid!r}, which is not a graded cell"))
    here = float(_HERE.search(cell.source).group(1))
    total = float(sum(p or 0 for p, _ in graded.values()))
    if here != total:
        found.append(Finding(name, cid, "points-table", f"states {here:g} points for this notebook, the metadata "
                             f"adds up to {total:g}"))
    whole = _WHOLE.search(cell.source)
    if assignment_totals is not None:
        auto, manual = assignment_totals
        if whole is None:
            found.append(Finding(name, cid, "points-table", "does not state the assignment's total "
                                 "(`is worth **T points**: A autograded and M graded by hand`)"))
        elif [float(x) for x in whole.groups()] != [auto + manual, auto, manual]:
            found.append(Finding(name, cid, "points-table",
                                 f"states the assignment is worth {whole.group(1)} ({whole.group(2)} autograded, "
                                 f"{whole.group(3)} by hand); the metadata adds up to {auto + manual:g} "
                                 f"({auto:g} autograded, {manual:g} by hand)"))
    return found


def _lint_test_cell(name: str, cell) -> list[Finding]:
    gid = _nbg(cell).get("grade_id")
    cid = cell.get("id", "?")
    lines = cell.source.splitlines()
    problems = []
    if not lines or not re.match(rf"# {re.escape(str(gid))}: \S", lines[0]):
        problems.append(f"first line must be `# {gid}: <what it checks>`")
    if cell.source.count("### BEGIN HIDDEN TESTS") != 1 or cell.source.count("### END HIDDEN TESTS") != 1:
        problems.append("must have exactly one hidden region (### BEGIN/END HIDDEN TESTS)")
    elif len(lines) > 1 and lines[1].strip() != "### BEGIN HIDDEN TESTS":
        problems.append("the hidden region must follow the comment line directly (hidden checks decide first)")
    else:
        hidden = cell.source.split("### BEGIN HIDDEN TESTS\n", 1)[1].split("### END HIDDEN TESTS", 1)[0]
        if hidden.strip() != f'grading.judge("{gid}")':
            problems.append(f'the hidden region must be the one line grading.judge("{gid}"): write the check in '
                            "rlhf_lab.judging and register it under this grade id")
    return [Finding(name, cid, "test-cell", p) for p in problems]


def _lint_kind(name: str, cell) -> list[Finding]:
    m = _nbg(cell)
    cid = cell.get("id", "?")
    if is_predict_cell(cell):
        return []
    if not m:
        return [Finding(name, cid, "cell-kind", f"a {cell.cell_type} cell without nbgrader metadata that is not a "
                        "**Predict** cell (make it read-only text or code in the Create Assignment toolbar)")]
    if is_test_cell(cell):
        return [] if m.get("locked") else [Finding(name, cid, "cell-kind", "a test cell must be locked")]
    if is_written_answer(cell):
        bad = []
        if m.get("locked"):
            bad.append("a written answer must not be locked")
        if "### BEGIN SOLUTION" not in cell.source or "Rubric" not in cell.source:
            bad.append("a written answer holds its model answer and **Rubric** in a solution region")
        return [Finding(name, cid, "cell-kind", b) for b in bad]
    if m.get("solution"):
        bad = []
        if cell.cell_type != "code":
            bad.append("an ungraded markdown solution cell is not a course cell kind")
        elif "### BEGIN SOLUTION" not in cell.source or "### END SOLUTION" not in cell.source:
            bad.append("an answer cell needs a ### BEGIN/END SOLUTION region")
        if m.get("locked"):
            bad.append("an answer cell must not be locked")
        return [Finding(name, cid, "cell-kind", b) for b in bad]
    if not m.get("locked"):
        return [Finding(name, cid, "cell-kind", "text and given code must be read-only (locked)")]
    return []


def lint_notebook(name: str, nb, assignment_totals: tuple[float, float] | None = None,
                  graded: bool = True) -> list[Finding]:
    """Every rule of :data:`RULES` on one notebook (``graded=False``: only clean and cell-id)."""
    found = []
    ids = []
    for cell in nb.cells:
        cid = cell.get("id")
        if not cid:
            found.append(Finding(name, "?", "cell-id", "a cell has no id"))
        elif cid in ids:
            found.append(Finding(name, cid, "cell-id", "the id is used by another cell of this notebook"))
        ids.append(cid)
        if cell.cell_type == "code" and (cell.get("outputs") or cell.get("execution_count") is not None):
            found.append(Finding(name, cid or "?", "clean", "has outputs or an execution count"))
    if normalised_text(nb) != nbformat.writes(nb) + "\n" and not any(f.rule == "clean" for f in found):
        found.append(Finding(name, "-", "clean", "holds metadata Jupyter added (kernel language_info, widget state, "
                             "execution timings)"))
    if not graded:
        return found
    code = [c for c in nb.cells if c.cell_type == "code"]
    if not code or code[0].source != START_CELL or not _nbg(code[0]).get("locked") \
            or _nbg(code[0]).get("solution") or _nbg(code[0]).get("grade"):
        found.append(Finding(name, code[0].get("id", "?") if code else "-", "start-cell",
                             f"the first code cell must be exactly {START_CELL!r}, locked, not graded"))
    grade_ids = []
    for cell in nb.cells:
        m = _nbg(cell)
        if not m:
            continue
        cid = cell.get("id", "?")
        gid = m.get("grade_id")
        if not gid:
            found.append(Finding(name, cid, "grade-id", "nbgrader cell without a grade id"))
        elif gid in grade_ids:
            found.append(Finding(name, cid, "grade-id", f"grade id {gid!r} is used twice"))
        grade_ids.append(gid)
        if m.get("grade"):
            points = m.get("points")
            if not isinstance(points, (int, float)) or isinstance(points, bool) or points <= 0:
                found.append(Finding(name, cid, "points", f"graded cell has points {points!r}"))
        if is_test_cell(cell):
            found += _lint_test_cell(name, cell)
        found += _lint_kind(name, cell)
    for cell in nb.cells:
        if not _nbg(cell):
            found += _lint_kind(name, cell)
    found += _lint_points(name, nb, assignment_totals)
    found += _lint_answers_read(name, nb)
    found += _lint_task_points(name, nb)
    return found


_TASK_HEADING = re.compile(r"^#{1,6} .*?\bTasks? (\d[\d.]*)(?: to (\d[\d.]*))?\b[^(\n]*\((\d+(?:\.\d+)?) points?",
                           re.MULTILINE)


def _lint_task_points(name: str, nb) -> list[Finding]:
    """Each group of task headings (the headings of one markdown cell) states the points of the graded
    cells that follow it, up to the next cell with a task heading."""
    found, group = [], None  # group: [cell id, labels, stated points, points of the cells below]

    def close(g):
        if g is not None and g[2] != g[3]:
            found.append(Finding(name, g[0], "task-points", f"{' and '.join(g[1])} state(s) {g[2]:g} points; the "
                                 f"graded cells below add up to {g[3]:g}"))

    for cell in nb.cells:
        heads = list(_TASK_HEADING.finditer(cell.source)) if cell.cell_type == "markdown" else []
        if heads:
            close(group)
            labels = [f"Task {h.group(1)}" + (f" to {h.group(2)}" if h.group(2) else "") for h in heads]
            group = [cell.get("id", "?"), labels, float(sum(float(h.group(3)) for h in heads)), 0.0]
        if _nbg(cell).get("grade") and group is not None:
            group[3] += float(_nbg(cell).get("points") or 0)
    close(group)
    return found


def read_answer_cells(nb) -> set[int]:
    """Indices of the cells the hidden checks of ``nb``'s test cells read.

    A test cell's check (``rlhf_lab.judging.CHECKS[grade_id]``) asks for the functions and values in
    its ``needs``; the cells that provide them are
    (:func:`~rlhf_lab.instructor.grader.cell_names.needed_cells`) the cells above the test cell that
    bind a needed name, and, transitively, the names those cells read.
    """
    from rlhf_lab.judging import CHECKS

    from .grader.cell_names import needed_cells

    read: set[int] = set()
    for index, cell in enumerate(nb.cells):
        check = CHECKS.get(_nbg(cell).get("grade_id")) if is_test_cell(cell) else None
        for needed in (check.needs if check else ()):
            read.update(needed_cells(nb.cells, index, needed))
    return read


def _lint_answers_read(name: str, nb) -> list[Finding]:
    read = read_answer_cells(nb)
    found = []
    for index, cell in enumerate(nb.cells):
        m = _nbg(cell)
        if cell.cell_type == "code" and m.get("solution") and not m.get("grade") and index not in read:
            found.append(Finding(name, cell.get("id", "?"), "answer-read",
                                 f"no hidden check below reads the answer cell {m.get('grade_id')!r}"))
    return found


def assignment_totals(notebooks: list) -> tuple[float, float]:
    """(autograded, by hand) points of an assignment's notebooks."""
    auto = manual = 0.0
    for nb in notebooks:
        for points, how in graded_points(nb).values():
            if how == "autograded":
                auto += points or 0
            else:
                manual += points or 0
    return auto, manual


def lint(root: Path) -> list[Finding]:
    """Lint every notebook of ``root/source`` (assignments without graded cells: clean and ids only)."""
    found = []
    assignments: dict[str, dict] = {}
    for adir in sorted(p for p in (root / "source").iterdir() if p.is_dir()):
        paths = course_notebooks(root / "source", adir.name)
        nbs = {p: nbformat.read(p, as_version=4) for p in paths}
        totals = assignment_totals(list(nbs.values()))
        graded = sum(totals) > 0
        for path, nb in nbs.items():
            found += lint_notebook(str(path.relative_to(root)), nb, totals if graded else None, graded=graded)
        assignments[adir.name] = nbs
    found += _shared_grade_ids(root, assignments)
    return found


def _shared_grade_ids(root: Path, assignments: dict) -> list[Finding]:
    """Grade ids that two assignments both use."""
    owner: dict[str, str] = {}
    found = []
    for name, nbs in assignments.items():
        for path, nb in nbs.items():
            for cell in nb.cells:
                gid = _nbg(cell).get("grade_id")
                if not gid:
                    continue
                if owner.setdefault(gid, name) != name:
                    found.append(Finding(str(path.relative_to(root)), cell.get("id", "?"), "grade-id",
                                         f"grade id {gid!r} is also used by the assignment {owner[gid]!r}"))
    return found


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description="Lint, pair and normalise the course's source notebooks.")
    parser.add_argument("command", choices=("lint", "pairs", "normalise"))
    parser.add_argument("--check", action="store_true", help="pairs: only check, write nothing")
    parser.add_argument("--root", type=Path, default=Path(__file__).resolve().parents[3])
    args = parser.parse_args(argv)
    root = args.root.resolve()
    if args.command == "lint":
        found = lint(root)
        for f in found:
            print(f)
        print(f"{len(found)} problem(s) in source/" if found else "source/ notebooks follow every rule")
        return 1 if found else 0
    if args.command == "pairs":
        if args.check:
            problems = pair_diff(root)
            for p in problems:
                print(p)
            print("run `make pairs`" if problems else "every notebook and its content/ text pair agree")
            return 1 if problems else 0
        for py in write_pairs(root):
            print(f"wrote {py.relative_to(root)}")
        return 0
    changed = [p for where in ("source", "release") for p in course_notebooks(root, where) if normalise_file(p)]
    for p in changed:
        print(f"normalised {p.relative_to(root)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
