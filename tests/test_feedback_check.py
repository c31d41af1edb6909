"""The hidden-text check the pipeline runs on every feedback page, and feedback free of library noise.

Fast tests build small pages and notebooks by hand; the ``slow`` ones read the feedback of the
bundled example class (graded once per session, ``bundled_class_run`` in course_support.py).
"""
from __future__ import annotations

import html
import re
from pathlib import Path

import nbformat
import pytest

from course_support import LIBRARY_LOG, REPO, bundled_class_run  # noqa: F401  (fixtures are used by name)
from fixtures import submissions
from rlhf_lab.instructor.grader import feedback_filter as ff
from rlhf_lab.instructor.classrun import pipeline

HIDDEN = 'grading.judge("test_clip_boundary")'
ANSWER = "return jnp.minimum(ratio * advantage, jnp.clip(ratio, 1 - epsilon, 1 + epsilon) * advantage)"


def page(inputs: list[str], outputs: list[str], prose: str = "") -> str:
    """A page laid out as nbconvert's classic template lays out a feedback notebook."""
    cells = []
    for code, out in zip(inputs, outputs):
        cells.append(f'<div class="cell code_cell"><div class="input"><div class="input_area">'
                     f'<div class="highlight"><pre>{code}</pre></div></div></div>'
                     f'<div class="output_wrapper"><div class="output"><div class="output_subarea">'
                     f'<pre>{out}</pre></div></div></div></div>')
    return f"<html><body><p>{prose}</p>{''.join(cells)}</body></html>"


def write(tmp_path: Path, html: str) -> Path:
    path = tmp_path / "nb.html"
    path.write_text(html, encoding="utf-8")
    return path


def test_own_answer_sharing_words_with_a_hidden_test_is_not_a_leak(tmp_path):
    code = f"checked = {HIDDEN} or my_own_check()  # the same words, inside a longer line of mine"
    assert ff.leaked_lines(write(tmp_path, page([code], ["ok"])), {HIDDEN}) == []


def test_a_hidden_test_line_of_the_code_or_in_an_output_is_a_leak(tmp_path):
    assert ff.leaked_lines(write(tmp_path, page([HIDDEN], [""])), {HIDDEN}) == [HIDDEN]
    assert ff.leaked_lines(write(tmp_path, page(["x = 1"], [f"the test was {HIDDEN}!"])), {HIDDEN}) == [HIDDEN]
    assert ff.leaked_lines(write(tmp_path, page(["x = 1"], [""], prose=f"hint: {HIDDEN}")), {HIDDEN}) == [HIDDEN]


def test_instructor_answer_counts_only_in_an_output(tmp_path):
    own = write(tmp_path, page([ANSWER], ["[ 2.4 -1.6]"]))
    assert ff.leaked_lines(own, set(), {ANSWER}) == []  # the student wrote the same answer: theirs
    printed = write(tmp_path, page(["print(open(path).read())"], [f"def f():\n    {ANSWER}"]))
    assert ff.leaked_lines(printed, set(), {ANSWER}) == [ANSWER]


def test_a_traceback_quoting_the_students_own_answer_is_not_a_leak(tmp_path):
    """A student whose code equals the model answer and whose cell fails sees that line quoted in the
    traceback: their own text, not the instructor's. Quoted without being in the page's code, it leaks."""
    own = write(tmp_path, page([ANSWER], [f"Traceback (most recent call last):\n----> 1 {ANSWER}\nValueError: bad"]))
    assert ff.leaked_lines(own, set(), {ANSWER}) == []
    elsewhere = write(tmp_path, page(["y = 1"], [f"Traceback (most recent call last):\n----> 1 {ANSWER}"]))
    assert ff.leaked_lines(elsewhere, set(), {ANSWER}) == [ANSWER]


def test_source_only_lines_are_the_answers_the_release_does_not_show():
    answers = ff.source_only_lines(REPO / "source", REPO / "release")
    released = ff._code_lines(REPO / "release")
    assert answers and not answers & released
    assert all(len(line) >= 20 and not line.startswith("#") for line in answers)


