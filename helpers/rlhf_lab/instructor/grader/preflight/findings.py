"""Findings and the report of one pre-flight run, and where the pre-flight writes.

A :class:`Finding` is one problem with one student's submission (student, notebook, cell, line, a
plain message, the cells whose points it withholds); an :class:`IntegrityReport` holds all findings
of one assignment. Standard library only.
"""
from __future__ import annotations

import dataclasses

BLOCK = "block"
WARN = "warn"
#: Everything the pre-flight writes lives under ``<course root>/integrity/`` (a pipeline output).
OUTPUT_DIR = "integrity"
QUARANTINE = "integrity/quarantine"
REPORT_TEMPLATE = "integrity/{assignment}.json"
COMMENT_TAG = "[integrity]"


@dataclasses.dataclass(frozen=True)
class Finding:
    """One problem with one student's submission."""

    student: str
    assignment: str
    notebook: str | None  # file name inside the assignment folder (None: the folder itself)
    cell: int | None  # index of the cell in the submitted notebook
    grade_id: str | None  # nbgrader id of that cell, when it has one
    line: int | None  # 1-based line inside the cell
    code: str  # short machine-readable kind, e.g. "tamper-attribute"
    severity: str  # BLOCK or WARN
    message: str  # plain English, for the instructor (and, when blocking, the student)
    withhold: tuple = ()  # ((notebook_name, grade_id), ...) whose points are withheld
    action: str = ""  # what the pre-flight did ("quarantined to ...")

    @property
    def blocking(self) -> bool:
        return self.severity == BLOCK

    def where(self) -> str:
        parts = [f"student {self.student!r}", f"{self.assignment}/{self.notebook}" if self.notebook else self.assignment]
        if self.cell is not None:
            parts.append(f"cell {self.cell}" + (f" ({self.grade_id})" if self.grade_id else ""))
        if self.line is not None:
            parts.append(f"line {self.line}")
        return ", ".join(parts)

    def text(self) -> str:
        return f"{self.severity.upper()}: {self.where()}: {self.message}" + (f" [{self.action}]" if self.action else "")

    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d["withhold"] = [list(x) for x in self.withhold]
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "Finding":
        d = dict(d)
        d["withhold"] = tuple(tuple(x) for x in d.get("withhold", ()))
        return cls(**d)


@dataclasses.dataclass
class IntegrityReport:
    """All findings of one pre-flight run of one assignment."""

    assignment: str
    findings: list  # [Finding]
    students: list  # students checked

    def blocking(self, student: str | None = None) -> list:
        return [f for f in self.findings if f.blocking and (student is None or f.student == student)]

    def warnings(self, student: str | None = None) -> list:
        return [f for f in self.findings if not f.blocking and (student is None or f.student == student)]

    def for_student(self, student: str) -> list:
        return [f for f in self.findings if f.student == student]

    def withheld(self, student: str) -> dict:
        """``{notebook_name: {grade_id: [reasons]}}`` for one student."""
        out: dict = {}
        for f in self.blocking(student):
            for nb, gid in f.withhold:
                out.setdefault(nb, {}).setdefault(gid, []).append(f.message)
        return out

    def ungradable(self) -> list:
        """Students nbgrader must not be run for (their folder name cannot be addressed, or their
        folder is a link)."""
        return sorted({f.student for f in self.findings if f.code in ("student-id-unusable", "folder-link")})

    def to_dict(self) -> dict:
        return {"assignment": self.assignment, "students": self.students,
                "findings": [f.to_dict() for f in self.findings]}

    def text(self) -> str:
        if not self.findings:
            return f"{self.assignment}: no integrity problems in {len(self.students)} submission(s)"
        lines = [f"{self.assignment}: {len(self.blocking())} blocking, {len(self.warnings())} warning(s)"]
        lines += ["  " + f.text() for f in self.findings]
        return "\n".join(lines)

