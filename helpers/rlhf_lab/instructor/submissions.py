"""Build student submissions from the release: correct, unchanged, one per classic mistake, noisy.

A submission is a *release* notebook (with nbgrader's checksums and locked cells intact) in which
only the solution cells were edited, exactly as a student would. Solutions are taken from
``source/`` by matching nbgrader ``grade_id``; mistake recipes from ``examples/mistakes/*.py``
replace one solution cell each. Everything here is deterministic (same inputs -> same bytes), so
``tools/make_examples.py`` can regenerate ``examples/submissions/`` and a test can prove the
committed copy is in sync.

Mistake recipe files: ``examples/mistakes/<assignment>.py`` define ``MISTAKES`` (or ``RECIPES``), a
dict ``name -> recipe``; a recipe is a dict (or object with attributes) with keys

* ``notebook``: notebook name (with or without ``.ipynb``) inside the assignment,
* ``grade_id`` (or ``cell``): the solution cell to replace,
* ``code`` (or ``replacement``/``source``): the new source of that cell,
* ``fails`` (or ``must_fail``/``failing``): grade ids of the test cells it must fail, or a dict
  ``grade_id -> substring of the failure message the student must see there`` (or ``None``),
* optional ``assignment`` (defaults to the file's stem), ``description``, ``message`` (the
  failure message of the first test in a list-style ``fails``) and ``classic``: a recipe with
  ``classic: False`` is an extra probe of the hidden tests, exercised by the notebook's own tests,
  and is not bundled (like a file's ``EXTRA_MISTAKES``, which is not read at all).
"""
from __future__ import annotations

import ast
import copy
import dataclasses
import importlib.util
import re
from pathlib import Path
from typing import Mapping

import nbformat

from .pipeline import assignments, course_root, graded_assignments

BEGIN_SOLUTION = "### BEGIN SOLUTION"
END_SOLUTION = "### END SOLUTION"
#: First names for generated student ids, in order: ada_correct, ben_unchanged, cy_<mistake>, ...
NAMES = ("ada", "ben", "cy", "dee", "eve", "fay", "gus", "hal", "ivy", "jo", "kit", "lou", "max",
         "ned", "oli", "pam", "quin", "rex", "sue", "tom", "uma", "vic", "wes", "xia", "yan", "zed")
CORRECT = "ada_correct"
UNCHANGED = "ben_unchanged"
NOISY_SUFFIX = "noisy_warnings"


def nbgrader_md(cell) -> dict:
    return cell.get("metadata", {}).get("nbgrader", {}) or {}


def is_solution(cell) -> bool:
    return bool(nbgrader_md(cell).get("solution"))


def grade_id(cell) -> str | None:
    return nbgrader_md(cell).get("grade_id")


def solution_text(source_cell) -> str:
    """What a student who solved the cell would have typed: the source minus nbgrader's markers.

    For a code cell with ``### BEGIN SOLUTION``/``### END SOLUTION`` the marker lines are dropped
    and everything else (given lines around the region included) is kept; a cell without markers
    (typically a written answer) is its whole source. Mark-scheme regions never reach a student.
    """
    lines = source_cell.source.split("\n")
    out, in_scheme = [], False
    for line in lines:
        if "BEGIN MARK SCHEME" in line:
            in_scheme = True
            continue
        if "END MARK SCHEME" in line:
            in_scheme = False
            continue
        if in_scheme or line.strip() in (BEGIN_SOLUTION, END_SOLUTION):
            continue
        out.append(line)
    return "\n".join(out).strip("\n")


def _cells_by_id(nb) -> dict:
    return {grade_id(c): c for c in nb.cells if grade_id(c)}


def correct_notebook(release_nb, source_nb):
    """A copy of ``release_nb`` with every solution cell filled from ``source_nb`` (matched by grade_id)."""
    nb = copy.deepcopy(release_nb)
    src = _cells_by_id(source_nb)
    for cell in nb.cells:
        if is_solution(cell):
            gid = grade_id(cell)
            if gid not in src:
                raise KeyError(f"solution cell {gid!r} of the release has no counterpart in source/")
            cell.source = solution_text(src[gid])
    return nb


def replace_cell(nb, gid: str, code: str):
    """A copy of ``nb`` whose cell ``gid`` now has source ``code`` (metadata untouched)."""
    nb = copy.deepcopy(nb)
    for cell in nb.cells:
        if grade_id(cell) == gid:
            cell.source = code
            return nb
    raise KeyError(f"no cell with grade_id {gid!r}")


