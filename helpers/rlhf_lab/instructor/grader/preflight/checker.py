"""One student's assignment folder through every check, in the report's order.

:class:`Checker` holds what a pre-flight run shares (the course root, the assignment, the release's
notebooks, the other assignments' ids, the quarantine) and runs, per student: the folder itself
(:mod:`.files`), its name (:mod:`.names`), its files (:mod:`.files`), which notebooks
(:mod:`.notebooks`), then per notebook its cells (:mod:`.cells`), its locked cells (:mod:`.locked`)
and its answer code (:mod:`.review`), and the repairs (:mod:`.repair`, written by
:mod:`.quarantine`). It decides nothing itself beyond that order and what is moved or rewritten.
May import every module of this package except :mod:`.overrides`.
"""
from __future__ import annotations

from pathlib import Path

from .cells import cell_findings
from .files import folder_findings, folder_link_findings, shadowable_names
from .findings import Finding
from .locked import locked_cell_findings
from .names import student_name_findings
from .notebooks import notebook_set_findings
from .quarantine import Quarantine
from .release import NotebookSpec
from .repair import repair_notebook
from .review import library_copy_findings, rebinding_findings


class Checker:
    """Checks one student's assignment folder against the release (and repairs what nbgrader would choke on)."""

    def __init__(self, root: Path, assignment: str, specs: dict, others: dict, quarantine: bool):
        self.root = root
        self.assignment = assignment
        self.specs = specs
        self.others = others
        self.quarantine = quarantine  # False: report only, change no file
        self.shadowable = shadowable_names()
        self._moves = Quarantine(root, assignment, quarantine)

    def _finding(self, student: str, **fixed):
        def F(**kw):
            return Finding(student=student, assignment=self.assignment, **fixed, **kw)
        return F

    def all_autograded(self) -> tuple:
        return tuple((nb, gid) for nb, spec in self.specs.items() for gid in spec.autograded_ids)

    def check_folder_itself(self, student: str, student_dir: Path, folder: Path) -> list[Finding]:
        """The ``folder-link`` finding when the student's folder or assignment folder is a link or
        not a folder ([] when both are plain folders); the link is moved out, never followed."""
        return folder_link_findings(self._finding(student), self.root, student_dir, folder, self.all_autograded(),
                                    lambda f, path: self._moves.move_folder(f, student, path))

    def check_student(self, student: str, folder: Path) -> list[Finding]:
        """Every finding of one student's assignment folder (files moved and notebooks repaired
        unless the checker only reports)."""
        F = self._finding(student)

        def move(finding, path):
            return self._moves.move(finding, student, path)

        out, usable = student_name_findings(F, student, self.all_autograded())
        if not usable:
            return out
        files, present = folder_findings(F, folder, self.shadowable, move)
        out += files
        notebooks, parsed = notebook_set_findings(F, self.assignment, self.specs, self.others, present, move)
        out += notebooks
        for name in sorted(set(parsed) & set(self.specs)):
            path = present[name]
            nb_findings = self.check_notebook(student, name, parsed[name])
            if any(f.code == "other-assignment" for f in nb_findings):
                nb_findings = [move(f, path) if f.code == "other-assignment" else f for f in nb_findings]
            else:
                repaired, repairs = self.repair_notebook(student, name, parsed[name])
                if repairs and self.quarantine:
                    nb_findings = self._moves.save_repair(student, path, repaired, nb_findings, repairs)
            out.extend(nb_findings)
        return out

    def repair_notebook(self, student: str, name: str, nb):
        """``(notebook nbgrader can grade, finding codes repaired)`` (:func:`.repair.repair_notebook`)."""
        return repair_notebook(self.specs[name], nb)

    def check_notebook(self, student: str, name: str, nb) -> list[Finding]:
        """Every finding of one submitted notebook (the integrity module's docstring gives their severity)."""
        spec: NotebookSpec = self.specs[name]
        F = self._finding(student, notebook=name)
        out, foreign = cell_findings(F, self.assignment, name, spec, nb, self.others)
        if foreign:
            return out
        out += locked_cell_findings(F, name, spec, nb)
        # answers that copy library code the students must write (with evidence): for review only
        out += library_copy_findings(F, nb, self.assignment, name, spec, self.root)
        # statements that rebind JAX, NumPy, builtins or the course library: withheld for review
        out += rebinding_findings(F, name, spec, nb)
        return out
