"""A week of the course on the hub, in Chromium, with real accounts (issue 21, "the browser test").

A throw-away class (``hub_support.Class``: an instructor and two students, real Linux accounts
``t21…`` made by ``hub users`` and removed afterwards) on the real hub (``hub serve``: PAM logins,
each server spawned as its own account, nbgrader's ``JupyterHubAuthPlugin``). Each person has their
own browser context (own cookies) in headless Debian Chromium. The steps are tests run in order on
one module-scoped hub and browser (a step whose predecessor failed is skipped, saying so):

1. the instructor logs in on the hub's login page and, in Formgrader (its own URL on the
   instructor's server, ``/user/<instructor>/formgrader``: the hub's ``frame-ancestors 'none'``
   would blank it in JupyterLab's frame), generates and releases ``a1_ppo_objective``;
2. each student logs in, opens the Assignment List, fetches a1, answers (A: the model answers,
   B: the same with the classic mistake ``cy_dropped_signed_min``; written through the Jupyter
   contents API of the student's own session, what typing and saving does), validates a notebook
   (A: "Success!", B: the failing visible test named) and submits, in the UI;
3. the instructor collects and autogrades each submission (Formgrader's buttons); the gradebook,
   read by the instructor account: A has every autograded point (the correct example's), B fewer;
4. the instructor grades a written answer in Formgrader's grading view (types a score, saved),
   generates and releases feedback (first checking that the servers' Python exports HTML: soupsieve
   4.x cannot on CPython < 3.11.5, gh-106052, Debian bookworm's 3.11.2; requirements.txt pins 2.x);
5. each student clicks Fetch Feedback and gets exactly their own pages (the files of their
   home's feedback folder, their own score and written answer, not the classmate's);
6. from each student's kernel (over the hub's websocket), reading the course root, its
   ``source/``, the gradebook, the classmate's home, the inbound folder's listing, the classmate's
   feedback (exchange and home; when step 4 ran) and importing ``rlhf_lab.judging`` all fail, while
   the same code reads the student's own home (the positive control);
7. the classmate's inbound submission, read by its exact path (which B could not list), fails too:
   the hub's submit leaves it to its student and the instructor (the exchange's default ACL).

Screenshots on failure and the servers' log go to ``artifacts/browser/``; each step's time is printed.
"""
from __future__ import annotations

import contextlib
import json
import os
import pwd
import re
import shlex
import shutil
import subprocess
import time
from pathlib import Path

import nbformat
import pytest

pytestmark = [pytest.mark.slow, pytest.mark.browser, pytest.mark.timeout(3600),
              pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("useradd"),
                                 reason="creates Linux accounts: needs root and useradd")]

from browser_support import ARTIFACTS, CHROMIUM_ARGS, require_chromium  # noqa: E402
from course_support import correct_submission, mistakes, replace_cell  # noqa: E402
from hub_support import (Class, _as_user, _kernel_eval, _login, _server_session, make_accounts,  # noqa: E402
                         running_hub)

A1 = "a1_ppo_objective"
NB1, NB2 = "01_clipped_objective", "02_kl_penalty_and_review"
ESSAY = "ex3_explanation"  # the written answer of NB1 (3 points) the instructor grades by hand
ESSAY_SCORE = 2.5
WRONG = "cy_dropped_signed_min"  # the classic mistake student B makes (a bundled example student)


@pytest.fixture(scope="module")
def klass():
    k = Class()
    try:
        make_accounts(k)
        yield k
    finally:
        k.cleanup()


@pytest.fixture(scope="module")
def hub(klass):
    with running_hub(klass) as base:
        yield base


# --- the browser ---------------------------------------------------------------------------------------

def _text(page) -> str:
    return re.sub(r"\s+", " ", page.inner_text("body"))


def _shot(page, name):
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    with contextlib.suppress(Exception):
        page.screenshot(path=str(ARTIFACTS / f"hub-week-{name}.png"), full_page=True)


