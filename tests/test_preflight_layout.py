"""The pre-flight checker split by finding kind (``instructor/grader/preflight/``), with its callers kept.

* every module of the subpackage says in its docstring what it finds or does and what it may
  import, and imports only what that says (read from the source with the import-graph reader);
* each finding code is produced by exactly one module of the subpackage (the seams are the kinds
  of finding, not a line count);
* ``integrity`` still offers every name its callers use (the pipeline, the nbgrader hooks, the
  demo, the hostile fixtures and the tests), so no caller had to change.
"""
from __future__ import annotations

import ast
import re
from pathlib import Path

from test_import_graph import graph

PKG = "rlhf_lab.instructor.grader.preflight"
FOLDER = Path(__file__).resolve().parents[1] / "helpers" / "rlhf_lab" / "instructor" / "grader" / "preflight"

#: module -> the modules of the subpackage it may import (the docstrings say the same in words).
ALLOWED = {
    "findings": set(),
    "release": set(),
    "names": {"findings"},
    "quarantine": {"findings"},
    "files": {"findings", "names"},
    "notebooks": {"findings", "release", "quarantine"},
    "cells": {"findings", "release"},
    "locked": {"findings", "release"},
    "review": {"findings", "release"},
    "repair": {"release"},
    "checker": {"cells", "files", "findings", "locked", "names", "notebooks", "quarantine", "release", "repair",
                "review"},
    "overrides": {"findings", "release"},
}


def test_every_module_says_what_it_finds_and_may_import_and_keeps_to_it():
    edges = graph()
    found = {p.stem for p in FOLDER.glob("*.py") if p.stem != "__init__"}
    assert found == set(ALLOWED), f"place new pre-flight modules in ALLOWED: {sorted(found ^ set(ALLOWED))}"
    for name, allowed in ALLOWED.items():
        doc = ast.get_docstring(ast.parse((FOLDER / f"{name}.py").read_text(encoding="utf-8")))
        assert doc and len(doc) > 120, f"{name}: a docstring saying what it finds"
        assert re.search(r"[Mm]ay import|[Ss]tandard library", doc), f"{name}: the docstring says what it may import"
        inside = {t.rsplit(".", 1)[1] for t in edges[f"{PKG}.{name}"] if t.startswith(PKG + ".")}
        assert inside <= allowed, f"{name} imports {sorted(inside - allowed)} of the pre-flight"
        assert "rlhf_lab.instructor.grader.integrity" not in edges[f"{PKG}.{name}"], name
    init = ast.get_docstring(ast.parse((FOLDER / "__init__.py").read_text(encoding="utf-8")))
    assert "May import" in init and all(f":mod:`.{m}`" in init for m in ALLOWED)


def _codes_in(path: Path) -> set[str]:
    """Finding codes a module writes: ``code="..."`` keyword values and string literals of
    conditional ``code=`` expressions."""
    def values(node) -> set[str]:
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            return {node.value}
        if isinstance(node, ast.IfExp):
            return values(node.body) | values(node.orelse)
        return set()

    codes = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.keyword) and node.arg == "code":
            codes |= values(node.value)
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Tuple) for t in node.targets):
            # ``code, message = "rebinding", ...``
            for sub in ast.walk(node.value):
                if isinstance(sub, ast.Tuple) and sub.elts and isinstance(sub.elts[0], ast.Constant) \
                        and isinstance(sub.elts[0].value, str) and sub.elts[0].value in ("rebinding",
                                                                                         "introspection"):
                    codes.add(sub.elts[0].value)
    return codes


def test_each_finding_code_comes_from_one_module():
    owners: dict[str, set[str]] = {}
    for path in FOLDER.glob("*.py"):
        for code in _codes_in(path):
            owners.setdefault(code, set()).add(path.stem)
    shared = {c: sorted(m) for c, m in owners.items() if len(m) > 1}
    assert not shared, f"finding codes written by more than one module: {shared}"
    expected = {
        "names": {"student-id-unusable", "student-id-unicode", "student-id-characters"},
        "files": {"folder-link", "oversized-file", "symlink", "special-file", "file-name", "shadow-module",
                  "extra-file"},
        "notebooks": {"invalid-notebook", "renamed-notebook", "unknown-notebook", "missing-notebook"},
        "cells": {"other-assignment", "kernel-name", "kernel-language", "duplicate-answer", "duplicate-cell",
                  "deleted-test", "deleted-given", "deleted-answer", "reordered", "magic-before-start",
                  "code-before-start"},
        "locked": {"unknown-cell", "cell-type", "edited-test", "edited-start", "edited-given", "points-changed",
                   "edited-metadata"},
        "review": {"library-copy", "rebinding", "introspection"},
    }
    for module, codes in expected.items():
        assert codes <= {c for c, m in owners.items() if module in m}, (module, codes)
    # integrity.py itself writes no finding of a kind of its own any more (only the one-file scan
    # reports an unreadable notebook, with the code the notebooks module owns)
    integrity = FOLDER.parent / "integrity.py"
    assert "code=" not in integrity.read_text(encoding="utf-8")


def test_integrity_keeps_every_name_its_callers_use():
    from rlhf_lab.instructor.grader import integrity

    used = ("preflight", "apply_overrides", "scan_notebook_file", "Finding", "IntegrityReport", "Override",
            "BLOCK", "WARN", "QUARANTINE", "REPORT_TEMPLATE", "COMMENT_TAG", "OUTPUT_DIR", "release_specs",
            "notebook_spec", "readable_name", "MAX_REBINDING_FINDINGS", "MAX_NOTEBOOK_BYTES",
            "NBGRADER_EXCHANGE_FILES", "CellSpec", "NotebookSpec", "_Checker", "_with_type", "_unusable_name")
    missing = [n for n in used if not hasattr(integrity, n)]
    assert not missing, missing
    assert integrity.Finding.__module__ == f"{PKG}.findings"
    checker = integrity._Checker
    for method in ("check_folder_itself", "check_student", "check_notebook", "repair_notebook", "all_autograded"):
        assert callable(getattr(checker, method)), method
