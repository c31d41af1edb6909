"""A hostile submission's HTML runs neither in Formgrader nor in its feedback page, in a real browser.

One student of ``a1_ppo_objective`` hands in correct answers plus cells of their own: markdown with
``<script>``, ``<img onerror>``, ``<svg onload>``, ``<iframe srcdoc>``, ``<details ontoggle>``,
``<meta http-equiv=refresh>``, a ``javascript:`` link, a form with ``formaction``; and a code cell
that displays ``text/html`` with a script, ``application/javascript``, an SVG with ``onload``,
``text/markdown`` with ``<img onerror>`` and a PNG whose ``width`` metadata breaks out of nbconvert's
unquoted attribute. Every payload sets ``window.__pwned``, changes ``document.title``, calls
``alert`` and tries to write ``pwned_<payload>.txt`` into the course through the Jupyter API
(``PUT /api/contents/...`` with the page's XSRF cookie: what works from Formgrader's origin).

The course command (:func:`rlhf_lab.instructor.classrun.pipeline.run_class`) autograds the submission for real
(sandboxed kernel, judge, pre-flight) and writes its feedback. A real JupyterLab on 127.0.0.1 serves
the course (``browser_support.py``); headless Debian Chromium opens the submission in Formgrader and
then the feedback page (as a student opens a downloaded file), clicks the planted link, and must
see: no dialog, ``window.__pwned`` undefined, the title unchanged, no file written. The
autograded notebook on disk is already free of the payloads, and the feedback page still shows the
notebook's plot and text.

Without the course's sanitiser (``html_safety.py`` and its lines in ``nbgrader_config.py``) the
payloads run in both pages and write the files: this test fails on that.

Run with ``pytest -m browser``; skips only when Chromium is not installed. Screenshots go to
``artifacts/browser/``.
"""
from __future__ import annotations

import contextlib
import copy
import html.parser
import json
import re

import nbformat
import pytest
from browser_support import ARTIFACTS, chromium_page, jupyter_lab, require_chromium
from course_support import correct_submission, fresh_course, own_db, write_submissions
from nbformat.v4 import new_code_cell, new_markdown_cell

from rlhf_lab.instructor.classrun import pipeline

pytestmark = [pytest.mark.browser, pytest.mark.slow, pytest.mark.timeout(2400)]

ASSIGNMENT = "a1_ppo_objective"
NB = "01_clipped_objective"
STUDENT = "hx_html_payloads"


def payload(tag: str) -> str:
    """JavaScript (single quotes only, so it fits in any attribute) that marks the page as owned."""
    return ("window.__pwned=(window.__pwned||[]).concat(['" + tag + "']);document.title='pwned';alert('" + tag + "');"
            "var m=document.cookie.match(/_xsrf=([^;]+)/);"
            "fetch('/api/contents/pwned_" + tag + ".txt',{method:'PUT',credentials:'same-origin',"
            "headers:{'Content-Type':'application/json','X-XSRFToken':m?decodeURIComponent(m[1]):''},"
            "body:JSON.stringify({type:'file',format:'text',content:'" + tag + "'})});")


MARKDOWN = "\n\n".join([
    "My notes on the objective.",
    f"<script>{payload('md_script')}</script>",
    f'<img src="nothing.png" onerror="{payload("md_img")}">',
    f'<svg onload="{payload("md_svg")}"><circle r="2"></circle></svg>',
    f'<iframe srcdoc="<script>{payload("md_iframe").replace(chr(39), "&#39;")}</script>"></iframe>',
    f'<details open ontoggle="{payload("md_details")}"><summary>more</summary>details</details>',
    '<meta http-equiv="refresh" content="0;url=javascript:alert(\'md_meta\')">',
    f'<a id="pwnlink" href="javascript:{payload("md_link")}">PWNLINK</a>',
    f'<form action="javascript:{payload("md_form")}"><button id="pwnbutton" formaction="javascript:{payload("md_formaction")}">PWNBUTTON</button></form>',
])

_HTML_OUT = f"<b>html output</b><script>{payload('out_html')}</script><img src=x onerror=\"{payload('out_img')}\">"
_SVG_OUT = f'<svg xmlns="http://www.w3.org/2000/svg" onload="{payload("out_svg")}"><rect width="4" height="4"/></svg>'
_MD_OUT = f'<img src=x onerror="{payload("out_md")}">'
_WIDTH = "1 onerror=" + payload("out_width")
CODE = "\n".join([  # every payload a Python literal (repr), whatever quotes it holds
    "from IPython.display import HTML, SVG, Javascript, Markdown, display",
    f"display(HTML({_HTML_OUT!r}))",
    f"display(Javascript({payload('out_js')!r}))",
    f"display(SVG({_SVG_OUT!r}))",
    f"display(Markdown({_MD_OUT!r}))",
    f'display({{"image/png": "AAAA"}}, metadata={{"image/png": {{"width": {_WIDTH!r}}}}}, raw=True)',
    'print("payloads displayed")',
])


class _Active(html.parser.HTMLParser):
    """Collects the elements and attributes of an HTML text that could run script."""

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.found = []

    def handle_starttag(self, tag, attrs):
        if tag in ("script", "iframe", "object", "embed", "form", "meta", "base"):
            self.found.append(tag)
        for name, value in attrs:
            value = (value or "").strip().lower()
            if name.startswith("on") or name in ("srcdoc", "formaction") or value.startswith("javascript:"):
                self.found.append(f"{tag} {name}")


def active_html(text: str) -> list:
    """The active tags and attributes a browser would find in ``text`` (``[]``: inert)."""
    parser = _Active()
    parser.feed(text)
    parser.close()
    return parser.found