def _hub_login(browser, base, user, password):
    """A new browser context (own cookies) for ``user``, logged in on the hub's login form; the
    page ends in the user's JupyterLab (the hub spawns the server on the first login)."""
    ctx = browser.new_context(viewport={"width": 1500, "height": 1400})
    page = ctx.new_page()
    page.set_default_timeout(60_000)
    page.goto(f"{base}/hub/login")
    page.fill("#username_input", user)
    page.fill("#password_input", password)
    page.click("#login_submit")
    page.wait_for_url(re.compile(rf"/user/{re.escape(user)}/lab"), timeout=400_000)  # spawn + OAuth hop
    page.wait_for_selector("#jp-main-dock-panel", timeout=300_000)
    return page


def _xsrf(page, user) -> dict:
    tokens = [c["value"] for c in page.context.cookies() if c["name"] == "_xsrf" and c["path"].startswith(f"/user/{user}")]
    assert tokens, page.context.cookies()
    return {"X-XSRFToken": tokens[0]}


def _ok_modal(page, expect: str, timeout=300_000) -> str:
    """Wait for Formgrader's result dialog, check it says ``expect``, close it; its text."""
    modal = page.locator(".modal.in, .modal.show").first
    modal.wait_for(state="visible", timeout=timeout)
    text = re.sub(r"\s+", " ", modal.inner_text())
    assert expect in text, text
    modal.locator("button", has_text="OK").first.click()
    modal.wait_for(state="detached", timeout=30_000)
    return text


def _assignment_row(page):
    row = page.locator("tr", has=page.locator("td.name", has_text=A1)).first
    row.wait_for(timeout=300_000)
    return row


def _formgrader_click(page, fg, column: str, expect: str, timeout=300_000) -> str:
    """On Formgrader's Manage Assignments page, click the link in ``column`` of a1's row."""
    page.goto(f"{fg}/manage_assignments")
    link = _assignment_row(page).locator(f"td.{column} a").first
    link.wait_for(timeout=120_000)
    link.click()
    return _ok_modal(page, expect, timeout)


def _open_assignment_list(page):
    """The Nbgrader menu's Assignment List (the menu may toggle shut on a busy machine: retry)."""
    entry = page.locator(".lm-Menu-itemLabel", has_text="Assignment List").first
    for _ in range(6):
        if not entry.is_visible():
            page.locator(".lm-MenuBar-itemLabel", has_text="Nbgrader").first.click()
        try:
            entry.wait_for(state="visible", timeout=10_000)
            break
        except Exception:  # noqa: BLE001 - closed again: close for sure, then open once more
            page.keyboard.press("Escape")
    entry.click()
    page.wait_for_selector("#released_assignments_list", timeout=120_000)


def _answers(student_kind: str) -> dict:
    """``{notebook: {grade_id: source}}`` of the solution cells: the model answers (``right``) or
    the model answers with the classic mistake ``WRONG`` in one cell (``wrong``); each written
    answer ends with a marker naming the student, so a feedback page shows whose work it is."""
    nbs = correct_submission(A1)
    if student_kind == "wrong":
        m = mistakes()[WRONG]
        assert m.assignment == A1
        name = m.notebook.removesuffix(".ipynb")
        nbs[name] = replace_cell(nbs[name], m.grade_id, m.code)
    out = {}
    for name, nb in nbs.items():
        cells = {}
        for cell in nb.cells:
            md = cell.metadata.get("nbgrader", {})
            if md.get("solution"):
                cells[md["grade_id"]] = cell.source
        out[name.removesuffix(".ipynb")] = cells
    return out


def _marker(user) -> str:
    return f"(written by {user})"


