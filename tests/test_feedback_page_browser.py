"""A real feedback page, opened from disk in Chromium with no network: math typeset, diagnosis whole.

One student of ``a1_ppo_objective`` hands in the bundled ``cy_dropped_signed_min`` answers (the
judged test ``test_ppo_surrogate`` fails with a long diagnosis: "Clipped the ratio but dropped the
signed min: ...") plus a markdown cell of their own with inline and display math (and a ``<``
inside math). The course command (:func:`rlhf_lab.instructor.classrun.pipeline.run_class`) grades it
for real and writes its feedback with the course's configuration.

Headless Debian Chromium opens ``feedback/<student>/a1_ppo_objective/01_clipped_objective.html`` as a
``file://`` page (as a student opens a fetched page from disk) with every request that is not
``file://`` or ``127.0.0.1`` aborted, and must see:

* MathJax loaded from the course environment (``jupyter-server-mathjax``'s MathJax.js, a file on
  this machine), with no request leaving the machine and none refused by the page's policy;
* the math typeset: MathJax elements in the release's markdown and in the student's cell, a display
  equation, no MathJax error, and no raw ``$...$`` left in the rendered text of any markdown cell;
* the failing cell's diagnosis whole and inside the window: its text is there to its last word,
  the ``<pre>`` and every element around it have ``scrollWidth <= clientWidth``, its right edge is
  inside the viewport, and the page itself has no horizontal scroll.

Before the course's feedback changes (``html_safety.FeedbackExporter``: local MathJax by hash,
wrapped lines) the page asks a CDN for MathJax, which its policy refuses, so math stays TeX, and the
diagnosis runs past the right edge (``white-space: pre``). Screenshots: the test's ``tmp_path``.
"""
from __future__ import annotations

import contextlib
import copy
import re
import shutil

import nbformat
import pytest
from browser_support import CHROMIUM_ARGS, require_chromium
from course_support import REPO, fresh_course, own_db, write_submissions
from nbformat.v4 import new_markdown_cell

from rlhf_lab.instructor.classrun import pipeline

pytestmark = [pytest.mark.browser, pytest.mark.slow, pytest.mark.timeout(2400)]

ASSIGNMENT = "a1_ppo_objective"
NB = "01_clipped_objective"
STUDENT = "mj_math_and_diagnosis"
MISTAKE = REPO / "examples" / "submissions" / "cy_dropped_signed_min" / ASSIGNMENT
#: The end of the judge's diagnosis of the dropped signed min (rlhf_lab/judging): must be shown.
DIAGNOSIS = ("Clipped the ratio but dropped the signed min", "Return min(ratio*A, clip(ratio)*A).")
STUDENT_MATH = ("My own check of the clip: for $A < 0$ and $\\rho > 1 + \\varepsilon$ the signed min "
                "keeps $\\rho A$, so\n\n"
                "$$\\min\\bigl(\\rho A,\\ \\mathrm{clip}(\\rho, 1-\\varepsilon, 1+\\varepsilon) A\\bigr)"
                " = \\rho A < (1+\\varepsilon) A.$$")
VIEWPORT = {"width": 1000, "height": 900}
#: Every markdown cell's rendered text: what is left of math MathJax did not typeset.
RAW_MATH = re.compile(r"\$[^$\n]+\$|\\\(|\\\[")


def submission() -> dict:
    """``{notebook: NotebookNode}``: the bundled dropped-signed-min answers plus the student's math."""
    nbs = {p.stem: nbformat.read(p, as_version=4) for p in sorted(MISTAKE.glob("*.ipynb"))}
    nb = copy.deepcopy(nbs[NB])
    nb.cells.append(new_markdown_cell(STUDENT_MATH))
    nbs[NB] = nb
    return nbs


@contextlib.contextmanager
def offline_page(blocked: list, requested: list, console: list):
    """A Playwright page in the system Chromium that may load only ``file://`` and 127.0.0.1."""
    from playwright.sync_api import sync_playwright

    executable = require_chromium()
    assert executable == shutil.which("chromium")

    def route(r):
        url = r.request.url
        if url.startswith("file://") or re.match(r"^https?://127\.0\.0\.1[:/]", url):
            requested.append(url)
            r.continue_()
        else:
            blocked.append(url)
            r.abort()

    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=executable, headless=True, args=CHROMIUM_ARGS)
        try:
            context = browser.new_context(viewport=VIEWPORT)
            context.route("**/*", route)
            page = context.new_page()
            page.on("console", lambda m: console.append(m.text))
            yield page
        finally:
            browser.close()


