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
* leaves ``stream``/``display`` outputs alone (a hidden test prints only what it means to show),
  except that any output of any cell that shows a hidden-test line or a line of the instructor's
  answers in ``source/`` (:func:`source_only_lines`) is replaced by a note saying it was removed.

Scores are unchanged (feedback is generated from the gradebook). The autograded notebooks keep
everything for the instructor. :func:`leaked_lines` checks a feedback file against the source
notebooks and is used by the pipeline and the tests to prove nothing leaked.

Command line (re-filter HTML already produced by plain nbgrader, e.g. an old ``feedback/``)::

    python -m rlhf_lab.instructor.grader.feedback_filter --check feedback/ source/
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

    source_directory = Unicode("", help="The course's source/ folder (default: $RLHF_COURSE_ROOT/source, "
                                   "else ./source): outputs showing its hidden tests or answers are removed").tag(config=True)

    def preprocess(self, nb, resources):
        nb, resources = super().preprocess(nb, resources)
        import os

        folder = self.source_directory or os.path.join(os.environ.get("RLHF_COURSE_ROOT") or os.getcwd(), "source")
        removed = scrub_outputs(nb, course_secrets(folder))
        if removed:
            resources["leaking_outputs_removed"] = removed
        return nb, resources

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
_MIN_SOURCE = 20  # a source line shorter than this is too generic to prove that source/ leaked
SOLUTION_BEGIN, SOLUTION_END = "BEGIN SOLUTION", "END SOLUTION"
REMOVED_NOTE = "[output removed from the feedback: it contained text of the hidden tests or of the course's source]\n"


def _code_lines(folder: str | Path) -> set[str]:
    import nbformat

    out: set[str] = set()
    for path in sorted(Path(folder).rglob("*.ipynb")) if Path(folder).is_dir() else []:
        if ".ipynb_checkpoints" in path.parts:
            continue
        nb = nbformat.read(str(path), as_version=4)
        for cell in nb.cells:
            out |= {line.strip() for line in cell.source.split("\n")}
    return out


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


def source_only_lines(source_dir: str | Path, release_dir: str | Path | None = None) -> set[str]:
    """Distinctive lines of the source notebooks' solution regions that the release does not show.

    These are the instructor's answers: a student's *output* that contains one was read from the
    course's files (or printed from the student's own identical answer, which costs nothing to
    hide). They are never matched against the student's own code.
    """
    import nbformat

    release_dir = Path(release_dir) if release_dir is not None else Path(source_dir).parent / "release"
    released = _code_lines(release_dir)
    found: set[str] = set()
    for path in sorted(Path(source_dir).rglob("*.ipynb")):
        if ".ipynb_checkpoints" in path.parts:
            continue
        nb = nbformat.read(str(path), as_version=4)
        for cell in nb.cells:
            if cell.cell_type != "code":
                continue
            lines, inside = cell.source.split("\n"), set()
            _, inside = split_hidden(cell.source, SOLUTION_BEGIN, SOLUTION_END)
            for n, line in enumerate(lines, start=1):
                text = line.strip()
                if n in inside and len(text) >= _MIN_SOURCE and not text.startswith("#") \
                        and SOLUTION_BEGIN not in text and SOLUTION_END not in text and text not in released:
                    found.add(text)
    return found


def _squash(text: str) -> str:
    return re.sub(r"\s+", " ", text).strip()