def _write_answers(page, base, user, answers):
    """Fill the fetched notebooks' solution cells through the student's own session (contents API)."""
    h = _xsrf(page, user)
    for name, cells in answers.items():
        url = f"{base}/user/{user}/api/contents/{A1}/{name}.ipynb"
        got = page.request.get(url + "?content=1&type=notebook", headers=h)
        assert got.ok, (got.status, got.text()[:300])
        nb = got.json()["content"]
        filled = set()
        for cell in nb["cells"]:
            gid = cell["metadata"].get("nbgrader", {}).get("grade_id")
            if gid in cells:
                cell["source"] = cells[gid] + (f"\n\n{_marker(user)}" if cell["cell_type"] == "markdown" else "")
                filled.add(gid)
        assert filled == set(cells), set(cells) - filled
        put = page.request.put(url, headers=h, data=json.dumps({"type": "notebook", "format": "json", "content": nb}))
        assert put.ok, (put.status, put.text()[:300])


def _student_week_part_one(page, base, user, answers) -> str:
    """Fetch, answer, validate NB1, submit (in the UI); returns Validate's message."""
    _open_assignment_list(page)
    released = page.locator("#released_assignments_list")
    released.locator(".list_item", has_text=A1).locator("button", has_text="Fetch").click()
    fetched = page.locator("#fetched_assignments_list")
    fetched.locator(".list_item", has_text=A1).first.wait_for(timeout=120_000)
    home = Path(pwd.getpwnam(user).pw_dir)
    assert sorted(p.name for p in (home / A1).glob("*.ipynb")) == [f"{NB1}.ipynb", f"{NB2}.ipynb"]
    assert (home / A1).stat().st_uid == pwd.getpwnam(user).pw_uid  # fetched by the student's own server
    _write_answers(page, base, user, answers)
    fetched.locator("a.assignment-notebooks-link").first.click()
    nb_row = fetched.locator(".list_item", has_text=NB1).first
    nb_row.locator("button", has_text="Validate").first.click()
    dialog = page.locator(".jp-Dialog")
    dialog.wait_for(timeout=600_000)  # nbgrader validate runs the notebook in the student's server
    verdict = re.sub(r"\s+", " ", dialog.inner_text())
    dialog.locator("button", has_text="Ok").first.click()
    fetched.locator(".list_item", has_text=A1).locator("button", has_text="Submit").first.click()
    submitted = page.locator("#submitted_assignments_list")
    submitted.locator(".list_item", has_text=A1).first.wait_for(timeout=120_000)
    return verdict


def _failed_tests(klass) -> dict:
    """``{student: {grade_id: error line}}`` of the test cells that failed in the autograded notebooks."""
    out = {}
    for user in klass.students:
        for path in sorted((klass.top / "course" / "autograded" / user / A1).glob("*.ipynb")):
            for cell in nbformat.read(path, as_version=4).cells:
                md = cell.metadata.get("nbgrader", {})
                errors = [o for o in cell.get("outputs", []) if o.get("output_type") == "error"
                          or (o.get("name") == "stderr" and "Error" in o.get("text", ""))]
                if md.get("grade") and not md.get("solution") and errors:
                    e = errors[0]
                    out.setdefault(user, {})[md["grade_id"]] = (f"{e.get('ename')}: {e.get('evalue')}" if "ename" in e
                                                                else e.get("text", ""))[:400]
    return out


def _gradebook(klass) -> dict:
    """What the instructor's gradebook holds for a1, read by the instructor account."""
    code = (
        "import json, os, sys\nfrom nbgrader.api import Gradebook\n"
        "root = os.environ['RLHF_COURSE_ROOT']\nout = {}\n"
        f"with Gradebook('sqlite:///' + root + '/gradebook.db', {klass.settings().course_id!r}) as gb:\n"
        f"    for s in {klass.students!r}:\n"
        f"        sub = gb.find_submission({A1!r}, s)\n"
        "        nbs = {nb.name: [nb.code_score, nb.written_score, nb.score] for nb in sub.notebooks}\n"
        f"        essay = gb.find_grade({ESSAY!r}, {NB1!r}, {A1!r}, s)\n"
        "        out[s] = dict(code=sub.code_score, max_code=sub.max_code_score, written=sub.written_score,\n"
        "                      notebooks=nbs, essay_manual=essay.manual_score)\n"
        "print(json.dumps(out))\n")
    done = _as_user(klass, klass.instructor, f"python -c {shlex.quote(code)}")
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


