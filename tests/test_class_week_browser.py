"""One week of a class in real browsers: a student in the student JupyterLab (jupyter/student) and
an instructor in Formgrader, both in headless Debian Chromium, through the course's exchange.

The student fetches, validates and submits from the Assignment List; the instructor collects and
autogrades in Formgrader, enters a score and a comment for the written answer, generates and
releases feedback; the student fetches it and sees the score and the comment, and no hidden test.
A one-notebook toy course (with the course's real nbgrader_config.py and student config) keeps it
quick; the command-level exchange test (test_exchange.py) uses the real course.
"""
from __future__ import annotations

import contextlib
import re
import shutil
from pathlib import Path

import nbformat
import pytest

from browser_support import ARTIFACTS, REPO, chromium_page, jupyter_lab, require_chromium
from rlhf_lab.instructor.operations import exchange
from rlhf_lab.instructor.classrun import pipeline

pytestmark = pytest.mark.browser

TOY = "toy"
STUDENT = "ada"
HIDDEN_MARKER = "hidden_check_zq81"
COMMENT = "Right idea; also name the clip bound you mean."
ESSAY_SCORE = "1.5"


def _cell(kind, source, **md):
    cell = (nbformat.v4.new_code_cell if kind == "code" else nbformat.v4.new_markdown_cell)(source)
    if md:
        cell.metadata["nbgrader"] = {"schema_version": 3, "task": False, "grade": False, "solution": False,
                                     "locked": False, **md}
    return cell


def build_course(root: Path) -> Path:
    """A one-notebook course: a function to write, a test with a hidden part, a written answer."""
    (root / "source" / TOY).mkdir(parents=True)
    shutil.copy(REPO / "nbgrader_config.py", root / "nbgrader_config.py")
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nb.cells = [
        _cell("markdown", "Write `add(a, b)`.", locked=True, grade_id="intro"),
        _cell("code", "def add(a, b):\n    ### BEGIN SOLUTION\n    return a + b\n    ### END SOLUTION",
              solution=True, grade_id="answer_add"),
        _cell("code", "assert add(1, 2) == 3\n### BEGIN HIDDEN TESTS\n"
                      f"{HIDDEN_MARKER} = add(10, -3)\nassert {HIDDEN_MARKER} == 7\n### END HIDDEN TESTS",
              grade=True, locked=True, grade_id="test_add", points=2),
        _cell("markdown", "Why clip the ratio? (2 points)", locked=True, grade_id="essay_question"),
        _cell("markdown", "### BEGIN SOLUTION\n**Model answer.** To bound one step.\n### END SOLUTION",
              grade=True, solution=True, grade_id="essay", points=2),
    ]
    nbformat.write(nb, root / "source" / TOY / "toy.ipynb")
    (root / "roster.csv").write_text("id,first_name,last_name,email\nada,Ada,Okafor,ada@example.edu\n")
    db = "sqlite:///" + str(root / "gradebook.db")
    for args in (["generate_assignment", TOY, "--force"], ["db", "student", "import", str(root / "roster.csv")]):
        run = pipeline.run_nbgrader(args, root, db)
        assert run.ok, run.output[-3000:]
    return root


def _text(page) -> str:
    return re.sub(r"\s+", " ", page.inner_text("body"))


def _ok_modal(page, expect: str):
    """Wait for Formgrader's result dialog, check it reports success, close it."""
    modal = page.locator(".modal.in, .modal.show").first
    modal.wait_for(state="visible", timeout=180_000)
    text = re.sub(r"\s+", " ", modal.inner_text())
    assert expect in text, text
    modal.locator("button", has_text="OK").first.click()
    modal.wait_for(state="detached", timeout=30_000)


