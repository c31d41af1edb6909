"""Which notebooks were handed in, against the release's list.

* ``invalid-notebook`` (block): not UTF-8, not JSON, not a valid nbformat 4 notebook, or larger than
  :data:`.quarantine.MAX_NOTEBOOK_BYTES` (:func:`read_notebook`); moved to quarantine so nbgrader
  grades the student's other notebooks; its autograded cells score 0.
* ``renamed-notebook`` (block): an unknown notebook whose grade ids match a missing expected one.
* ``unknown-notebook`` (warn): a notebook that is not part of the assignment (named when it belongs
  to another one: :func:`.release.best_other_assignment`).
* ``missing-notebook`` (block): an expected notebook not submitted.

May import :mod:`..safe_files`, nbformat, :mod:`.findings`, :mod:`.release` and :mod:`.quarantine`.
"""
from __future__ import annotations

import json
from pathlib import Path

import nbformat

from .. import safe_files
from .findings import BLOCK, WARN, Finding
from .quarantine import MAX_NOTEBOOK_BYTES
from .release import best_other_assignment, nbg


def notebook_set_findings(F, assignment: str, specs: dict, others: dict, present: dict,
                          move) -> tuple[list[Finding], dict]:
    """``(findings, {name: parsed notebook})`` for the top-level notebooks ``present`` ({name:
    path}); an unreadable one is moved out (``move(finding, path)``). ``F`` builds a
    :class:`.Finding` of this student."""
    out: list[Finding] = []
    parsed = {}
    for name, path in sorted(present.items()):
        nb, problem = read_notebook(path)
        if problem:
            spec = specs.get(name)
            wh = tuple((name, g) for g in spec.autograded_ids) if spec else ()
            out.append(move(F(
                notebook=name, cell=None, grade_id=None, line=None, code="invalid-notebook", severity=BLOCK,
                withhold=wh, message=f"{name} is not a valid notebook ({problem}); it cannot be run or graded, "
                                     "so it scores 0; the student's other notebooks are graded"), path))
            continue
        parsed[name] = nb
    expected = set(specs)
    missing = sorted(expected - set(parsed) - {f.notebook for f in out if f.code == "invalid-notebook"})
    unknown = sorted(set(parsed) - expected)
    renamed_to = {}
    for name in unknown:
        ids = {nbg(c).get("grade_id") for c in parsed[name].cells if nbg(c).get("grade_id")}
        match = max(missing, key=lambda m: len(ids & set(specs[m].ids)), default=None)
        if match and len(ids & set(specs[match].ids)) >= max(1, len(specs[match].ids) // 2):
            renamed_to[match] = name
            out.append(F(notebook=name, cell=None, grade_id=None, line=None, code="renamed-notebook",
                         severity=BLOCK, withhold=tuple((match, g) for g in specs[match].autograded_ids),
                         message=f"{name} looks like {match} under another name; nbgrader grades only "
                                 f"{match}, which is missing, so it scores 0 (rename the file to {match} and "
                                 "grade again if the instructor accepts it)"))
        else:
            other = best_other_assignment(ids, others)
            what = f" (it belongs to the assignment {other[0]})" if other else ""
            out.append(F(notebook=name, cell=None, grade_id=None, line=None, code="unknown-notebook",
                         severity=WARN, message=f"{name} is not a notebook of {assignment}{what}; "
                                                "nbgrader ignores it"))
    for name in missing:
        if name in renamed_to:
            continue
        out.append(F(notebook=name, cell=None, grade_id=None, line=None, code="missing-notebook",
                     severity=BLOCK, withhold=tuple((name, g) for g in specs[name].autograded_ids),
                     message=f"{name} was not submitted; it scores 0"))
    return out, parsed


def read_notebook(path: Path):
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