# A harmless stderr source, appended after the functions a student defines: every call of the
# student's function first emits a Python UserWarning, a real JAX warning (float64 requested while
# x64 is disabled) and a raw write to file descriptor 2 (what C++ logging of XLA does). All three
# appear on the test cell's stderr while the answer itself stays correct.
NOISE_WRAPPER = '''

# --- example submission "noisy warnings": harmless stderr on every call (for the grader's test) ---
import functools as _noisy_functools
import os as _noisy_os
import warnings as _noisy_warnings


def _noisy(fn):
    @_noisy_functools.wraps(fn)
    def wrapper(*args, **kwargs):
        with _noisy_warnings.catch_warnings():
            _noisy_warnings.simplefilter("always")
            _noisy_warnings.warn("a harmless warning printed by a student helper", UserWarning)
            import jax.numpy as _noisy_jnp
            _noisy_jnp.zeros(1, dtype="float64")  # JAX: UserWarning, float64 not enabled
        _noisy_os.write(2, b"W0000 00:00:00.000000 1 noisy.cc:1] harmless native log line\\n")
        return fn(*args, **kwargs)
    return wrapper
'''


def defined_functions(code: str) -> list[str]:
    """Names of the top-level ``def`` statements in ``code`` (empty if it does not parse)."""
    try:
        tree = ast.parse(code)
    except SyntaxError:
        return []
    return [n.name for n in tree.body if isinstance(n, (ast.FunctionDef,))]


def noisy_notebook(correct_nb):
    """The correct submission whose student-defined functions write harmless stderr on each call."""
    nb = copy.deepcopy(correct_nb)
    for cell in nb.cells:
        if cell.cell_type == "code" and is_solution(cell):
            names = defined_functions(cell.source)
            if names:
                cell.source = cell.source + NOISE_WRAPPER + "".join(f"{n} = _noisy({n})\n" for n in names)
    return nb


@dataclasses.dataclass(frozen=True)
class Mistake:  # (frozen; ``messages`` is a plain dict, not used for hashing)
    """One classic mistake: replace solution cell ``grade_id`` of ``notebook`` with ``code``."""

    name: str
    assignment: str
    notebook: str
    grade_id: str
    code: str
    fails: tuple
    description: str = ""
    messages: dict = dataclasses.field(default_factory=dict)  # {test grade_id: substring of its failure message}


def _get(recipe, *keys, default=None):
    for key in keys:
        if isinstance(recipe, Mapping) and key in recipe:
            return recipe[key]
        if not isinstance(recipe, Mapping) and hasattr(recipe, key):
            return getattr(recipe, key)
    return default


def load_mistakes(path: str | Path) -> list[Mistake]:
    """Read the recipes of one ``examples/mistakes/<assignment>.py`` file, in definition order."""
    path = Path(path)
    spec = importlib.util.spec_from_file_location(f"_mistakes_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    recipes = getattr(module, "MISTAKES", None) or getattr(module, "RECIPES", None)
    if not isinstance(recipes, Mapping):
        raise ValueError(f"{path} must define a dict MISTAKES (name -> recipe)")
    out = []
    for name, r in recipes.items():
        if _get(r, "classic", default=True) is False:
            continue  # an extra probe of the hidden tests, exercised by the notebook's own tests
        nb = str(_get(r, "notebook"))
        fails = _get(r, "fails", "must_fail", "failing", "fail", default=())
        if isinstance(fails, str):
            fails = (fails,)
        if isinstance(fails, Mapping):  # {test grade_id: message substring or None}
            messages = {k: str(v) for k, v in fails.items() if v}
        else:
            message = _get(r, "message", default="")
            messages = {tuple(fails)[0]: str(message)} if message and fails else {}
        m = Mistake(
            name=str(name),
            assignment=str(_get(r, "assignment", default=path.stem)),
            notebook=nb[:-6] if nb.endswith(".ipynb") else nb,
            grade_id=str(_get(r, "grade_id", "cell", "solution", "solution_id")),
            code=str(_get(r, "code", "replacement", "source")),
            fails=tuple(fails),
            description=str(_get(r, "description", "doc", default="") or ""),
            messages=messages,
        )
        if not m.fails:
            raise ValueError(f"{path}: recipe {name!r} names no test cell it must fail")
        out.append(m)
    return out


def all_mistakes(root=None) -> list[Mistake]:
    """Every recipe of ``examples/mistakes/*.py`` (files in name order, recipes in definition order)."""
    folder = course_root(root) / "examples" / "mistakes"
    out = []
    for path in sorted(folder.glob("*.py")) if folder.is_dir() else []:
        if path.name.startswith("_"):
            continue
        out += load_mistakes(path)
    return out


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "_", text.lower()).strip("_")


