"""One notebook's locked and graded cells changed: their text, type, points or nbgrader metadata.

* ``unknown-cell`` (warn): a grade id the release does not have (an ordinary cell for nbgrader).
* ``cell-type`` (warn): saved as another cell type (repaired: :mod:`.repair`).
* ``edited-test``, ``edited-start``, ``edited-given`` (warn): a locked cell's text changed;
  nbgrader runs / restores the original.
* ``points-changed`` (warn): nbgrader uses the release's points.
* ``edited-metadata`` (warn): a locked cell's nbgrader metadata changed (repaired: nbgrader would
  refuse its checksum).

May import :mod:`.findings` and :mod:`.release`.
"""
from __future__ import annotations

from .findings import WARN, Finding
from .release import NotebookSpec, cell_source, nbg, norm, start_spec


def locked_cell_findings(F, name: str, spec: NotebookSpec, nb) -> list[Finding]:
    """The findings of the cells of ``nb`` (named ``name``) that carry a grade id; ``F`` builds a
    :class:`.Finding` of this notebook."""
    out: list[Finding] = []
    start = start_spec(spec)
    for i, c in enumerate(nb.cells):
        gid = nbg(c).get("grade_id")
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
        md = nbg(c)
        if cspec.kind in ("test", "given") and norm(cell_source(c)) != norm(cspec.source):
            if cspec.kind == "test":
                out.append(F(cell=i, grade_id=gid, line=None, code="edited-test", severity=WARN,
                             message=f"the locked test cell {gid!r} was edited; nbgrader ran the original"))
            elif start is not None and gid == start.grade_id:
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
    return out