class _Parts:
    """An HTML page split into the student's code (input areas, line by line) and everything else."""

    def __init__(self, raw: str):
        from html.parser import HTMLParser

        parts = self
        self.inputs: list[str] = []  # text of each input area
        self.outputs: list[str] = []  # text of each output area
        self.other: list[str] = []
        void = {"br", "img", "meta", "link", "input", "hr", "wbr", "source", "col", "area", "base"}

        class P(HTMLParser):
            def __init__(self):
                super().__init__(convert_charrefs=True)
                self.stack = []  # [(tag, kind)]; kind: 'input' | 'output' | None
                self.skip = 0

            def kind(self):
                for _, k in reversed(self.stack):
                    if k:
                        return k
                return None

            def handle_starttag(self, tag, attrs):
                if tag in void:
                    return
                cls = dict(attrs).get("class") or ""
                kind = None
                if not self.kind():
                    if "input_area" in cls or "jp-InputArea-editor" in cls or "jp-InputArea " in cls + " ":
                        kind = "input"
                        parts.inputs.append("")
                    elif "output_wrapper" in cls or "jp-OutputArea " in cls + " " or "jp-Cell-outputWrapper" in cls:
                        kind = "output"
                        parts.outputs.append("")
                if tag in ("script", "style"):
                    self.skip += 1
                self.stack.append((tag, kind))

            def handle_endtag(self, tag):
                if tag in void:
                    return
                while self.stack:
                    t, _ = self.stack.pop()
                    if t in ("script", "style"):
                        self.skip -= 1
                    if t == tag:
                        break

            def handle_data(self, data):
                if self.skip:
                    return
                k = self.kind()
                if k == "input":
                    parts.inputs[-1] += data
                elif k == "output":
                    parts.outputs[-1] += data
                else:
                    parts.other.append(data)

        P().feed(raw)

    def input_lines(self) -> set[str]:
        return {_squash(line) for text in self.inputs for line in text.split("\n") if line.strip()}


def _safe_files():
    """:mod:`rlhf_lab.instructor.grader.safe_files`, imported by name (this file is also loaded by its path,
    outside the package, where a relative import would not work)."""
    from rlhf_lab.instructor.grader import safe_files

    return safe_files


def read_page(path: str | Path) -> str:
    """The text of a feedback page, which must be a plain file (never a link, a FIFO or a hard link)
    of at most :data:`.safe_files.MAX_FILE_BYTES`: :func:`.safe_files.read_text`, which raises
    :class:`.safe_files.UnsafeFileError` (an :class:`OSError`) naming the student and the file."""
    safe = _safe_files()
    return safe.read_text(path, safe.MAX_FILE_BYTES, errors="replace")


def html_text(path: str | Path) -> str:
    """The visible text of an HTML file (tags dropped, entities unescaped, whitespace normalised)."""
    raw = read_page(path)
    raw = re.sub(r"<(script|style)\b.*?</\1>", " ", raw, flags=re.S | re.I)
    text = html.unescape(re.sub(r"<[^>]+>", "", raw))
    return text


def leaked_lines(html_path: str | Path, secret_lines: set[str], source_lines: set[str] = frozenset()) -> list[str]:
    """The hidden-test (``secret_lines``) or source-only lines that appear in a feedback HTML file.

    A hidden-test line leaks when it is a whole line of the page's code, or appears anywhere in an
    output or in the page's prose. A line of the student's own code that merely contains a few of
    the same words is not a leak. ``source_lines`` (:func:`source_only_lines`) leak only from
    outputs, and only when they are not lines of the page's own code: the student's own code may
    well equal the instructor's answer, and a traceback quotes it.

    The page is read with :func:`read_page`: a page that is a link, a FIFO or too large raises
    :class:`.safe_files.UnsafeFileError` instead of being followed (or blocking).
    """
    raw = read_page(html_path)
    parts = _Parts(raw)
    code = parts.input_lines()
    rest = _squash(" ".join(parts.outputs) + " " + " ".join(parts.other))
    outputs = _squash(" ".join(parts.outputs))
    leaks = []
    for line in sorted(secret_lines):
        s = _squash(line)
        if s in code or s in rest:
            leaks.append(line)
    for line in sorted(source_lines):
        s = _squash(line)
        # a traceback quoting the student's own code is no leak, even when that code equals the answer
        if s in outputs and s not in code:
            leaks.append(line)
    text = html_text(html_path)
    if BEGIN in text or END in text:
        leaks.append(f"a '{BEGIN}' delimiter")
    return leaks


