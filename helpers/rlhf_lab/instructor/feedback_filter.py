"""Feedback without hidden tests: students see which checks failed and why, never the checks' code.

nbgrader's ``generate_feedback`` renders the *autograded* notebook, in which ``autograde`` has
restored every test cell from ``source/``, hidden tests included, so plain nbgrader hands the
hidden tests to every student (upstream issue #1363). IPython tracebacks leak them a second way:
an error shows the lines of the cell around the line that failed.

:class:`HideHiddenTests` is an nbgrader preprocessor added to ``GenerateFeedback.preprocessors``
in ``nbgrader_config.py``, so ``nbgrader generate_feedback`` itself (and the pipeline, and
formgrader's "generate feedback" button) writes clean HTML. For every code cell that holds a
``### BEGIN HIDDEN TESTS`` ... ``### END HIDDEN TESTS`` region it

* replaces the region by one comment line, ``# [hidden tests: N lines not shown]``, keeping the
  visible part of the cell as it was;
* rewrites each ``error`` output as a short summary that keeps what the student needs:
  ``Hidden test failed: <exception>: <message>`` when the failing line is in the hidden region
  (the grading primitives' messages name the check, the expected and the actual values and a
  hint), or ``Visible check failed at line L: <that line>`` plus the exception when it is in the
  visible part. Frames and context lines are dropped, since they can quote hidden lines;
* leaves ``stream``/``display`` outputs alone (a hidden test prints only what it means to show).

Scores are unchanged (feedback is generated from the gradebook). The autograded notebooks keep
everything for the instructor. :func:`leaked_lines` checks a feedback file against the source
notebooks and is used by the pipeline and the tests to prove nothing leaked.

Command line (re-filter HTML already produced by plain nbgrader, e.g. an old ``feedback/``)::

    python -m rlhf_lab.instructor.feedback_filter --check feedback/ source/
"""
from __future__ import annotations

import html
import re
from pathlib import Path

from nbgrader.preprocessors import NbGraderPreprocessor
from traitlets import Unicode

BEGIN = "BEGIN HIDDEN TESTS"
END = "END HIDDEN TESTS"
PLACEHOLDER = "# [hidden tests: {n} lines not shown]"
_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
_CELL_FRAME = re.compile(r"^(?:Cell In\s*\[\d*\]|Input In \[\d*\]|<ipython-input-[^>]*>)[^\n]*?line (\d+)", re.M)
_MIN_LEAK = 12  # shorter lines ("else:", "return x") are too generic to prove a leak


def strip_ansi(text: str) -> str:
    return _ANSI.sub("", text)


def split_hidden(source: str, begin: str = BEGIN, end: str = END) -> tuple[list[str], set[int]]:
    """The cell's lines and the 1-based numbers of the lines inside (and on) hidden-test delimiters."""
    lines = source.split("\n")
    hidden, inside = set(), False
    for n, line in enumerate(lines, start=1):
        if begin in line:
            inside = True
            hidden.add(n)
        elif end in line:
            hidden.add(n)
            inside = False
        elif inside:
            hidden.add(n)
    return lines, hidden


def visible_source(source: str, begin: str = BEGIN, end: str = END) -> str:
    """The source with each hidden region collapsed into one placeholder comment."""
    lines, hidden = split_hidden(source, begin, end)
    out, run = [], 0
    for n, line in enumerate(lines, start=1):
        if n in hidden:
            run += 1
            if end in line or n == len(lines):
                indent = line[: len(line) - len(line.lstrip())]
                out.append(indent + PLACEHOLDER.format(n=max(run - 2, 0)))
                run = 0
            continue
        out.append(line)
    return "\n".join(out)


def failing_line(traceback: list[str]) -> int | None:
    """The line of the cell where the error was raised (IPython's ``Cell In[..], line L`` frame)."""
    text = strip_ansi("\n".join(traceback or []))
    matches = _CELL_FRAME.findall(text)
    return int(matches[0]) if matches else None


def summarise_error(output: dict, lines: list[str], hidden: set[int]) -> dict:
    """A copy of an ``error`` output whose traceback says where the check failed, without code context."""
    ename = output.get("ename", "Error")
    evalue = output.get("evalue", "")
    line = failing_line(output.get("traceback", []))
    if line is not None and line in hidden:
        head = "Hidden test failed"
    elif line is not None and 1 <= line <= len(lines):
        head = f"Visible check failed at line {line}: {lines[line - 1].strip()}"
    else:
        head = "The test cell failed"
    summary = f"\x1b[0;31m{ename}\x1b[0m: {evalue}" if evalue else f"\x1b[0;31m{ename}\x1b[0m"
    new = dict(output)
    new["traceback"] = [head, summary]
    return new


class HideHiddenTests(NbGraderPreprocessor):
    """Remove hidden-test code (and traceback context that quotes it) from feedback notebooks."""

    begin_test_delimeter = Unicode(BEGIN, help="Marks the start of a hidden-test region").tag(config=True)
    end_test_delimeter = Unicode(END, help="Marks the end of a hidden-test region").tag(config=True)

    def preprocess_cell(self, cell, resources, index):
        if cell.cell_type != "code":
            return cell, resources
        source = cell.source
        if self.begin_test_delimeter not in source:
            return cell, resources
        lines, hidden = split_hidden(source, self.begin_test_delimeter, self.end_test_delimeter)
        outputs = []
        for out in cell.get("outputs", []):
            if out.get("output_type") == "error":
                out = type(out)(summarise_error(out, lines, hidden)) if isinstance(out, dict) else out
            outputs.append(out)
        cell.outputs = outputs
        cell.source = visible_source(source, self.begin_test_delimeter, self.end_test_delimeter)
        resources.setdefault("hidden_tests_removed", []).append(index)
        return cell, resources