# --- privacy probes from a student's kernel ------------------------------------------------------------

def _probe_code(probes: dict) -> str:
    """Python that runs each probe and prints ``name=ok`` or ``name=<exception class>``."""
    lines = ["import os"]
    for name, stmt in probes.items():
        lines += ["try:", f"    {stmt}", f"    print({name + '=ok'!r})",
                  "except Exception as e:", f"    print({name + '='!r} + type(e).__name__)"]
    return "\n".join(lines) + "\n"


def _submission_of(klass, user) -> Path:
    s = klass.settings()
    (entry,) = [p for p in (s.exchange / s.course_id / "inbound").iterdir() if p.name.startswith(user + "+")]
    return entry


def _exchange_feedback_of(klass, user) -> list[Path]:
    """The exchange's feedback files of ``user``: those equal to a page in the user's home."""
    s = klass.settings()
    own = {p.read_bytes() for p in (Path(pwd.getpwnam(user).pw_dir) / A1 / "feedback").rglob("*.html")}
    return sorted(p for p in (s.exchange / s.course_id / "feedback").iterdir() if p.read_bytes() in own)


def _privacy(klass, hub, user, other, only=None):
    """Run the probes (those named in ``only``, with the positive control) in a new kernel of
    ``user``'s server; ``(what each did, what each must do)``."""
    s = klass.settings()
    root, home, other_home = s.course_root, pwd.getpwnam(user).pw_dir, Path(pwd.getpwnam(other).pw_dir)
    other_sub = _submission_of(klass, other)
    denied = "PermissionError"
    probes = {
        "own_home": (f"os.listdir({home!r}); open({str(Path(home) / A1 / (NB1 + '.ipynb'))!r}).read()", "ok"),
        "course_root": (f"os.listdir({str(root)!r})", denied),
        "source": (f"open({str(root / 'source' / A1 / (NB1 + '.ipynb'))!r}).read()", denied),
        "gradebook": (f"open({str(root / 'gradebook.db')!r}, 'rb').read(16)", denied),
        "other_home": (f"os.listdir({str(other_home)!r})", denied),
        "other_home_notebook": (f"open({str(other_home / A1 / (NB1 + '.ipynb'))!r}).read()", denied),
        "inbound_listing": (f"os.listdir({str(other_sub.parent)!r})", denied),
        "other_inbound_submission": (f"open({str(other_sub / (NB1 + '.ipynb'))!r}).read()", denied),
        "judging": ("import rlhf_lab.judging", "ModuleNotFoundError"),
    }
    if WEEK.get("feedback"):
        other_fb = _exchange_feedback_of(klass, other)
        assert other_fb, "the classmate has no feedback in the exchange to try"
        other_home_fb = sorted((other_home / A1 / "feedback").rglob("*.html"))
        probes["other_exchange_feedback"] = (f"open({str(other_fb[0])!r}).read()", denied)
        probes["other_home_feedback"] = (f"open({str(other_home_fb[0])!r}).read()", denied)
    if only is not None:
        probes = {k: v for k, v in probes.items() if k in {"own_home", *only}}
    sess, r = _login(hub, user, klass.passwords[user])
    assert r.status_code == 302, r.status_code
    h = _server_session(sess, hub, user)
    got = dict(line.split("=", 1) for line in _kernel_eval(sess, hub, user, h,
                                                           _probe_code({k: v[0] for k, v in probes.items()})))
    assert set(got) == set(probes), got
    return got, {k: v[1] for k, v in probes.items()}


# --- the week, in order (the tests share the module's hub, browser and what each step left) ----------

WEEK: dict = {"times": {}}


