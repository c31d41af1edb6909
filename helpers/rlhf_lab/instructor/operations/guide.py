"""Grader's guides: every hand-graded cell of an assignment with its question, model answer, rubric and points.

Formgrader shows a grader the student's answer and the points, but the model answer and the
rubric live only in ``source/``. :func:`build_guide` reads an assignment's source notebooks and
writes one Markdown page per assignment (``guides/<assignment>.md``), to open beside Formgrader
(JupyterLab renders it: right-click -> Open With -> Markdown Preview). For every cell a person
grades (a written answer with points, a task cell, an answer cell graded by hand) it lists, in
notebook order:

* where it is, named as Formgrader's grading page shows it: the notebook (the page's title), the
  heading or bold label printed just above the answer box (:func:`screen_title`: ``Task 1.5:
  explain the trade-off (3 points, graded by hand)``) and the box's own label with its points
  (:func:`formgrader_box`: ``Student's answer / 3.0``). Formgrader prints a cell's ``grade_id``
  only on autograded test cells, never on a written answer or a task, so the ``grade_id`` is
  listed apart (the gradebook, the exported CSVs and the anchors use it);
* the question: the markdown cells between the previous graded cell and this one, from the last
  section heading (``#`` or ``##``) among them: a new section starts a new question;
* the model answer and the rubric, split from the solution text: a paragraph that starts with
  ``**Rubric`` (or a ``BEGIN MARK SCHEME`` region) is the rubric; ``**Model answer`` or anything
  else is the model answer.

Command line (``make guides``; a test proves the committed guides are in sync with ``source/``)::

    python -m rlhf_lab.instructor.operations.guide            # rewrite guides/*.md
    python -m rlhf_lab.instructor.operations.guide --check    # exit 1 and list what is stale
"""
from __future__ import annotations

import argparse
import dataclasses
import re
import sys

import nbformat

from ..course import course_root, graded_assignments

GUIDES_DIR = "guides"
_SOLUTION = re.compile(r"^\s*###\s*(BEGIN|END) SOLUTION\s*$")
_SCHEME = re.compile(r"(BEGIN|END) MARK SCHEME")  # nbgrader matches the words anywhere in the line
_RUBRIC_HEAD = re.compile(r"^\s*\*\*(Rubric|Mark scheme|Marking)\b", re.I)
_ANSWER_HEAD = re.compile(r"^\s*\*\*(Model answer|Sample answer|Answer)\b", re.I)


@dataclasses.dataclass(frozen=True)
class GuideEntry:
    """One hand-graded cell: where it is, what is asked, what a full answer says, how to mark it."""

    notebook: str
    grade_id: str
    points: float
    kind: str  # "written answer", "task", "code answer graded by hand"
    question: str
    model_answer: str
    rubric: str
    title: str = ""  # the heading or bold label just above the box on Formgrader's page
    box: str = ""  # the box's label and points as Formgrader prints them: "Student's answer / 3.0"

    @property
    def screen_name(self) -> str:
        """The section's name as a grader finds it on Formgrader's page of this notebook."""
        return " · ".join(p for p in (self.notebook, self.title, self.box) if p)


def _md(cell) -> dict:
    return cell.get("metadata", {}).get("nbgrader", {}) or {}


def is_hand_graded(cell) -> bool:
    """A cell a person grades: a task, a graded markdown answer, or a graded code answer without tests."""
    md = _md(cell)
    if md.get("task"):
        return True
    return bool(md.get("grade") and md.get("solution"))


_HEADING_LINE = re.compile(r"^\s{0,3}#{1,6}\s+(.*?)\s*#*\s*$")
_BOLD_LEAD = re.compile(r"^\s{0,3}(\*\*|__)(.+?)\1")


def _plain(text: str) -> str:
    """Inline Markdown (emphasis, code) removed, as the rendered page reads; ``|`` kept, spaces collapsed."""
    text = re.sub(r"(\*\*|__)(.+?)\1", r"\2", text)
    text = re.sub(r"(?<![\w*])\*(?!\s)(.+?)(?<!\s)\*", r"\1", text)
    text = text.replace("`", "")
    return re.sub(r"\s+", " ", text).strip()