def mistake_students(mistakes: list[Mistake]) -> dict:
    """``{student_id: Mistake}``: ``cy_<name>``, ``dee_<name>``, ... (first names cycle with a number)."""
    out = {}
    seen = set()
    for i, m in enumerate(mistakes):
        base = NAMES[(i + 2) % len(NAMES)] + ("" if i + 2 < len(NAMES) else str((i + 2) // len(NAMES)))
        slug = _slug(m.name)
        if slug in seen:
            slug = f"{slug}_{_slug(m.assignment)}"
        seen.add(slug)
        out[f"{base}_{slug}"] = m
    return out


def noisy_student(n_mistakes: int) -> str:
    i = n_mistakes + 2
    return NAMES[i % len(NAMES)] + ("" if i < len(NAMES) else str(i // len(NAMES))) + "_" + NOISY_SUFFIX


def noisy_assignments(names: list, root=None) -> list:
    """The assignment the noisy student submits: the one with the fewest notebooks (then by name).

    One assignment is enough to prove the grader ignores harmless stderr (the mechanism does not
    depend on the notebook) and keeps the bundled class quick to grade.
    """
    root = course_root(root)
    if not names:
        return []
    return [min(names, key=lambda a: (len(list((root / "release" / a).glob("*.ipynb"))), a))]


def _read(path: Path):
    return nbformat.read(path, as_version=4)


def dumps(nb) -> str:
    """Deterministic notebook text (nbformat's sorted-key JSON, trailing newline)."""
    return nbformat.writes(nb) + "\n"


@dataclasses.dataclass
class ExampleClass:
    """The bundled example class: files to write and who is who."""

    files: dict  # {relative path under examples/submissions: text}
    mistakes: dict  # {student_id: Mistake}
    correct: str
    unchanged: str
    noisy: str


def correct_submission(assignment: str, root=None) -> dict:
    """``{notebook_name: NotebookNode}``: the release of ``assignment`` with every solution filled in."""
    root = course_root(root)
    out = {}
    for rel in sorted((root / "release" / assignment).glob("*.ipynb")):
        src = root / "source" / assignment / rel.name
        out[rel.stem] = correct_notebook(_read(rel), _read(src))
    return out


def release_submission(assignment: str, root=None) -> dict:
    """``{notebook_name: NotebookNode}``: the release of ``assignment`` exactly as handed out."""
    root = course_root(root)
    return {p.stem: _read(p) for p in sorted((root / "release" / assignment).glob("*.ipynb"))}


def build_examples(root=None) -> ExampleClass:
    """Compute every example submission from ``release/``, ``source/`` and ``examples/mistakes/``.

    * ``ada_correct``: every graded assignment, every solution filled in;
    * ``ben_unchanged``: every graded assignment exactly as released;
    * one student per mistake recipe: the recipe's assignment, correct except that one cell;
    * ``<name>_noisy_warnings``: one assignment (:func:`noisy_assignments`), correct, but each
      student function writes harmless warnings to stderr when the tests call it (must still get
      full points).
    """
    root = course_root(root)
    names = [a for a in graded_assignments(root) if (root / "release" / a).is_dir()]
    correct = {a: correct_submission(a, root) for a in names}
    files = {}

    def put(student, assignment, nbs):
        for nb_name, nb in nbs.items():
            files[f"{student}/{assignment}/{nb_name}.ipynb"] = dumps(nb)

    for a in names:
        put(CORRECT, a, correct[a])
        put(UNCHANGED, a, release_submission(a, root))
    mistakes = mistake_students(all_mistakes(root))
    for sid, m in mistakes.items():
        if m.assignment not in correct:
            raise ValueError(f"mistake {m.name!r}: assignment {m.assignment!r} is not in release/")
        if m.notebook not in correct[m.assignment]:
            raise ValueError(f"mistake {m.name!r}: notebook {m.notebook!r} is not in release/{m.assignment}")
        nbs = dict(correct[m.assignment])
        target = nbs[m.notebook]
        cell = _cells_by_id(target).get(m.grade_id)
        if cell is None or not is_solution(cell):
            raise ValueError(f"mistake {m.name!r}: {m.notebook}/{m.grade_id} is not a solution cell")
        nbs[m.notebook] = replace_cell(target, m.grade_id, m.code)
        put(sid, m.assignment, nbs)
    noisy = noisy_student(len(mistakes))
    for a in noisy_assignments(names, root):
        put(noisy, a, {k: noisy_notebook(v) for k, v in correct[a].items()})
    return ExampleClass(files, mistakes, CORRECT, UNCHANGED, noisy)


def write_examples(root=None, dest=None) -> ExampleClass:
    """Write :func:`build_examples` to ``dest`` (default ``<root>/examples/submissions``), replacing it."""
    import shutil

    root = course_root(root)
    dest = Path(dest) if dest is not None else root / "examples" / "submissions"
    ex = build_examples(root)
    if dest.exists():
        shutil.rmtree(dest)
    for rel, text in sorted(ex.files.items()):
        path = dest / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    return ex


def examples_diff(root=None, dest=None) -> list[str]:
    """Relative paths that differ between the committed examples and a fresh :func:`build_examples`."""
    root = course_root(root)
    dest = Path(dest) if dest is not None else root / "examples" / "submissions"
    want = build_examples(root).files
    have = {str(p.relative_to(dest)): p.read_text(encoding="utf-8")
            for p in dest.rglob("*.ipynb")} if dest.is_dir() else {}
    return sorted(k for k in set(want) | set(have) if want.get(k) != have.get(k))


__all__ = [
    "CORRECT", "UNCHANGED", "ExampleClass", "Mistake", "all_mistakes", "build_examples",
    "correct_notebook", "correct_submission", "examples_diff", "load_mistakes", "mistake_students",
    "noisy_notebook", "release_submission", "replace_cell", "solution_text", "write_examples",
    "assignments",
]