@pytest.fixture(scope="module")
def browser(klass, hub):
    require_chromium()
    from playwright.sync_api import sync_playwright

    t0 = time.monotonic()
    with sync_playwright() as pw:
        b = pw.chromium.launch(executable_path=require_chromium(), headless=True, args=CHROMIUM_ARGS)
        WEEK["pages"] = {}
        try:
            yield b
        finally:
            b.close()
            print("\nhub week, seconds per step:", json.dumps({k: round(v, 1) for k, v in WEEK["times"].items()}),
                  f"total {time.monotonic() - t0:.0f} s (hub start not included)")


@contextlib.contextmanager
def _step(klass, name):
    """Time a step; on failure screenshot every page and keep the servers' log in artifacts/."""
    t = time.monotonic()
    try:
        yield
    except BaseException:
        for who, page in WEEK.get("pages", {}).items():
            _shot(page, f"failure-{name}-{who}")
        with contextlib.suppress(OSError):  # the hub's and every server's stderr
            ARTIFACTS.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(klass.top / "hub.log", ARTIFACTS / "hub-week-servers.log")
        raise
    finally:
        WEEK["times"][name] = time.monotonic() - t


def _need(*keys):
    missing = [k for k in keys if k not in WEEK]
    if missing:
        pytest.skip(f"an earlier step of the week did not finish ({', '.join(missing)})")


def _role(klass, user) -> str:
    return {klass.instructor: "instructor", klass.students[0]: "student-a", klass.students[1]: "student-b"}[user]


def test_1_instructor_logs_in_and_releases_a1_in_formgrader(klass, hub, browser):
    inst = klass.instructor
    fg = f"{hub}/user/{inst}/formgrader"
    with _step(klass, "1 instructor: login, spawn, generate, release"):
        WEEK["pages"]["instructor"] = ip = _hub_login(browser, hub, inst, klass.passwords[inst])
        _formgrader_click(ip, fg, "assign", f"Successfully created the student version of '{A1}'")
        _formgrader_click(ip, fg, "release", f"Successfully released '{A1}'")
    s = klass.settings()
    outbound = s.exchange / s.course_id / "outbound" / A1
    assert sorted(p.name for p in outbound.glob("*.ipynb")) == [f"{NB1}.ipynb", f"{NB2}.ipynb"]
    assert outbound.stat().st_uid == pwd.getpwnam(inst).pw_uid  # released by the instructor's own server
    WEEK["released"] = True


def test_2_students_fetch_answer_validate_and_submit_in_the_assignment_list(klass, hub, browser):
    _need("released")
    a, b = klass.students
    verdicts = {}
    for user, kind in ((a, "right"), (b, "wrong")):
        with _step(klass, f"2 {_role(klass, user)}: login, spawn, fetch, answer, validate, submit"):
            WEEK["pages"][_role(klass, user)] = page = _hub_login(browser, hub, user, klass.passwords[user])
            verdicts[user] = _student_week_part_one(page, hub, user, _answers(kind))
    assert "Success! Your notebook passes all the tests." in verdicts[a], verdicts[a]
    # B's Validate names the visible test the mistake fails
    assert "The following cell failed" in verdicts[b] and "test_ppo_surrogate" in verdicts[b], verdicts[b][:500]
    for user in (a, b):
        assert _submission_of(klass, user).stat().st_uid == pwd.getpwnam(user).pw_uid
    WEEK["submitted"] = True