# ------------------------------------------------------------------------- answers awaiting grading
AWAITING = "awaiting grading"


def is_awaiting(value) -> bool:
    """Whether a score value is the "awaiting grading" text :class:`MarkPendingGrades` put there."""
    return isinstance(value, str) and AWAITING in value


def float_filter(value, default=0.0):
    """Jinja's ``float`` filter, except that an "awaiting grading" score passes through unchanged.

    nbgrader's feedback template prints every score as ``score | float | round(2)``, which turns
    a missing manual grade into ``0.0``. Registered as the HTML exporter's ``float`` and
    ``round`` filters in ``nbgrader_config.py``; every other value behaves exactly as before.
    """
    if is_awaiting(value):
        return value
    from jinja2.filters import do_float

    return do_float(value, default)


def round_filter(value, precision=0, method="common"):
    """Jinja's ``round`` filter, except that an "awaiting grading" score passes through unchanged."""
    if is_awaiting(value):
        return value
    from jinja2.filters import do_round

    return do_round(value, precision, method)


def pending_cells(gradebook, notebook: str, assignment: str, student: str) -> dict:
    """``{grade_id: max_score}`` of the cells of one submitted notebook that still wait for a person.

    A cell waits when nbgrader flagged it for manual grading and nobody has entered a manual
    score yet (a written answer before hand grading; an integrity override already has one).
    """
    nb = gradebook.find_submission_notebook(notebook, assignment, student)
    return {g.name: float(g.max_score) for g in nb.grades if g.needs_manual_grade and g.manual_score is None}


class MarkPendingGrades(NbGraderPreprocessor):
    """Say "awaiting grading" instead of a score of 0 for answers still waiting for a human grader.

    Runs after nbgrader's ``GetGrades`` in ``GenerateFeedback.preprocessors``: each pending cell's
    score becomes the text ``awaiting grading`` and the notebook's score says how many points are
    still pending (``4 (+3 awaiting grading)``); :func:`float_filter` and :func:`round_filter`
    let the text through nbgrader's template. The notebook is also recorded in
    ``resources['nbgrader']['awaiting_points']``.
    """

    def preprocess(self, nb, resources):
        from nbgrader.api import Gradebook

        info = resources["nbgrader"]
        with Gradebook(info["db_url"]) as gb:
            pending = pending_cells(gb, info["notebook"], info["assignment"], info["student"])
        for cell in nb.cells:
            md = cell.metadata.get("nbgrader", {})
            if md.get("grade_id") in pending:
                md["score"] = AWAITING
        points = sum(pending.values())
        info["awaiting_points"] = points
        if points:
            info["score"] = f"{float(info.get('score') or 0):.2f} (+{points:g} {AWAITING})"
        return nb, resources


# ----------------------------------------------------------------------------------- leak check
def hidden_lines(source_dir: str | Path) -> set[str]:
    """Every distinctive line of every hidden-test region in the notebooks under ``source_dir``."""
    import nbformat

    found: set[str] = set()
    visible: set[str] = set()
    for path in sorted(Path(source_dir).rglob("*.ipynb")):
        if ".ipynb_checkpoints" in path.parts:
            continue
        nb = nbformat.read(str(path), as_version=4)
        for cell in nb.cells:
            if cell.cell_type != "code":
                continue
            lines, hidden = split_hidden(cell.source)
            for n, line in enumerate(lines, start=1):
                (found if n in hidden else visible).add(line.strip())
    # a line that also appears outside hidden regions (given code) is not secret
    return {line for line in found - visible if len(line) >= _MIN_LEAK and BEGIN not in line and END not in line}


def html_text(path: str | Path) -> str:
    """The visible text of an HTML file (tags dropped, entities unescaped, whitespace normalised)."""
    raw = Path(path).read_text(encoding="utf-8", errors="replace")
    raw = re.sub(r"<(script|style)\b.*?</\1>", " ", raw, flags=re.S | re.I)
    text = html.unescape(re.sub(r"<[^>]+>", "", raw))
    return text


def leaked_lines(html_path: str | Path, secret_lines: set[str]) -> list[str]:
    """The hidden-test lines that appear in a feedback HTML file (empty: nothing leaked)."""
    text = html_text(html_path)
    squashed = re.sub(r"\s+", " ", text)
    leaks = []
    for line in sorted(secret_lines):
        if re.sub(r"\s+", " ", line) in squashed:
            leaks.append(line)
    if BEGIN in text or END in text:
        leaks.append(f"a '{BEGIN}' delimiter")
    return leaks


def check_feedback(feedback_dir: str | Path, source_dir: str | Path) -> dict:
    """``{html file: [leaked lines]}`` for every feedback file that leaks (empty dict: all clean)."""
    secrets = hidden_lines(source_dir)
    out = {}
    for path in sorted(Path(feedback_dir).rglob("*.html")):
        leaks = leaked_lines(path, secrets)
        if leaks:
            out[str(path)] = leaks
    return out


def _main(argv=None) -> int:
    import argparse

    parser = argparse.ArgumentParser(description="Check feedback HTML for hidden-test code")
    parser.add_argument("--check", nargs=2, metavar=("FEEDBACK_DIR", "SOURCE_DIR"), required=True)
    args = parser.parse_args(argv)
    leaks = check_feedback(*args.check)
    for path, lines in leaks.items():
        print(f"{path}: {len(lines)} hidden line(s) leaked, e.g. {lines[0]!r}")
    if not leaks:
        print("no hidden-test code in the feedback")
    return 1 if leaks else 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(_main())