def check_feedback(feedback_dir: str | Path, source_dir: str | Path, release_dir: str | Path | None = None) -> dict:
    """``{html file: [leaked lines]}`` for every feedback file that leaks (empty dict: all clean)."""
    secrets = hidden_lines(source_dir)
    answers = source_only_lines(source_dir, release_dir)
    out = {}
    for path in sorted(Path(feedback_dir).rglob("*.html")):
        try:
            leaks = leaked_lines(path, secrets, answers)
        except OSError as exc:  # a link, a FIFO, too large: not read, and not releasable
            leaks = [f"[not checked: {exc}]"]
        if leaks:
            out[str(path)] = leaks
    return out


def output_text(output: dict) -> str:
    """The text a notebook output shows (stream text, text/plain and text/html data, error lines)."""
    if output.get("output_type") == "stream":
        text = output.get("text", "")
        return "".join(text) if isinstance(text, list) else str(text)
    if output.get("output_type") == "error":
        return strip_ansi("\n".join(output.get("traceback") or []) + "\n" + str(output.get("evalue", "")))
    data = output.get("data") or {}
    pieces = []
    for mime in ("text/plain", "text/html", "text/markdown", "text/latex"):
        value = data.get(mime)
        if value:
            pieces.append("".join(value) if isinstance(value, list) else str(value))
    return "\n".join(pieces)


def leaking_output(output: dict, secrets: set[str]) -> bool:
    """Whether ``output`` shows one of the ``secrets`` lines (or a hidden-test delimiter)."""
    text = _squash(html.unescape(re.sub(r"<[^>]+>", " ", output_text(output))))
    return BEGIN in text or END in text or any(_squash(line) in text for line in secrets)


def course_secrets(source_dir: str | Path) -> set[str]:
    """Hidden-test lines and source-only answer lines of the course (cached per folder and change time)."""
    source_dir = Path(source_dir)
    try:
        stamp = max((p.stat().st_mtime_ns for p in source_dir.rglob("*.ipynb")), default=0)
    except OSError:
        stamp = 0
    key = (str(source_dir.resolve()), stamp)
    if _SECRETS.get("key") != key:
        _SECRETS["key"] = key
        _SECRETS["lines"] = hidden_lines(source_dir) | source_only_lines(source_dir) if source_dir.is_dir() else set()
    return _SECRETS["lines"]


_SECRETS: dict = {}


def scrub_outputs(nb, secrets: set[str]) -> int:
    """Replace every output of ``nb`` that shows hidden-test or source text by a note; how many."""
    removed = 0
    for cell in nb.cells:
        if cell.get("cell_type") != "code":
            continue
        outputs = []
        for out in cell.get("outputs", []):
            if out.get("output_type") in ("stream", "display_data", "execute_result") and leaking_output(out, secrets):
                import nbformat

                out = nbformat.v4.new_output("stream", name="stdout", text=REMOVED_NOTE)
                removed += 1
            outputs.append(out)
        cell.outputs = outputs
    return removed


def _main(argv=None) -> int:
    import argparse

    parser = argparse.ArgumentParser(description="Check feedback HTML for hidden-test code")
    parser.add_argument("--check", nargs=2, metavar=("FEEDBACK_DIR", "SOURCE_DIR"), required=True)
    parser.add_argument("--release", metavar="RELEASE_DIR", help="default: release/ beside SOURCE_DIR")
    args = parser.parse_args(argv)
    leaks = check_feedback(*args.check, release_dir=args.release)
    for path, lines in leaks.items():
        print(f"{path}: {len(lines)} hidden line(s) leaked, e.g. {lines[0]!r}")
    if not leaks:
        print("no hidden-test code in the feedback")
    return 1 if leaks else 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(_main())
