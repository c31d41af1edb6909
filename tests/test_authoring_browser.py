"""Authoring the course in a real JupyterLab, driven by headless Chromium.

Each test copies the course (``source/``, ``content/``, ``jupytext.toml``, ``nbgrader_config.py``,
``jupyter/``) into a temporary folder and starts ``jupyter lab`` there on 127.0.0.1 the way
``make lab`` does: ``JUPYTER_CONFIG_DIR`` is the copy's ``jupyter/instructor`` (the course's
pre-save hook) and the server's root is the copy (jupytext finds the copy's ``jupytext.toml``).
The repository itself is never written.

* ``test_points_changed_in_create_assignment_panel``: opens
  ``source/a1_ppo_objective/01_clipped_objective.ipynb``, opens nbgrader's Create Assignment panel
  in the right sidebar, selects the test cell ``test_ppo_surrogate``, changes its points from 6
  to 7 in the panel and saves with Ctrl+S. Then, from the copy's files: the notebook's metadata
  says 7; jupytext rewrote the paired ``content/.../01_clipped_objective.py`` with ``"points": 7``
  in that cell's header; the saved notebook is in canonical form (no outputs, no
  ``language_info`` although the browser sent it: the pre-save hook ran); the lint (in this
  process and as ``make lint`` runs it) reports the points table of that notebook (rule
  ``points-table``) and nothing else new; ``nbgrader generate_assignment --force`` on the copy,
  with a throwaway gradebook, releases the notebook with 7 points for that cell.
* ``test_save_without_changes_keeps_the_files``: opens a source notebook, waits for its kernel,
  saves it with Ctrl+S without changing anything: the notebook and its text pair are
  byte-identical to before (the server did write both), and the lint and pair checks find
  nothing new.

Only the copy's assignment ``a1_ppo_objective`` has to be clean beforehand; findings elsewhere in the
copy (work in progress) are taken as the baseline. Waits are on the page's state (panel widgets,
the tab's modified mark) and on the files, never fixed sleeps; autosave is off so the only save
is the test's.

Screenshots go to ``artifacts/browser/``. Run alone with ``pytest -m browser``; skips only when
Chromium is not installed.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import nbformat
import pytest
from browser_support import ARTIFACTS, REPO, chromium_page, jupyter_lab, require_chromium, wait_for_kernel_idle

from rlhf_lab.instructor import authoring
from rlhf_lab.instructor.classrun import pipeline

pytestmark = [pytest.mark.browser, pytest.mark.timeout(300)]

ASSIGNMENT = "a1_ppo_objective"
NOTEBOOK = f"source/{ASSIGNMENT}/01_clipped_objective.ipynb"
PAIR = f"content/{ASSIGNMENT}/01_clipped_objective.py"
GRADE_ID = "test_ppo_surrogate"
UNCHANGED = f"source/{ASSIGNMENT}/02_kl_penalty_and_review.ipynb"
UNCHANGED_PAIR = f"content/{ASSIGNMENT}/02_kl_penalty_and_review.py"
COPIED = ("source", "content", "jupytext.toml", "nbgrader_config.py", "jupyter")

# The sidebar tab of nbgrader's Create Assignment panel (its widget id, as nbgrader spells it).
PANEL_TAB = '.jp-SideBar.jp-mod-right .lm-TabBar-tab[data-id="nbgrader-create_assignemnt"]'
PANEL = ".nbgrader-NotebookPanelWidget"
CELL_WIDGETS = f"{PANEL} .nbgrader-CellWidget"
CURRENT_TAB = "#jp-main-dock-panel .lm-TabBar-tab.jp-mod-current"

# {i: index} of the panel's cell widget whose ID box holds the grade id, or null (the box's value
# is a DOM property, not an attribute, so a CSS selector cannot see it).
FIND_CELL_WIDGET_JS = """(gid) => {
    const widgets = Array.from(document.querySelectorAll('%s'));
    const i = widgets.findIndex(w => {
        const input = w.querySelector('.nbgrader-CellId input');
        return !!input && input.value === gid;
    });
    return i >= 0 ? {i} : null;
}""" % CELL_WIDGETS


def _copy_course(dest: Path) -> Path:
    """The parts of the course the authoring view needs, copied by the course's one course copy."""
    return pipeline.copy_course(dest, REPO, include=COPIED)