def _open_nbgrader_menu(page, item: str):
    """Open the Nbgrader menu until ``item`` shows in it: a click on the menu bar right after an
    Escape (or while a busy machine is still drawing the menu) can toggle the menu shut again."""
    entry = page.locator(".lm-Menu-itemLabel", has_text=item).first
    for _ in range(6):
        if not entry.is_visible():
            page.locator(".lm-MenuBar-itemLabel", has_text="Nbgrader").first.click()
        try:
            entry.wait_for(state="visible", timeout=10_000)
            return entry
        except Exception:  # noqa: BLE001 - closed again: close for sure, then open once more
            page.keyboard.press("Escape")
    entry.wait_for(state="visible", timeout=10_000)
    return entry


def _student(page, lab, step: str):
    if step == "open":
        page.goto(f"{lab.base_url}/lab?token={lab.token}")
        page.wait_for_selector("#jp-main-dock-panel", timeout=120_000)
        _open_nbgrader_menu(page, "Assignment List")
        items = [re.sub(r"\s+", " ", t).strip() for t in page.locator(".lm-Menu-itemLabel").all_inner_texts()]
        page.keyboard.press("Escape")
        return items
    if step == "list":
        _open_nbgrader_menu(page, "Assignment List").click()
        page.wait_for_selector("#released_assignments_list", timeout=60_000)


def _shot(page, name):
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    with contextlib.suppress(Exception):
        page.screenshot(path=str(ARTIFACTS / f"class-week-{name}.png"), full_page=True)


def test_a_week_of_class_student_and_instructor_in_the_browser(tmp_path):
    require_chromium()
    root = build_course(tmp_path / "course")
    home = tmp_path / "home"
    home.mkdir()
    ex = exchange.ensure_exchange(path=tmp_path / "exchange")
    exchange.release(TOY, root, "sqlite:///" + str(root / "gradebook.db"), ex)
    # the student's server runs on the course's student config dir as it is in the repository
    # (its own Jupyter data dir: nbgrader keeps each student's submission cache there)
    student_env = {"RLHF_EXCHANGE": str(ex), "RLHF_STUDENT_ID": STUDENT,
                   "JUPYTER_DATA_DIR": str(tmp_path / "student_data")}
    with jupyter_lab(home, tmp_path / "student_state", wait=False, config_dir=REPO / "jupyter" / "student",
                     extra_env=student_env) as s_lab, \
            jupyter_lab(root, tmp_path / "instructor_state", wait=False,
                        extra_env={"RLHF_EXCHANGE": str(ex), "RLHF_STUDENT_ID": None}) as i_lab, \
            chromium_page() as page:
        s_lab.wait_ready()
        i_lab.wait_ready()
        page.set_default_timeout(60_000)
        try:
            _drive(page, s_lab, i_lab, root, home, ex)
        except BaseException:
            _shot(page, "failure")
            raise