def screen_title(question: str) -> str:
    """What a grader reads just above the answer box on Formgrader's page: the last Markdown
    heading or bold paragraph label (``**Task 2.8 (Q1, 1 point).**``) of the question, as plain text
    (a label's closing ``.`` or ``:`` dropped); without either, the question's first words."""
    title = ""
    for paragraph in re.split(r"\n\s*\n", question or ""):
        first = paragraph.strip("\n").split("\n", 1)[0]
        for line in paragraph.split("\n"):
            heading = _HEADING_LINE.match(line)
            if heading:
                title = _plain(heading.group(1))
        bold = _BOLD_LEAD.match(first)
        if bold and not _HEADING_LINE.match(first):
            title = _plain(bold.group(2)).rstrip(".:").strip()
    if title or not (question or "").strip():
        return title
    words = _plain(question).split()
    return " ".join(words[:8]) + (" …" if len(words) > 8 else "")


def formgrader_box(md: dict) -> str:
    """The label and points Formgrader prints on a graded cell's box, after nbgrader's template
    (``formgrade/index.html.j2``: "Student's task" for a task, "Student's answer" for a solution
    cell, the ``grade_id`` for an autograded test cell; then ``/ {{ points | float | round(2) }}``)."""
    if md.get("task"):
        label = "Student's task"
    elif md.get("solution"):
        label = "Student's answer"
    else:
        label = f"`{md.get('grade_id', '?')}`"
    if md.get("grade") or md.get("task"):
        label += f" / {round(float(md.get('points', 0) or 0), 2)}"
    return label


def split_solution(source: str) -> tuple[str, str]:
    """``(model answer, rubric)`` of a hand-graded cell's source (nbgrader markers removed)."""
    if not isinstance(source, str):
        raise TypeError(f"source must be a string, got {type(source).__name__}")
    answer, rubric = [], []
    target = answer
    in_scheme = False
    for line in source.split("\n"):
        if _SOLUTION.match(line):
            continue
        scheme = _SCHEME.search(line)
        if scheme:
            in_scheme = scheme.group(1) == "BEGIN"
            target = rubric if in_scheme else answer
            continue
        if not in_scheme:
            if _RUBRIC_HEAD.match(line):
                target = rubric
            elif _ANSWER_HEAD.match(line):
                target = answer
        target.append(line)
    return "\n".join(answer).strip(), "\n".join(rubric).strip()


def notebook_entries(nb, notebook: str) -> list[GuideEntry]:
    """The :class:`GuideEntry` of every hand-graded cell of one source notebook, in order."""
    entries, question = [], []
    for cell in nb.cells:
        md = _md(cell)
        if is_hand_graded(cell):
            answer, rubric = split_solution(cell.source)
            kind = "task" if md.get("task") else ("written answer" if cell.cell_type == "markdown"
                                                  else "code answer graded by hand")
            text = "\n\n".join(q for q in question if q).strip()
            entries.append(GuideEntry(notebook, md.get("grade_id", "?"), float(md.get("points", 0) or 0), kind,
                                      text, answer, rubric, screen_title(text), formgrader_box(md)))
            question = []
        elif md.get("grade") or md.get("solution"):
            question = []  # an autograded part: the next question starts after it
        elif cell.cell_type == "markdown":
            if re.match(r"#{1,2} ", cell.source.lstrip()):
                question = []  # a new section: what came before it belongs to another part
            question.append(cell.source.strip())
    return entries


def assignment_entries(root, assignment: str) -> list[GuideEntry]:
    """Every hand-graded cell of ``source/<assignment>/`` (notebooks in name order)."""
    folder = course_root(root) / "source" / assignment
    if not folder.is_dir():
        raise ValueError(f"assignment {assignment!r} has no folder {folder}")
    out = []
    for path in sorted(folder.glob("*.ipynb")):
        out += notebook_entries(nbformat.read(path, as_version=4), path.stem)
    return out


