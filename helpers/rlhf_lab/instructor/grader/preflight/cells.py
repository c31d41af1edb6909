"""One notebook's cells against the release's grade ids: is it this notebook, are its cells all there.

* ``other-assignment`` (block): no grade id of the release, the ids of another notebook; nothing
  else is checked, the notebook is quarantined (never executed) and scores 0.
* ``kernel-name``, ``kernel-language`` (warn): nbgrader grades with the release's kernel.
* ``duplicate-answer``, ``duplicate-cell`` (warn): a grade id more than once (repaired:
  :mod:`.repair`).
* ``deleted-test`` (block: that test), ``deleted-given`` (block: the tests after it),
  ``deleted-answer`` (warn).
* ``reordered`` (warn): graded in the submitted order.
* ``code-before-start`` / ``magic-before-start`` (warn): code above the locked first code cell
  (only display magics: harmless).

May import :mod:`.findings` and :mod:`.release`.
"""
from __future__ import annotations

from .findings import BLOCK, WARN, Finding
from .release import NotebookSpec, best_other_assignment, cell_source, nbg, start_spec

#: Line magics that only change how output is shown (one above the first locked cell is harmless).
DISPLAY_MAGICS = ("matplotlib", "config InlineBackend", "precision", "load_ext autoreload", "autoreload",
                  "xmode")


def only_harmless_magics(source: str) -> bool:
    lines = [ln.strip() for ln in source.splitlines() if ln.strip() and not ln.strip().startswith("#")]
    return bool(lines) and all(ln.startswith("%") and not ln.startswith("%%")
                               and ln[1:].startswith(DISPLAY_MAGICS) for ln in lines)


def cell_findings(F, assignment: str, name: str, spec: NotebookSpec, nb, others: dict) -> tuple[list[Finding], bool]:
    """``(findings, is another assignment's notebook)`` for the submitted notebook ``nb`` named
    ``name``; ``F`` builds a :class:`.Finding` of this notebook."""
    out: list[Finding] = []
    everything = tuple((name, g) for g in spec.autograded_ids)
    sub_ids = [(i, nbg(c).get("grade_id")) for i, c in enumerate(nb.cells) if nbg(c).get("grade_id")]
    ids_only = [g for _, g in sub_ids]
    spec_ids = set(spec.ids)
    # the whole notebook from another assignment under an expected name
    if sub_ids and not (set(ids_only) & spec_ids):
        other = best_other_assignment(set(ids_only), others)
        what = f"the assignment {other[0]} ({other[1]})" if other else "a different notebook"
        out.append(F(cell=None, grade_id=None, line=None, code="other-assignment", severity=BLOCK,
                     withhold=everything,
                     message=f"{name} contains {what}, not {assignment}/{name}; it was not run and "
                             "scores 0"))
        return out, True
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
    # duplicates: the pre-flight repairs both kinds (see repair.repair_notebook)
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
    start = start_spec(spec)
    if start is not None and start.grade_id in seen:
        start_at = seen[start.grade_id]
        early = [i for i, c in enumerate(nb.cells[:start_at]) if c.cell_type == "code" and cell_source(c).strip()]
        if early:
            harmless = all(only_harmless_magics(cell_source(nb.cells[i])) for i in early)
            out.append(F(cell=early[0], grade_id=nbg(nb.cells[early[0]]).get("grade_id"), line=None,
                         code="magic-before-start" if harmless else "code-before-start", severity=WARN,
                         message=(f"a display magic ({cell_source(nb.cells[early[0]]).strip().splitlines()[0][:60]}) "
                                  f"runs before the locked first cell {start.grade_id!r}; harmless"
                                  if harmless else
                                  f"code runs before the locked first cell {start.grade_id!r}; it runs in "
                                  "the student's own sandboxed kernel and the judge grades the outputs")))
    return out, False