def hostile_submission() -> dict:
    """``{notebook: NotebookNode}``: correct answers, plus the student's own hostile cells."""
    subs = correct_submission(ASSIGNMENT)
    nb = copy.deepcopy(subs[NB])
    nb.cells.append(new_markdown_cell(MARKDOWN))
    nb.cells.append(new_code_cell(CODE))
    subs[NB] = nb
    return subs


def _shot(page, name: str) -> None:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    with contextlib.suppress(Exception):
        page.screenshot(path=str(ARTIFACTS / f"html-safety-{name}.png"), full_page=True)


def _owned(page, dialogs: list) -> dict:
    """What the payloads would have left in ``page``: its marker, its title and the dialogs seen."""
    page.wait_for_timeout(3000)  # onerror/onload/fetch are asynchronous
    return {"pwned": page.evaluate("() => window.__pwned === undefined ? null : window.__pwned"),
            "title": page.evaluate("() => document.title"), "dialogs": list(dialogs)}


def _click_planted(page) -> None:
    """Click the planted link and button if they survived as elements (a sanitised page has no target)."""
    for selector in ("text=PWNLINK", "text=PWNBUTTON"):
        target = page.locator(selector)
        if target.count():
            with contextlib.suppress(Exception):
                target.first.click(timeout=5000, no_wait_after=True)
    page.wait_for_timeout(1000)


def _submission_id(root) -> str:
    from nbgrader.api import Gradebook

    with Gradebook(own_db(root), pipeline.COURSE_ID) as gb:
        return gb.find_submission_notebook(NB, ASSIGNMENT, STUDENT).id


def test_hostile_html_runs_neither_in_formgrader_nor_in_feedback(tmp_path):
    require_chromium()
    base = tmp_path / "base"
    base.mkdir()
    root = fresh_course(tmp_path / "course", base)
    folder = write_submissions(root / "custom_submissions", {STUDENT: {ASSIGNMENT: hostile_submission()}})
    run = pipeline.run_class(folder, root=root, db_url=own_db(root), names=[ASSIGNMENT], fresh=False,
                             regenerate=False, release_pending_feedback=True)
    assert all(r.ok for r in run.runs), run.runs
    autograded = root / "autograded" / STUDENT / ASSIGNMENT / f"{NB}.ipynb"
    feedback = root / "feedback" / STUDENT / ASSIGNMENT / f"{NB}.html"
    assert autograded.exists() and feedback.exists(), run.feedback
    # the feedback page's CSP: no script runs but its own MathJax loader, by its hash
    assert re.search(r"script-src 'sha256-[A-Za-z0-9+/]+=*' 'strict-dynamic';", feedback.read_text(encoding="utf-8"))

    # the notebook Formgrader and JupyterLab read is already clean on disk; the code really ran
    nb = nbformat.read(autograded, as_version=4)
    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs]
    shown = json.dumps([c.source for c in nb.cells if c.cell_type == "markdown"] + outputs)
    assert "payloads displayed" in shown and "My notes on the objective." in shown
    # what a browser would build from it: no active element or attribute (escaped text is inert)
    texts = [c.source for c in nb.cells if c.cell_type == "markdown"]
    for o in outputs:
        data = o.get("data", {})
        assert not any("javascript" in mime for mime in data), sorted(data)
        texts += [v if isinstance(v, str) else "".join(v) for k, v in data.items()
                  if k in ("text/html", "image/svg+xml", "text/markdown")]
    for text in texts:
        assert active_html(text) == [], text[:300]

    env = {"RLHF_COURSE_ROOT": str(root), "RLHF_COURSE_DB": own_db(root),
           "PYTEST_CURRENT_TEST": None, "MPLBACKEND": None, "NBGRADER_EXECUTION": None}
    seen = {}
    with jupyter_lab(root, tmp_path / "lab_state", wait=False, extra_env=env) as lab, chromium_page() as page:
        lab.wait_ready()
        page.set_default_timeout(60_000)
        dialogs: list = []
        page.on("dialog", lambda d: (dialogs.append(d.message), d.dismiss()))
        try:
            # log in as an instructor's browser does (the token once, then the session cookie)
            page.goto(f"{lab.base_url}/formgrader/manage_assignments?token={lab.token}")
            page.locator("tr", has_text=ASSIGNMENT).first.wait_for(timeout=300_000)
            assert "_xsrf" in page.evaluate("() => document.cookie")  # what the payloads would use
            page.goto(f"{lab.base_url}/formgrader/submissions/{_submission_id(root)}")
            page.locator("text=payloads displayed").first.wait_for(timeout=120_000)
            _click_planted(page)
            seen["formgrader"] = _owned(page, dialogs)
            _shot(page, "formgrader")

            dialogs.clear()
            page.goto(feedback.as_uri())
            page.locator("text=payloads displayed").first.wait_for(timeout=60_000)
            _click_planted(page)
            seen["feedback"] = _owned(page, dialogs)
            # the page is still the notebook: its plot is drawn and its text is there
            plots = page.evaluate("() => Array.from(document.querySelectorAll('img[src^=\"data:image/png\"]'))"
                                  ".filter(i => i.naturalWidth > 100).length")
            body = page.inner_text("body")
            _shot(page, "feedback")
        except BaseException:
            _shot(page, "failure")
            print(lab.log_tail(200))
            raise
        written = sorted(p.name for p in root.rglob("pwned_*.txt"))

    assert written == [], (written, seen)
    for where, found in seen.items():
        assert found["pwned"] is None, (where, found)
        assert found["dialogs"] == [], (where, found)
        assert found["title"] != "pwned", (where, found)
    assert plots >= 1, "the feedback page lost the notebook's plot"
    assert "My notes on the objective." in body and "PWNLINK" in body
    assert "[an output that runs script was removed by the grader]" in body