def _server_env(course: Path, tmp: Path) -> dict:
    # nbgrader's configuration follows the copy, whatever the caller's environment says.
    return {"RLHF_COURSE_ROOT": str(course), "RLHF_COURSE_DB": f"sqlite:///{tmp / 'gb.db'}",
            "RLHF_EXCHANGE": str(tmp / "exchange")}


def _shot(page, name: str) -> None:
    page.screenshot(path=str(ARTIFACTS / f"authoring-{name}.png"), full_page=True)


def _wait_until(predicate, what: str, timeout_s: float = 60.0, poll_s: float = 0.1):
    deadline = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(poll_s)


def _open_notebook(page, server, relpath: str) -> None:
    page.set_default_timeout(90_000)
    page.goto(server.notebook_url(relpath))
    page.wait_for_selector(".jp-NotebookPanel .jp-Notebook .jp-Cell")
    wait_for_kernel_idle(page, server)
    # Once its kernel is up, JupyterLab writes the kernel's language_info into the notebook's
    # metadata (the course's files never hold it), so the document is "modified" from here on,
    # before anyone edits it: exactly what the pre-save hook is for.
    page.wait_for_selector(f"{CURRENT_TAB}.jp-mod-dirty")


def _save_with_keyboard(page, relpath: str, files: list[Path]) -> dict:
    """Ctrl+S on the current notebook; wait until its tab is clean and the server rewrote ``files``.

    Returns the notebook JupyterLab sent to the server (the body of its contents PUT request), so a
    test can tell what the pre-save hook removed.
    """
    before = {p: p.stat().st_mtime_ns for p in files}
    bodies = []

    def record(route, request):
        # Requests passed through a route carry their whole body (a large one may be missing
        # from ordinary request events).
        if request.method == "PUT":
            bodies.append(request.post_data_buffer)
        route.continue_()

    pattern = f"**/api/contents/{relpath}*"
    page.route(pattern, record)
    try:
        page.locator(".jp-NotebookPanel .jp-Notebook").first.focus()
        page.keyboard.press("Control+s")
        page.wait_for_selector(f"{CURRENT_TAB}:not(.jp-mod-dirty)")
        _wait_until(lambda: all(p.stat().st_mtime_ns != before[p] for p in files),
                    f"the server to write {[p.name for p in files]}")
    finally:
        page.unroute(pattern, record)
    assert len(bodies) == 1 and bodies[0], f"expected one save request with a body, saw {len(bodies)}"
    body = json.loads(bodies[0])
    assert body["type"] == "notebook", body.get("type")
    return body["content"]


def _nbgrader_meta(nb, grade_id: str) -> dict:
    return next(c.metadata["nbgrader"] for c in nb.cells if c.metadata.get("nbgrader", {}).get("grade_id") == grade_id)


def _other_cells(nb) -> list:
    return [(c.cell_type, c.id, c.source, c.metadata) for c in nb.cells
            if c.metadata.get("nbgrader", {}).get("grade_id") != GRADE_ID]


def _run_lab(tmp_path, course: Path, drive, name: str) -> None:
    """Serve ``course`` with the instructor configuration and run ``drive(page, server)``."""
    require_chromium()
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    # No autosave: the only save is the one the test makes.
    settings = tmp_path / "lab-state" / "lab-settings" / "@jupyterlab/docmanager-extension/plugin.jupyterlab-settings"
    settings.parent.mkdir(parents=True, exist_ok=True)
    settings.write_text(json.dumps({"autosave": False}))
    with jupyter_lab(course, tmp_path / "lab-state", wait=False,
                     config_dir=course / "jupyter" / "instructor",
                     extra_env=_server_env(course, tmp_path)) as server, chromium_page() as page:
        try:
            server.wait_ready()
            drive(page, server)
        except BaseException:
            try:
                _shot(page, f"{name}-failure")
            except Exception:  # the page may be unusable by now
                pass
            print("---- jupyter lab log (tail) ----")
            print(server.log_tail(80))
            raise


def _baseline(course: Path) -> tuple[list, list]:
    """The lint findings and pair problems of the untouched copy. Other assignments may hold work
    in progress; the one these tests edit must be clean."""
    found, pairs = authoring.lint(course), authoring.pair_diff(course)
    assert not [f for f in found if f.notebook.startswith(f"source/{ASSIGNMENT}/")], "\n".join(map(str, found))
    assert not [p for p in pairs if f"/{ASSIGNMENT}/" in p], pairs
    return found, pairs