def test_outputs_showing_hidden_or_source_text_are_replaced_by_a_note():
    nb = nbformat.v4.new_notebook()
    cell = nbformat.v4.new_code_cell("print(secret)")
    cell.outputs = [nbformat.v4.new_output("stream", name="stdout", text=f"    {ANSWER}\n"),
                    nbformat.v4.new_output("stream", name="stdout", text="loss 0.25\n"),
                    nbformat.v4.new_output("execute_result", data={"text/plain": f"'{HIDDEN}'"}, execution_count=1)]
    nb.cells = [cell]
    assert ff.scrub_outputs(nb, {ANSWER, HIDDEN}) == 2
    texts = [ff.output_text(o) for o in nb.cells[0].outputs]
    assert texts == [ff.REMOVED_NOTE, "loss 0.25\n", ff.REMOVED_NOTE]


NOISE = LIBRARY_LOG


def test_the_noise_pattern_matches_xla_log_lines():
    assert NOISE.search("W0000 00:00:1733050000.123456   42 cpu_aot_loader.cc:123] Assume version compatibility")
    assert NOISE.search("E1201 12:00:00.000001 1234 pjrt_executable.cc:99] something")
    assert not NOISE.search("loss 0.25 at step 1201")


@pytest.mark.slow
def test_the_course_own_correct_feedback_passes_the_check(bundled_class_run):
    """`feedback_filter --check` exits 0 on the feedback of the correct students (the course's own)."""
    root = bundled_class_run.root
    pages = sorted((root / "feedback" / "ada_correct").rglob("*.html"))
    assert pages
    answers = ff.source_only_lines(root / "source", root / "release")
    # the correct student's code does share lines with the instructor's answers: a whole-page
    # search would flag them; the check must not
    squashed = " ".join(ff._squash(ff.html_text(p)) for p in pages)
    assert any(ff._squash(line) in squashed for line in answers)
    assert ff._main(["--check", str(root / "feedback" / "ada_correct"), str(root / "source")]) == 0
    assert bundled_class_run.feedback_leaks == {}  # the pipeline ran the same check and removed nothing
    assert "feedback_withheld_for_leaks" in bundled_class_run.report()


#: What the bundled class's noisy student (``<name>_noisy_warnings``, ``_noisy`` in tests/fixtures/submissions.py)
#: writes to stderr on purpose, line by line: a UserWarning, a JAX UserWarning (float64), the source
#: lines Python quotes under them, and a native-looking log line.
STUDENT_STDERR = re.compile(r"UserWarning: a harmless warning printed by a student helper$|^ +_noisy_warnings\.warn\("
                            r"|UserWarning: Explicitly requested dtype float64 requested in zeros |^ +_noisy_jnp\.zeros\("
                            r"|^W0000 00:00:00\.000000 1 noisy\.cc:1\] harmless native log line$")
#: A line the course relabelled from stderr (StderrToStdout's prefix in nbgrader_config.py).
RELABELLED = re.compile(r"^\[stderr\] ?(.*)$", re.M)
#: The same in a page's HTML, where the first line of an output follows its ``<pre>``.
HTML_RELABELLED = re.compile(r"(?:^|<pre>)\[stderr\] ?([^\n]*?)(?:</pre>.*)?$", re.M)


def stderr_lines(path: Path) -> list[str]:
    """Every line of stderr in a feedback page or an autograded notebook: relabelled (``[stderr] ``
    lines) or not (an ``output_stderr`` block of a page, a ``stderr`` stream of a notebook)."""
    if path.suffix == ".ipynb":
        nb = nbformat.read(path, as_version=4)
        out = []
        for cell in nb.cells:
            for o in cell.get("outputs", []):
                if o.get("output_type") == "stream":
                    text = o.get("text", "")
                    out += text.splitlines() if o.get("name") == "stderr" else RELABELLED.findall(text)
        return out
    raw = path.read_text(encoding="utf-8", errors="replace")
    blocks = re.findall(r'class="[^"]*output_stderr[^"]*"[^>]*>\s*<pre>(.*?)</pre>', raw, re.S)
    return [html.unescape(line) for block in blocks for line in block.splitlines()] + \
        [html.unescape(m) for m in HTML_RELABELLED.findall(raw)]


