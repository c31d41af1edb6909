"""Answer code reported for review: copies of library functions, rebinding and introspection.

Nothing a student cell does inside its kernel can change a grade (the judge decides, the kernel is
sandboxed), so these read what the code does only to report it:

* ``library-copy`` (warn): an answer function that copies library code the notebook asks students
  to write and does not give: equal to it up to names, comments, docstrings and formatting, with
  evidence beyond what a correct answer of that form shares (the library's docstring or comments,
  or a long body that is no model answer's; :func:`..library_build.suspicious_copies`);
* ``rebinding`` / ``introspection`` (block): a statement in an answer or added cell that rebinds an
  attribute of JAX, NumPy, builtins or the course library, or ``sys.modules``, or reads frames,
  the garbage collector, tracing or ``ctypes`` (:mod:`..rebinding`); the test cells at or below it
  are withheld for review; at most :data:`MAX_REBINDING_FINDINGS` per notebook, then one summing
  up the rest.

Text only: nothing runs. May import :mod:`..library_build` and :mod:`..rebinding` (inside the
functions: importing this module stays cheap), :mod:`.findings` and :mod:`.release`.
"""
from __future__ import annotations

from .findings import BLOCK, WARN, Finding
from .release import NotebookSpec, cell_source, nbg


def library_copy_findings(F, nb, assignment: str | None = None, name: str | None = None,
                          spec: NotebookSpec | None = None, root=None) -> list[Finding]:
    """``library-copy`` findings of ``nb``; ``F`` builds a :class:`.Finding` of this notebook.

    ``assignment`` / ``name`` (the notebook's file name), ``spec`` (its release) and ``root`` (the
    course) say what the notebook gives and asks (:func:`library_copies`)."""
    return [F(cell=None, grade_id=copy_.cell, line=copy_.line, code="library-copy", severity=WARN,
              message=f"{copy_}; reported for review (the answer is judged on its outputs)")
            for copy_ in library_copies(nb, assignment, name, spec, root)]


_INDEX: list = []  # [the installed library's ReferenceIndex], built once per process
#: (course root, assignment, notebook) -> what :func:`library_copies` reads of its release and source
_CONTEXT: dict = {}


def _context(assignment, name, spec, root) -> dict:
    """What the notebook gives and its model answers: ``key``, ``given`` (library names its given
    code uses), ``given_text`` (every release cell's text, and the source notebook's when the
    course has it) and ``model`` (:func:`..library_build.model_forms` of the source notebook)."""
    from pathlib import Path

    from .. import library_build as lb

    ident = (str(root), assignment, name)
    if ident in _CONTEXT:
        return _CONTEXT[ident]
    out: dict = {"key": lb.notebook_key(assignment, name) if assignment and name else None}
    texts = []
    if spec is not None:
        given_cells = [{"cell_type": c.cell_type, "source": c.source, "metadata": {}}
                       for c in spec.cells if c.kind == "given"]
        out["given"] = lb.given_names({"cells": given_cells})
        texts += [c.source for c in spec.cells]
    source = Path(root) / "source" / assignment / name if root and assignment and name else None
    if source is not None and source.is_file():
        out["model"] = lb.model_forms(source)
        texts.append(lb.notebook_text(source))
    if spec is not None or texts:
        out["given_text"] = "\n".join(texts)
    _CONTEXT[ident] = out
    return out


def library_copies(nb, assignment: str | None = None, name: str | None = None, spec: NotebookSpec | None = None,
                   root=None) -> list:
    """Answer-cell functions that copy library code the notebook's students must write (text only;
    nothing runs): :func:`rlhf_lab.instructor.grader.library_build.suspicious_copies`, with the
    library read once, the notebook's given code and text read from its release ``spec`` and the
    model answers from ``<root>/source/<assignment>/<name>`` when the course has it (a model
    answer's form is never evidence of a copy). Without them the notebook's own non-answer cells
    are what it gives and every function some notebook asks for is in scope."""
    from .. import library_build as lb

    try:
        if not _INDEX:
            _INDEX.append(lb.ReferenceIndex())
        return lb.suspicious_copies(nb, refs=_INDEX[0], **_context(assignment, name, spec, root))
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


def rebinding_findings(F, name: str, spec: NotebookSpec, nb) -> list:
    """``rebinding`` / ``introspection`` findings of one notebook (:func:`..rebinding.scan_cells`).

    Cells read: every code cell except the release's locked cells (given and test cells, matched by
    grade id: nbgrader runs the release's text for those, so that text is what is read for the
    names they import, and nothing in them is reported). Each hit withholds the test cells at or
    below its cell in the submitted notebook. ``F`` builds a :class:`Finding` of this notebook."""
    from .. import rebinding

    try:
        locked = {c.grade_id: c for c in spec.cells if c.kind in ("given", "test")}
        sources, scanned, tests_at = [], set(), {}
        for i, cell in enumerate(nb.cells):
            gid = nbg(cell).get("grade_id")
            cspec = spec.by_id(gid) if gid else None
            if cspec is not None and cspec.kind == "test":
                tests_at.setdefault(gid, i)
            if gid in locked:
                sources.append(locked[gid].source if locked[gid].cell_type == "code" else "")
                continue
            # an answer cell saved as another type is restored to code by the repair and runs
            is_code = (cspec.cell_type if cspec is not None else cell.get("cell_type")) == "code"
            sources.append(cell_source(cell) if is_code else "")
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
        out.append(F(cell=i, grade_id=nbg(nb.cells[i]).get("grade_id"), line=hit.line, code=code,
                     severity=BLOCK, withhold=withheld(i), message=message))
    rest = hits[MAX_REBINDING_FINDINGS:]
    if rest:
        i, hit = rest[0]
        cells = ", ".join(str(c) for c in dict.fromkeys(c for c, _ in rest))
        only_introspection = all(h.kind != rebinding.REBIND for _, h in rest)
        out.append(F(cell=i, grade_id=nbg(nb.cells[i]).get("grade_id"), line=hit.line,
                     code="introspection" if only_introspection else "rebinding", severity=BLOCK,
                     withhold=withheld(i),
                     message=f"{len(rest)} more statement(s) like these (in cell(s) {cells}) are not listed one by "
                             f"one; {_INTROSPECTION_WHY if only_introspection else _REBINDING_WHY}"))
    return out