# ------------------------------------------------------------------------------------------------
# points changed in the Create Assignment panel


def _change_points_in_panel(page, server, course: Path) -> dict:
    """Open the notebook, set the test cell's points to 7 in the Create Assignment panel, save."""
    _open_notebook(page, server, NOTEBOOK)
    _shot(page, "points-1-opened")

    # The Create Assignment panel: its tab in the right sidebar.
    page.locator(PANEL_TAB).click()
    page.wait_for_selector(f"{PANEL}:visible")
    n_cells = page.locator(".jp-NotebookPanel .jp-Notebook .jp-Cell").count()
    page.wait_for_function(f"(n) => document.querySelectorAll('{CELL_WIDGETS}').length === n", arg=n_cells)
    index = page.wait_for_function(FIND_CELL_WIDGET_JS, arg=GRADE_ID).json_value()["i"]
    widget = page.locator(CELL_WIDGETS).nth(index)
    total = page.locator(f"{PANEL} .nbgrader-TotalPointsInput").first
    total_before = float(total.input_value())

    # Select the test cell from the panel: its widget becomes active, and so does the notebook cell.
    widget.locator(".nbgrader-CellHeader").click()
    page.wait_for_function(
        f"(i) => document.querySelectorAll('{CELL_WIDGETS}')[i].classList.contains('nbgrader-mod-active')", arg=index)
    active = page.locator(".jp-NotebookPanel .jp-Notebook .jp-Cell.jp-mod-active").first
    assert f'grading.judge("{GRADE_ID}")' in active.inner_text()
    assert widget.locator(".nbgrader-CellType select").input_value() == "tests"

    points = widget.locator(".nbgrader-CellPoints input")
    assert points.input_value() == "6"
    points.click()
    points.press("Control+a")
    points.type("7")
    points.press("Tab")  # the panel writes the metadata on the input's change event
    page.wait_for_function(
        "(want) => Number(document.querySelector('%s .nbgrader-TotalPointsInput').value) === want" % PANEL,
        arg=total_before + 1)
    assert points.input_value() == "7"

    active.scroll_into_view_if_needed()
    _shot(page, "points-2-changed")

    sent = _save_with_keyboard(page, NOTEBOOK, [course / NOTEBOOK, course / PAIR])
    _shot(page, "points-3-saved")
    return sent


def test_points_changed_in_create_assignment_panel(tmp_path):
    course = _copy_course(tmp_path / "course")
    before_nb = (course / NOTEBOOK).read_text(encoding="utf-8")
    assert _nbgrader_meta(nbformat.reads(before_nb, as_version=4), GRADE_ID)["points"] == 6
    lint_before, pairs_before = _baseline(course)

    sent, procs = {}, []

    def drive(page, server):
        sent.update(_change_points_in_panel(page, server, course))
        # The files are final once the save is done: `make lint`'s command and a fresh release
        # (throwaway gradebook) start now, on the copy, while the server shuts down.
        procs.extend(_start_lint_and_release(course, tmp_path))

    try:
        _run_lab(tmp_path, course, drive, "points")
        _check_points_change(course, before_nb, sent, lint_before, pairs_before, *procs)
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()


def _start_lint_and_release(course: Path, tmp_path: Path) -> list[subprocess.Popen]:
    env = dict(os.environ, **_server_env(course, tmp_path),
               PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}")
    commands = {
        "lint": [sys.executable, "-m", "rlhf_lab.instructor.authoring", "lint", "--root", str(course)],
        "generate": ["nbgrader", "generate_assignment", ASSIGNMENT, "--force", f"--db=sqlite:///{tmp_path / 'gb.db'}"],
    }
    procs = []
    try:
        for name, cmd in commands.items():
            with open(tmp_path / f"{name}.log", "wb") as log:  # the child keeps its own handle
                procs.append(subprocess.Popen(cmd, cwd=course, env=env, stdout=log, stderr=subprocess.STDOUT))
    except BaseException:
        for proc in procs:
            proc.kill()
            proc.wait()
        raise
    return procs