def test_3_instructor_collects_and_autogrades_in_formgrader(klass, hub, browser):
    _need("submitted")
    a, b = klass.students
    ip, fg = WEEK["pages"]["instructor"], f"{hub}/user/{klass.instructor}/formgrader"
    s = klass.settings()
    with _step(klass, "3 instructor: collect"):
        _formgrader_click(ip, fg, "collect", f"Successfully collected submissions of '{A1}'")
    assert {p.name for p in (s.course_root / "submitted").iterdir()} == {a, b}
    with _step(klass, "3 instructor: autograde two students"):
        ip.goto(f"{fg}/manage_submissions/{A1}")
        for user in (a, b):
            row = ip.locator("tr", has=ip.locator("td.student-id", has_text=re.compile(f"^{re.escape(user)}$")))
            row.first.wait_for(timeout=300_000)
            with ip.expect_response(lambda r: r.url.endswith("/autograde"), timeout=1_200_000) as answer:
                row.first.locator(".autograde a").click()
            got = answer.value
            assert got.ok and got.text().lstrip().startswith("{"), \
                (user, got.status, re.sub(r"\s+", " ", re.sub(r"(?s)<script.*?</script>|<[^>]+>", " ", got.text()))[:1500])
            reply = got.json()
            assert reply.get("success"), (user, reply.get("error"), str(reply.get("log"))[-4000:])
            WEEK.setdefault("autograde_logs", {})[user] = str(reply.get("log"))
            _ok_modal(ip, "Successfully autograded")
    grades = _gradebook(klass)
    print("gradebook after autograde:", json.dumps(grades))
    print("failed test cells:", json.dumps(_failed_tests(klass)))
    for user, log in WEEK.get("autograde_logs", {}).items():
        print(f"autograde log of {_role(klass, user)} (runtime lines):",
              sorted(set(re.findall(r"No module named [^,}]{1,80}|'evalue': '[^']{0,200}'", log)))[:20])
    assert grades[a]["code"] == grades[a]["max_code"] == 31.0, grades[a]  # the correct example's: every autograded point
    assert grades[b]["code"] < grades[a]["code"], grades
    WEEK["autograded"] = True


#: Formgrader's grading view and nbgrader's feedback are nbconvert HTML exports, whose
#: ``soup.select("img:not([alt])")`` goes through soupsieve's regular expressions (possessive
#: quantifiers): CPython before 3.11.5 matches those wrongly (gh-106052), soupsieve raises
#: SelectorSyntaxError and the page / the feedback is a 500 error.
SELECTOR_PROBE = "import soupsieve; soupsieve.compile('img:not([alt])')"


def _servers_python_renders_html(klass) -> str | None:
    """None when the servers' Python can export HTML, else why not (the interpreter and its error)."""
    py = klass.top / "state" / "venv" / "bin" / "python"
    done = subprocess.run([str(py), "-c", SELECTOR_PROBE], capture_output=True, text=True, env={"PATH": "/usr/bin:/bin"})
    if done.returncode == 0:
        return None
    version = subprocess.run([str(py), "-c", "import sys; print(sys.version.split()[0])"], capture_output=True,
                             text=True).stdout.strip()
    last = (done.stderr.strip().splitlines() or ["?"])[-1]
    return (f"the servers' Python {version} ({os.path.realpath(py)}) cannot export HTML: {last} (CPython "
            "gh-106052, fixed in 3.11.5, with soupsieve's possessive quantifiers); Formgrader's grading view "
            "and feedback fail on this machine's hub")