def _drive(page, s_lab, i_lab, root: Path, home: Path, ex: Path):
    # ---- the student's JupyterLab: no instructor tools
    items = _student(page, s_lab, "open")
    assert "Assignment List" in items and "Course List" in items, items
    assert not any(i.startswith("Formgrader") or i == "Create assignment" for i in items), items
    with pytest.raises(Exception):
        s_lab.api("/formgrader/api/assignments")  # the server extension is off as well
    # ---- fetch from the Assignment List
    _student(page, s_lab, "list")
    released = page.locator("#released_assignments_list")
    released.locator(".list_item", has_text=TOY).locator("button", has_text="Fetch").click()
    fetched = page.locator("#fetched_assignments_list")
    fetched.locator(".list_item", has_text=TOY).first.wait_for(timeout=60_000)
    nb_path = home / TOY / "toy.ipynb"
    assert nb_path.exists()
    # the student's work (what typing in the notebook would save)
    nb = nbformat.read(nb_path, as_version=4)
    for cell in nb.cells:
        gid = cell.metadata.get("nbgrader", {}).get("grade_id")
        if gid == "answer_add":
            cell.source = "def add(a, b):\n    return a + b"
        elif gid == "essay":
            cell.source = "Clipping keeps one update from moving the policy too far."
    nbformat.write(nb, nb_path)
    # ---- validate, then submit
    fetched.locator("a.assignment-notebooks-link").first.click()
    fetched.locator("button", has_text="Validate").first.click()
    dialog = page.locator(".jp-Dialog")
    dialog.wait_for(timeout=120_000)
    verdict = re.sub(r"\s+", " ", dialog.inner_text())
    assert "Success" in verdict or "passes" in verdict, verdict
    dialog.locator("button", has_text="Ok").first.click()
    fetched.locator(".list_item", has_text=TOY).locator("button", has_text="Submit").first.click()
    submitted = page.locator("#submitted_assignments_list")
    submitted.locator(".list_item", has_text=TOY).first.wait_for(timeout=60_000)
    inbound = ex / "rlhf-ppo" / "inbound"
    for _ in range(120):
        if any(inbound.iterdir()):
            break
        page.wait_for_timeout(250)
    assert [p.name.split("+")[0] for p in inbound.iterdir()] == [STUDENT]
    assert "There are no submitted assignments" not in submitted.inner_text()

    # ---- the instructor in Formgrader: collect, autograde
    fg = f"{i_lab.base_url}/formgrader"
    page.goto(f"{fg}/manage_assignments?token={i_lab.token}")
    row = page.locator("tr", has_text=TOY).first
    row.locator(".collect a").click()
    _ok_modal(page, "Successfully collected")
    page.goto(f"{fg}/manage_submissions/{TOY}")
    page.locator("tr", has_text="Okafor").first.locator(".autograde a").click()  # the roster's name
    _ok_modal(page, "Successfully autograded")
    # ---- hand grading: score and comment for the written answer
    page.goto(f"{fg}/gradebook/{TOY}/toy")
    page.locator("a", has_text="Submission #").first.click()
    page.wait_for_selector("input#essay.score")
    # Formgrader binds the inputs to its grade and comment models only once both have been
    # fetched (and rendering them then resets the input): typing before that saves nothing.
    page.wait_for_function(
        "() => window.formgrader && formgrader.grades && formgrader.grades.loaded"
        " && formgrader.comments && formgrader.comments.loaded", timeout=120_000)
    with page.expect_response(lambda r: "/api/grade/" in r.url and r.request.method == "PUT"):
        page.fill("input#essay.score", ESSAY_SCORE)
        page.press("input#essay.score", "Tab")
    with page.expect_response(lambda r: "/api/comment/" in r.url and r.request.method == "PUT"):
        page.fill("textarea#essay-comment", COMMENT)
        page.press("textarea#essay-comment", "Tab")
    # ---- generate and release feedback
    page.goto(f"{fg}/manage_assignments")
    row = page.locator("tr", has_text=TOY).first
    row.locator(".generate-feedback a").click()
    _ok_modal(page, "Successfully generated feedback")
    row = page.locator("tr", has_text=TOY).first
    row.locator(".release-feedback a").click()
    _ok_modal(page, "Successfully released feedback")

    # ---- the student fetches the feedback
    page.goto(f"{s_lab.base_url}/lab?token={s_lab.token}")
    page.wait_for_selector("#jp-main-dock-panel", timeout=120_000)
    _student(page, s_lab, "list")
    submitted = page.locator("#submitted_assignments_list")
    submitted.locator("button", has_text="Fetch Feedback").first.click()
    submitted.locator("a", has_text="view feedback").first.wait_for(timeout=60_000)
    html_files = sorted((home / TOY / "feedback").rglob("toy.html"))
    assert len(html_files) == 1, html_files
    rel = html_files[0].relative_to(home).as_posix()
    page.goto(f"{s_lab.base_url}/files/{rel}?token={s_lab.token}")
    text = _text(page)
    _shot(page, "feedback")
    assert f"toy (Score: {2 + float(ESSAY_SCORE)} / 4.0)" in text, text[:1500]
    assert f"Written response (Score: {float(ESSAY_SCORE)} / 2.0)" in text
    assert COMMENT in text
    assert HIDDEN_MARKER not in text and "BEGIN HIDDEN TESTS" not in text
    assert "hidden tests: 2 lines not shown" in text