def test_stderr_lines_are_found_relabelled_or_not(tmp_path):
    page = tmp_path / "p.html"
    page.write_text('<div class="output_subarea output_stream output_stderr output_text"><pre>raw &amp; loud\n</pre>'
                    '</div><pre>[stderr] Fontconfig error: Cannot load default config file\nloss 0.25\n</pre>')
    assert stderr_lines(page) == ["raw & loud", "Fontconfig error: Cannot load default config file"]
    assert NOISE.search("Fontconfig error: Cannot load default config file: No such file: (null)")
    own = ["/tmp/ipykernel_2/38.py:24: UserWarning: a harmless warning printed by a student helper",
           '  _noisy_warnings.warn("a harmless warning printed by a student helper", UserWarning)',
           "W0000 00:00:00.000000 1 noisy.cc:1] harmless native log line"]
    assert all(STUDENT_STDERR.search(line) for line in own)
    assert not STUDENT_STDERR.search("Fontconfig error: Cannot load default config file")


@pytest.mark.slow
def test_no_library_log_noise_in_any_feedback_page(bundled_class_run):
    """No page carries library log noise, and no page (nor the autograded notebook it is made from)
    carries any stderr at all, except what the noisy student's own functions write on purpose."""
    root = bundled_class_run.root
    pages = sorted((root / "feedback").rglob("*.html"))
    assert pages
    student = submissions.noisy_student(0)

    def library_noise(path: Path):
        lines = html.unescape(path.read_text(encoding="utf-8", errors="replace")).splitlines()
        if student in path.relative_to(root).parts:  # minus the lines the student wrote on purpose
            lines = [line for line in lines if not STUDENT_STDERR.search(HTML_RELABELLED.sub(r"\1", line))]
        found = NOISE.search("\n".join(lines))
        return found.group(0) if found else None

    noisy = {str(p): library_noise(p) for p in pages if library_noise(p)}
    assert not noisy, noisy
    notebooks = sorted((root / "autograded").rglob("*.ipynb"))
    assert any(student in p.parts for p in notebooks), "the noisy student was not graded"
    found, own = {}, 0
    for path in pages + notebooks:
        lines = stderr_lines(path)
        if student in path.relative_to(root).parts:
            own += sum(1 for line in lines if STUDENT_STDERR.search(line))
            lines = [line for line in lines if not STUDENT_STDERR.search(line)]
        if lines:
            found[str(path.relative_to(root))] = lines[:5]
    assert not found, found
    assert own, "the noisy student's own stderr was not found: the check would see no stderr at all"


@pytest.mark.slow
def test_the_pipeline_removes_a_page_that_leaks(bundled_class_run, tmp_path):
    """check_written_feedback on a copy: a page carrying a hidden-test line is removed and reported."""
    import shutil

    root = tmp_path / "course"
    for name in ("source", "release"):
        shutil.copytree(bundled_class_run.root / name, root / name)
    src = next((bundled_class_run.root / "feedback" / "ada_correct").glob("*/*.html"))
    assignment = src.parent.name
    clean = root / "feedback" / "ada_correct" / assignment / src.name
    clean.parent.mkdir(parents=True)
    shutil.copy(src, clean)
    secret = sorted(ff.hidden_lines(root / "source"))[0]
    bad = clean.with_name("zz_leaky.html")
    bad.write_text(src.read_text(encoding="utf-8").replace("</body>", f"<pre>{secret}</pre></body>"), encoding="utf-8")
    found = pipeline.check_written_feedback(assignment, root)
    assert list(found) == [str(bad.relative_to(root))] and secret in found[str(bad.relative_to(root))]
    assert clean.exists() and not bad.exists()
