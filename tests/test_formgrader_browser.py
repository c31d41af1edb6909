"""Formgrader's Autograde button gives the course command's grades, in a real browser.

A copy of the course with two submissions of ``a1_ppo_objective`` in ``submitted/``: a correct
control and a hostile one in which a locked read-only cell was unlocked, edited and moved to the
end of the notebook (the integrity pre-flight withholds the tests after its place). A real JupyterLab (the venv's, on 127.0.0.1,
started and stopped by the test, see ``browser_support.py``) serves the copy; headless Debian
Chromium opens Formgrader's "Manage Submissions" page for the assignment and clicks Autograde on
each student's row, waiting for nbgrader's "Successfully autograded" dialog. Then the copy's
gradebook, read row by row (auto score, manual score, max score, needs-manual-grade, the notebook's
flag and the pre-flight's comment), must equal the gradebook the course command
(:func:`rlhf_lab.instructor.classrun.pipeline.run_class`) leaves for the same files in another copy, and the
totals Formgrader's own API reports must equal the course command's totals.

Before the pre-flight was wired through ``nbgrader_config.py``'s convert hooks, the button kept the
hostile's auto scores (no override, no flag): this test fails on that.

Run with ``pytest -m browser``; skips only when Chromium is not installed. Screenshots go to
``artifacts/browser/``.
"""
from __future__ import annotations

import contextlib
import re

import nbformat
import pytest
from browser_support import ARTIFACTS, chromium_page, jupyter_lab, require_chromium
from course_support import fresh_course, own_db, write_submissions
from test_preflight_hook import ASSIGNMENT, CONTROL, HOSTILE, NB1, _submissions, gradebook_rows, withheld_tests

from rlhf_lab.instructor.classrun import pipeline

pytestmark = [pytest.mark.browser, pytest.mark.slow, pytest.mark.timeout(2400)]

STUDENTS = (CONTROL, HOSTILE)


def _two_students() -> dict:
    subs = _submissions()
    return {s: subs[s] for s in STUDENTS}


def _shot(page, name: str) -> None:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    with contextlib.suppress(Exception):
        page.screenshot(path=str(ARTIFACTS / f"formgrader-{name}.png"), full_page=True)


def _api(page, lab, path: str):
    """GET ``path`` through the browser's own session (Formgrader's API takes the login cookie the
    page got, not a token header), with a patient timeout (the API opens the gradebook)."""
    resp = page.request.get(f"{lab.base_url}{path}", timeout=300_000)
    assert resp.ok, (path, resp.status, resp.text()[:500])
    return resp.json()


def _click_autograde(page, student: str) -> str:
    """Click the Autograde link of ``student``'s row; return the text of the result dialog."""
    row = page.locator("tr", has=page.locator("td.student-id", has_text=re.compile(f"^{re.escape(student)}$")))
    row.first.wait_for(timeout=300_000)  # the page lists submissions once Formgrader's API answered
    row.first.locator(".autograde a").click()
    modal = page.locator(".modal.in, .modal.show").first
    modal.wait_for(state="visible", timeout=900_000)  # a sandboxed autograde of two notebooks
    text = re.sub(r"\s+", " ", modal.inner_text())
    modal.locator("button", has_text="OK").first.click()
    modal.wait_for(state="detached", timeout=30_000)
    return text


def test_formgrader_autograde_button_matches_the_course_command(tmp_path):
    require_chromium()
    base = tmp_path / "base"
    # the course command on the same files, in its own copy
    cmd_root = fresh_course(tmp_path / "cmd" / "course", base)
    folder = write_submissions(cmd_root / "custom_submissions", _two_students())
    cmd_run = pipeline.run_class(folder, root=cmd_root, db_url=own_db(cmd_root), names=[ASSIGNMENT],
                                 fresh=False, regenerate=False)
    expected = gradebook_rows(own_db(cmd_root), ASSIGNMENT)

    # the copy Formgrader grades: the same files in submitted/, the students known to the gradebook
    root = fresh_course(tmp_path / "fg" / "course", base)
    write_submissions(root / "submitted", _two_students())
    from nbgrader.api import Gradebook

    with Gradebook(own_db(root), pipeline.COURSE_ID) as gb:
        for student in STUDENTS:
            gb.update_or_create_student(student)
    env = {"RLHF_COURSE_ROOT": str(root), "RLHF_COURSE_DB": own_db(root),
           # grade under the server as the course command grades (see pipeline.nbgrader_env)
           "PYTEST_CURRENT_TEST": None, "MPLBACKEND": None, "NBGRADER_EXECUTION": None}
    with jupyter_lab(root, tmp_path / "lab_state", wait=False, extra_env=env) as lab, chromium_page() as page:
        lab.wait_ready()
        page.set_default_timeout(60_000)
        try:
            # log in the way an instructor's browser does (the token once, then the session cookie)
            page.goto(f"{lab.base_url}/formgrader/manage_assignments?token={lab.token}")
            page.locator("tr", has_text=ASSIGNMENT).first.wait_for(timeout=300_000)
            listed = {x["student"] for x in _api(page, lab, f"/formgrader/api/submissions/{ASSIGNMENT}")}
            assert set(STUDENTS) <= listed, (listed, lab.log_tail())
            page.goto(f"{lab.base_url}/formgrader/manage_submissions/{ASSIGNMENT}")
            for student in STUDENTS:
                verdict = _click_autograde(page, student)
                assert "Successfully autograded" in verdict, (student, verdict, lab.log_tail())
            _shot(page, "after-autograde")
            api = {s["student"]: (float(s["score"]), float(s["max_score"]))
                   for s in _api(page, lab, f"/formgrader/api/submissions/{ASSIGNMENT}")}
        except BaseException:
            _shot(page, "failure")
            print(lab.log_tail(200))
            raise
    got = gradebook_rows(own_db(root), ASSIGNMENT)

    # the tests after the moved cell are withheld on both paths (from the design)
    withheld = withheld_tests(nbformat.read(cmd_root / "release" / ASSIGNMENT / f"{NB1}.ipynb", as_version=4))
    assert withheld
    for rows in (expected, got):
        assert all(rows[(HOSTILE, NB1, gid)][1] == 0.0 for gid in withheld), rows
        assert rows[(HOSTILE, NB1, "<flagged>")] is True
        assert all(rows[(CONTROL, NB1, gid)][0] == rows[(CONTROL, NB1, gid)][2] for gid in withheld)
    # row by row, the button's gradebook is the course command's
    assert sorted(got) == sorted(expected)
    diff = {k: (expected[k], got[k]) for k in expected if expected[k] != got[k]}
    assert not diff, diff
    totals = {s: tuple(map(float, cmd_run.grades.totals[(s, ASSIGNMENT)])) for s in STUDENTS}
    assert {s: api[s] for s in STUDENTS} == totals
    assert totals[HOSTILE][0] < totals[CONTROL][0]
