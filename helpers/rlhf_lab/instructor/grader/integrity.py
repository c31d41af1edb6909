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

Layout
------
This module is the entry point: :func:`preflight` (every submission of an assignment), :func:`scan_notebook_file` (one file),
:func:`apply_overrides` and the command line. The checks live in :mod:`.preflight`, one module per
kind of finding: :mod:`.preflight.names` (folder names), :mod:`.preflight.files` (links, special,
oversized, planted and extra files), :mod:`.preflight.notebooks` (invalid, missing, renamed,
unknown notebooks), :mod:`.preflight.cells` (ids, kernel, duplicated, deleted, reordered cells, code
above the first cell), :mod:`.preflight.locked` (locked cells edited), :mod:`.preflight.review`
(library copies, rebinding, introspection), with :mod:`.preflight.repair`,
:mod:`.preflight.quarantine`, :mod:`.preflight.checker` (one student through all of them) and
:mod:`.preflight.overrides` (the gradebook). Every name callers used from this module is
re-exported here.
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Iterable

from . import safe_files
from .preflight.cells import DISPLAY_MAGICS  # noqa: F401  (re-exported)
from .preflight.checker import Checker
from .preflight.files import NBGRADER_EXCHANGE_FILES  # noqa: F401
from .preflight.findings import (  # noqa: F401
    BLOCK, COMMENT_TAG, OUTPUT_DIR, QUARANTINE, REPORT_TEMPLATE, WARN, Finding, IntegrityReport,
)
from .preflight.names import readable_name, unusable_name  # noqa: F401
from .preflight.notebooks import read_notebook
from .preflight.overrides import Override, apply_overrides  # noqa: F401
from .preflight.quarantine import MAX_NOTEBOOK_BYTES  # noqa: F401
from .preflight.release import (  # noqa: F401
    CellSpec, NotebookSpec, course_root_of, notebook_spec, other_assignments, release_specs,
)
from .preflight.repair import with_type
from .preflight.review import MAX_REBINDING_FINDINGS  # noqa: F401

__all__ = ["BLOCK", "WARN", "Finding", "IntegrityReport", "Override", "CellSpec", "NotebookSpec",
           "preflight", "scan_notebook_file", "apply_overrides", "notebook_spec", "release_specs",
           "readable_name", "QUARANTINE", "REPORT_TEMPLATE", "COMMENT_TAG", "OUTPUT_DIR",
           "MAX_REBINDING_FINDINGS"]

#: Former private names, kept for the callers that use them.
_Checker = Checker
_with_type = with_type
_unusable_name = unusable_name


# ------------------------------------------------------------------------------------ the driver
def preflight(assignment: str, root=None, students: Iterable[str] | None = None,
              quarantine: bool = True, write: bool = True) -> IntegrityReport:
    """Check every ``submitted/<student>/<assignment>/`` folder; quarantine what must not run.

    Findings recorded by an earlier run for files that are now in quarantine are kept, so a
    re-run reports the same problems. Writes ``integrity/<assignment>.json`` in the course root.
    """
    root = course_root_of(root)
    safe_files.add_course_root(root)
    specs = release_specs(root, assignment)
    others = other_assignments(root, assignment)
    checker = Checker(root, assignment, specs, others, quarantine)
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
    where the folder should be: those are findings, see :meth:`.preflight.checker.Checker.check_folder_itself`)."""
    try:
        os.lstat(student_dir / assignment)
        return True
    except OSError:
        return os.path.islink(student_dir)  # a linked student folder whose target lacks the assignment


def scan_notebook_file(path, release_path) -> list[Finding]:
    """Check one notebook file against its release notebook (no quarantine, no gradebook)."""
    path, release_path = Path(path), Path(release_path)
    spec = notebook_spec(release_path)
    checker = Checker(release_path.parent.parent.parent, release_path.parent.name, {release_path.name: spec}, {},
                      quarantine=False)
    nb, problem = read_notebook(path)
    if problem:
        return [Finding("?", release_path.parent.name, path.name, None, None, None, "invalid-notebook", BLOCK,
                        problem)]
    return checker.check_notebook("?", release_path.name, nb)


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