def test_4_instructor_grades_a_written_answer_and_releases_feedback_in_formgrader(klass, hub, browser):
    _need("autograded")
    broken = _servers_python_renders_html(klass)
    assert not broken, broken
    a, b = klass.students
    ip, fg = WEEK["pages"]["instructor"], f"{hub}/user/{klass.instructor}/formgrader"
    with _step(klass, "4 instructor: grade a written answer by hand"):
        listed = ip.request.get(f"{fg}/api/submitted_notebooks/{A1}/{NB1}", timeout=300_000)
        assert listed.ok, listed.status
        (sub_id,) = [x["id"] for x in listed.json() if x["student"] == a]
        ip.goto(f"{fg}/submissions/{sub_id}")
        ip.wait_for_selector(f"input#{ESSAY}.score", timeout=120_000)
        ip.wait_for_function(
            "() => window.formgrader && formgrader.grades && formgrader.grades.loaded"
            " && formgrader.comments && formgrader.comments.loaded", timeout=120_000)
        assert _marker(a) in _text(ip)  # the grading view shows A's own written answer
        with ip.expect_response(lambda r: "/api/grade/" in r.url and r.request.method == "PUT"):
            ip.fill(f"input#{ESSAY}.score", str(ESSAY_SCORE))
            ip.press(f"input#{ESSAY}.score", "Tab")
    with _step(klass, "4 instructor: generate and release feedback"):
        _formgrader_click(ip, fg, "generate-feedback", f"Successfully generated feedback of '{A1}'", 1_200_000)
        _formgrader_click(ip, fg, "release-feedback", f"Successfully released feedback of '{A1}'")
    grades = _gradebook(klass)
    assert grades[a]["essay_manual"] == ESSAY_SCORE and grades[b]["essay_manual"] is None, grades
    WEEK["grades"] = grades
    WEEK["feedback"] = True


def test_5_each_student_fetches_exactly_their_own_feedback(klass, hub, browser):
    _need("feedback")
    a, b = klass.students
    grades = WEEK["grades"]
    for user, other in ((a, b), (b, a)):
        with _step(klass, f"5 {_role(klass, user)}: fetch feedback"):
            page = WEEK["pages"][_role(klass, user)]
            page.goto(f"{hub}/user/{user}/lab")
            page.wait_for_selector("#jp-main-dock-panel", timeout=120_000)
            _open_assignment_list(page)
            submitted = page.locator("#submitted_assignments_list")
            submitted.locator("button", has_text="Fetch Feedback").first.click()
            submitted.locator("a", has_text="view feedback").first.wait_for(timeout=120_000)
            home = Path(pwd.getpwnam(user).pw_dir)
            files = sorted(p.relative_to(home / A1 / "feedback").as_posix()
                           for p in (home / A1 / "feedback").rglob("*") if p.is_file())
            print(f"{_role(klass, user)}'s feedback folder {home / A1 / 'feedback'}:", files)
            assert [f.split("/", 1)[1] for f in files] == [f"{NB1}.html", f"{NB2}.html"], files
            assert len({f.split("/", 1)[0] for f in files}) == 1, files  # one submission's pages
            page.goto(f"{hub}/user/{user}/files/{A1}/feedback/{files[0]}")
            text = _text(page)
            _shot(page, f"feedback-{_role(klass, user)}")
        header = re.search(rf"{NB1} \(Score: ([0-9.]+)", text)
        assert header, text[:1500]
        assert float(header.group(1)) == pytest.approx(grades[user]["notebooks"][NB1][2]), text[:600]
        assert _marker(user) in text and _marker(other) not in text
        if user == a:
            assert f"Written response (Score: {ESSAY_SCORE} / 3.0)" in text


def test_6_no_student_kernel_reads_the_course_a_classmate_or_the_hidden_checks(klass, hub, browser):
    _need("submitted")
    a, b = klass.students
    with _step(klass, "6 privacy probes from both students' kernels"):
        for user, other in ((a, b), (b, a)):
            got, expected = _privacy(klass, hub, user, other, only=set(PROBES) - {"other_inbound_submission"})
            print(f"{_role(klass, user)}'s kernel:", got)
            assert got == expected, {k: (got[k], v) for k, v in expected.items() if got[k] != v}


PROBES = ("course_root", "source", "gradebook", "other_home", "other_home_notebook", "inbound_listing",
          "other_inbound_submission", "judging", "other_exchange_feedback", "other_home_feedback")


def test_7_a_classmates_inbound_submission_is_unreadable_even_by_its_exact_path(klass, hub, browser):
    _need("submitted")
    a, b = klass.students
    for user, other in ((a, b), (b, a)):
        got, expected = _privacy(klass, hub, user, other, only={"other_inbound_submission"})
        assert got == expected, {k: (got[k], v) for k, v in expected.items() if got[k] != v}
