"""nbgrader preprocessors used by the course's autograde pipeline (wired in ``nbgrader_config.py``)."""
from __future__ import annotations

from nbgrader.preprocessors import NbGraderPreprocessor
from traitlets import Unicode


def relabel_stderr(outputs: list, prefix: str) -> int:
    """Turn every ``stream``/``stderr`` output in ``outputs`` into ``stdout`` in place.

    Each line of the text gets ``prefix`` so a reader still sees what went to stderr.
    Returns how many outputs were relabelled. ``error`` outputs (exceptions, failed asserts,
    timeouts, a dead kernel) are left alone, so they still score zero.
    """
    changed = 0
    for output in outputs:
        if output.get("output_type") == "stream" and output.get("name") == "stderr":
            text = output.get("text", "")
            if isinstance(text, list):  # nbformat allows a list of lines
                text = "".join(text)
            output["name"] = "stdout"
            output["text"] = "".join(prefix + line for line in text.splitlines(keepends=True))
            changed += 1
    return changed


class StderrToStdout(NbGraderPreprocessor):
    """Keep harmless stderr (library warnings) from zeroing an autograded test cell.

    ``nbgrader.utils.determine_grade`` scores a test cell 0 when any output is a stderr stream,
    the same as an exception. In this course a test fails only by raising (``AssertionError`` from
    the grading primitives, or any exception from the student's code), which nbgrader records as an
    ``error`` output. Warnings that JAX, NumPy or matplotlib print while a correct answer runs are
    therefore relabelled as stdout (prefixed, still visible in the feedback) before grades are
    saved. Writing to stderr can only ever have *cost* points, so this cannot award points for a
    failing cell.
    """

    prefix = Unicode("[stderr] ", help="Prefix put before each relabelled stderr line").tag(config=True)

    def preprocess_cell(self, cell, resources, cell_index):
        if cell.cell_type == "code":
            n = relabel_stderr(cell.get("outputs", []), self.prefix)
            if n:
                resources.setdefault("relabelled_stderr_cells", []).append(cell_index)
        return cell, resources