def test_feedback_page_typesets_math_offline_and_shows_the_whole_diagnosis(tmp_path):
    require_chromium()
    base = tmp_path / "base"
    base.mkdir()
    root = fresh_course(tmp_path / "course", base)
    folder = write_submissions(root / "custom_submissions", {STUDENT: {ASSIGNMENT: submission()}})
    run = pipeline.run_class(folder, root=root, db_url=own_db(root), names=[ASSIGNMENT], fresh=False,
                             regenerate=False, release_pending_feedback=True)
    assert all(r.ok for r in run.runs), run.runs
    feedback = root / "feedback" / STUDENT / ASSIGNMENT / f"{NB}.html"
    assert feedback.exists(), run.feedback
    score = run.grades.cell(STUDENT, ASSIGNMENT, "test_ppo_surrogate")
    assert score.score == 0, score  # the judged test failed: its diagnosis is on the page

    blocked, requested, console = [], [], []
    with offline_page(blocked, requested, console) as page:
        page.set_default_timeout(60_000)
        try:
            page.goto(feedback.as_uri())
            try:
                page.wait_for_function("() => window.MathJax && window.MathJax.Hub && window.MathJax.Hub.Register",
                                       timeout=60_000)
            except Exception as exc:
                raise AssertionError(f"MathJax never loaded; blocked {blocked}, console {console[:6]}") from exc
            # MathJax's "End" startup hook fires once the first typeset of the whole page is done
            page.evaluate("() => new Promise(done => MathJax.Hub.Register.StartupHook('End', () => done(true)))")
            math = page.evaluate("""() => ({
                typeset: document.querySelectorAll('.text_cell_render span.MathJax').length,
                display: document.querySelectorAll('.text_cell_render div.MathJax_Display').length,
                errors: document.querySelectorAll('.MathJax .merror, .MathJax_Error').length,
                student: (() => { const cells = document.querySelectorAll('.text_cell_render');
                                  const own = cells[cells.length - 1];
                                  return [own.innerText, own.querySelectorAll('span.MathJax').length,
                                          own.querySelectorAll('div.MathJax_Display').length]; })(),
                texts: Array.from(document.querySelectorAll('.text_cell_render')).map(e => e.innerText),
            })""")
            pre = page.locator(".output_error pre", has_text=DIAGNOSIS[0]).first
            pre.scroll_into_view_if_needed()
            page.screenshot(path=str(tmp_path / "feedback-diagnosis.png"))
            diagnosis = pre.evaluate("""(e) => {
                const boxes = [];
                for (let n = e; n && n !== document.documentElement; n = n.parentElement) {
                    boxes.push([n.tagName + '.' + n.className, n.scrollWidth, n.clientWidth]);
                }
                const r = e.getBoundingClientRect();
                return {text: e.innerText, boxes, left: r.left, right: r.right,
                        viewport: document.documentElement.clientWidth,
                        page: [document.documentElement.scrollWidth, document.documentElement.clientWidth]};
            }""")
            page.screenshot(path=str(tmp_path / "feedback.png"), full_page=True)
        except BaseException:
            with contextlib.suppress(Exception):
                page.screenshot(path=str(tmp_path / "failure.png"), full_page=True)
            raise

    # offline: nothing left the machine, nothing was refused, MathJax came from the course environment
    assert blocked == [], blocked
    refused = [m for m in console if "Content Security Policy" in m and "about:blank" not in m]
    assert refused == [], refused  # (MathJax probes a blank font at about:blank; fonts need no more)
    mathjax = [u for u in requested if u.split("?")[0].endswith("/jupyter_server_mathjax/static/MathJax.js")]
    assert mathjax and mathjax[0].startswith("file://"), requested[:5]

    # the math is typeset, the student's included, and no TeX is left as text
    assert math["errors"] == 0, math
    assert math["typeset"] >= 10 and math["display"] >= 1, {k: math[k] for k in ("typeset", "display")}
    own_text, own_inline, own_display = math["student"]
    assert "My own check of the clip" in own_text and own_inline >= 3 and own_display == 1, math["student"]
    raw = [m.group(0) for text in math["texts"] for m in RAW_MATH.finditer(text)]
    assert raw == [], raw[:10]

    # the diagnosis: all of it, inside the window, nothing scrolled or clipped away
    text = " ".join(diagnosis["text"].split())
    assert all(part in text for part in DIAGNOSIS), text
    overflowing = [b for b in diagnosis["boxes"] if b[1] > b[2]]
    assert overflowing == [], overflowing
    assert 0 <= diagnosis["left"] and diagnosis["right"] <= diagnosis["viewport"], diagnosis
    assert diagnosis["page"][0] <= diagnosis["page"][1], diagnosis["page"]  # no horizontal scroll