def _check_points_change(course, before_nb, sent, lint_before, pairs_before, cli, gen) -> None:
    # JupyterLab sent the kernel's language_info (the hook is what keeps it out of the file).
    assert sent["metadata"].get("language_info", {}).get("name") == "python", sent["metadata"]
    assert _nbgrader_meta(nbformat.from_dict(sent), GRADE_ID)["points"] == 7

    # The notebook: 7 points in the metadata, every other cell as it was, canonical form.
    text = (course / NOTEBOOK).read_text(encoding="utf-8")
    saved = nbformat.reads(text, as_version=4)
    original = nbformat.reads(before_nb, as_version=4)
    meta = _nbgrader_meta(saved, GRADE_ID)
    assert meta["points"] == 7, meta
    assert dict(meta, points=6) == _nbgrader_meta(original, GRADE_ID)
    assert _other_cells(saved) == _other_cells(original), "cells other than the test cell changed"
    assert "language_info" not in saved.metadata and set(saved.metadata) == {"kernelspec"}, saved.metadata
    assert all(not c.get("outputs") and c.get("execution_count") is None for c in saved.cells if c.cell_type == "code")
    assert text == authoring.normalised_text(saved), "the saved notebook is not in canonical form"
    assert not (course / "source" / ASSIGNMENT / "01_clipped_objective.py").exists(), "a text pair landed in source/"

    # The text pair, written by jupytext on the same save.
    pair = (course / PAIR).read_text(encoding="utf-8")
    header = next(line for line in pair.splitlines() if f'"grade_id": "{GRADE_ID}"' in line)
    assert header.startswith("# %%") and '"points": 7' in header, header
    assert pair == authoring.pair_text(course, course / NOTEBOOK)
    assert authoring.pair_diff(course) == pairs_before

    # The lint: the points table and the task heading of this notebook disagree with the metadata now,
    # nothing else.
    found = authoring.lint(course)
    new = [f for f in found if f not in lint_before]
    assert [f for f in lint_before if f not in found] == []
    assert all(f.rule in ("points-table", "task-points") for f in new), "\n".join(map(str, new))
    heading = [f for f in new if f.rule == "task-points"]
    assert len(heading) == 1 and "Task 1.1 state(s) 6 points" in heading[0].message, "\n".join(map(str, new))
    assert all(f.notebook.startswith(f"source/{ASSIGNMENT}/") for f in new), "\n".join(map(str, new))
    named = [f for f in new if GRADE_ID in f.message]
    points_cell = next(c.id for c in saved.cells if c.cell_type == "markdown" and "This notebook: **" in c.source)
    assert len(named) == 1, "\n".join(map(str, new))
    assert (named[0].notebook, named[0].cell_id, named[0].rule) == (NOTEBOOK, points_cell, "points-table")
    assert "6 points, its metadata 7" in named[0].message, named[0]
    cli.wait(timeout=180)
    cli_out = (course.parent / "lint.log").read_text(errors="replace")
    assert cli.returncode == 1, cli_out
    assert str(named[0]) in cli_out.splitlines(), cli_out
    assert f"{NOTEBOOK} [{points_cell}] points-table: the table gives '{GRADE_ID}' 6 points, its metadata 7" \
        in cli_out.splitlines(), cli_out

    # The release generated from the copy carries the new points.
    gen.wait(timeout=300)
    gen_out = (course.parent / "generate.log").read_text(errors="replace")
    assert gen.returncode == 0, gen_out
    released = nbformat.read(course / "release" / ASSIGNMENT / "01_clipped_objective.ipynb", as_version=4)
    assert _nbgrader_meta(released, GRADE_ID)["points"] == 7
    assert _nbgrader_meta(released, "test_clip_boundary")["points"] == 4


# ------------------------------------------------------------------------------------------------
# saved without a change


def test_save_without_changes_keeps_the_files(tmp_path):
    course = _copy_course(tmp_path / "course")
    files = [course / UNCHANGED, course / UNCHANGED_PAIR]
    before = {p: p.read_bytes() for p in files}
    lint_before, pairs_before = _baseline(course)

    def drive(page, server):
        _open_notebook(page, server, UNCHANGED)
        _shot(page, "unchanged-1-opened")
        sent.update(_save_with_keyboard(page, UNCHANGED, files))
        _shot(page, "unchanged-2-saved")

    sent = {}
    _run_lab(tmp_path, course, drive, "unchanged")

    # JupyterLab did send a notebook that differs from the file (the kernel's language_info) ...
    assert sent["metadata"].get("language_info", {}).get("name") == "python", sent["metadata"]
    # ... and the files on disk are exactly what they were.
    for path in files:
        assert path.read_bytes() == before[path], f"{path.relative_to(course)} changed on a save without edits"
    assert authoring.lint(course) == lint_before
    assert authoring.pair_diff(course) == pairs_before