def _quote(text: str) -> str:
    return "\n".join(("> " + line) if line.strip() else ">" for line in text.split("\n"))


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def render_guide(assignment: str, entries: list) -> str:
    """The Markdown text of the grader's guide of ``assignment`` (deterministic)."""
    total = sum(e.points for e in entries)
    lines = [f"# Grader's guide: {assignment}", "",
             f"Generated from `source/{assignment}/` by `python -m rlhf_lab.instructor.operations.guide`; do not edit by hand.",
             f"{len(entries)} hand-graded cells, {total:g} points. Open it beside Formgrader (Manual Grading > "
             f"`{assignment}` > a notebook > a submission). Each section is named as that page shows it: the notebook "
             "(the page's title), the heading or bold label just above the answer box, and the box's label with "
             "its points (\"Student's answer / 3.0\"). Formgrader does not print the `grade_id` of a hand-graded "
             "cell; it is listed for the gradebook and the exported CSVs.",
             ""]
    lines += ["| # | notebook | above the answer box | Formgrader's box | kind | grade_id (not on the page) |",
              "|---|---|---|---|---|---|"]
    for i, e in enumerate(entries, 1):
        lines.append(f"| {i} | {e.notebook} | [{_cell(e.title or e.grade_id)}](#{e.notebook}-{e.grade_id}) | "
                     f"{_cell(e.box)} | {e.kind} | `{e.grade_id}` |")
    for i, e in enumerate(entries, 1):
        lines += ["", f'<a id="{e.notebook}-{e.grade_id}"></a>', "",
                  f"## {i}. {e.screen_name}", "",
                  f"{e.kind}, {e.points:g} points; grade_id `{e.grade_id}`", "",
                  "### Question", "", _quote(e.question) if e.question else "_(no question text before this cell)_",
                  "", "### Model answer", "", e.model_answer or "_(none in the source)_",
                  "", "### Rubric", "", e.rubric or f"_(no rubric in the source: full {e.points:g} points for a "
                                                   "complete, correct answer)_"]
    return "\n".join(lines).rstrip() + "\n"


def build_guides(root=None) -> dict:
    """``{relative path: text}`` of every guide (one per graded assignment with hand-graded cells)."""
    out = {}
    for a in graded_assignments(root):
        entries = assignment_entries(root, a)
        if entries:
            out[f"{GUIDES_DIR}/{a}.md"] = render_guide(a, entries)
    return out


def write_guides(root=None) -> list[str]:
    """Write :func:`build_guides` under ``<root>/guides/`` (stale guides removed); the paths written."""
    root = course_root(root)
    want = build_guides(root)
    folder = root / GUIDES_DIR
    folder.mkdir(exist_ok=True)
    for old in folder.glob("*.md"):
        if f"{GUIDES_DIR}/{old.name}" not in want:
            old.unlink()
    for rel, text in sorted(want.items()):
        (root / rel).write_text(text, encoding="utf-8")
    return sorted(want)


def guides_diff(root=None) -> list[str]:
    """Relative paths whose committed guide differs from a fresh build (empty: in sync)."""
    root = course_root(root)
    want = build_guides(root)
    have = {f"{GUIDES_DIR}/{p.name}": p.read_text(encoding="utf-8") for p in (root / GUIDES_DIR).glob("*.md")} \
        if (root / GUIDES_DIR).is_dir() else {}
    return sorted(k for k in set(want) | set(have) if want.get(k) != have.get(k))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m rlhf_lab.instructor.operations.guide",
                                     description="Write the grader's guides (guides/<assignment>.md) from source/.")
    parser.add_argument("--check", action="store_true", help="only report guides that are out of date")
    args = parser.parse_args(argv)
    if args.check:
        stale = guides_diff()
        for rel in stale:
            print(f"out of date: {rel} (run python -m rlhf_lab.instructor.operations.guide)")
        return 1 if stale else 0
    for rel in write_guides():
        print(f"wrote {rel}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
