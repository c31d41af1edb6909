"""Repairs of what nbgrader would refuse or misgrade in a notebook (its findings: :mod:`.cells`,
:mod:`.locked`): duplicated locked or answer cells, cells saved as another type, edited locked
metadata. :func:`repair_notebook` returns a repaired copy; :mod:`.quarantine` writes it.
Standard library and :mod:`.release` only (notebooks are read and copied as nbformat nodes).
"""
from __future__ import annotations

import copy

from .release import NotebookSpec, nbg


def repair_notebook(spec: NotebookSpec, nb):
    """``(notebook nbgrader can grade, finding codes repaired)``: what nbgrader would refuse, fixed.

    * a locked cell (given or test) that appears more than once: the first copy is kept, the
      others dropped (nbgrader refuses a notebook with a duplicated grade id, so without this the
      whole notebook would score 0);
    * an answer cell that appears more than once: the last copy keeps the nbgrader metadata (it is
      the one whose definitions the kernel keeps), the earlier copies stay as plain code cells;
    * a cell saved with another type (markdown or raw instead of code, or the reverse): its type is
      restored from the release, its text kept.
    """
    nb = copy.deepcopy(nb)
    repairs: set = set()
    last = {}
    for i, c in enumerate(nb.cells):
        gid = nbg(c).get("grade_id")
        if gid:
            last[gid] = i
    keep, seen = [], set()
    for i, c in enumerate(nb.cells):
        gid = nbg(c).get("grade_id")
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
                c = with_type(c, "code")
            repairs.add("duplicate-answer")
        elif cspec is not None and c.cell_type != cspec.cell_type:
            c = with_type(c, cspec.cell_type)
            repairs.add("cell-type")
        if cspec is not None and cspec.kind in ("given", "test") and cspec.nbgrader and \
                nbg(c) != cspec.nbgrader:
            c = copy.deepcopy(c)
            c.metadata["nbgrader"] = copy.deepcopy(cspec.nbgrader)
            repairs.add("edited-metadata")
        if gid:
            seen.add(gid)
        keep.append(c)
    nb.cells = keep
    return nb, repairs


def with_type(cell, cell_type: str):
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

