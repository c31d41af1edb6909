"""Feedback pages load the course's own MathJax, by the one script their policy lets run.

``FeedbackExporter`` (``rlhf_lab/instructor/grader/html_safety.py``) renders a page whose only script
is an inline loader: its SHA-256 is the only source of the Content-Security-Policy's ``script-src``
(with ``'strict-dynamic'``: the files MathJax loads itself may run, nothing parser-inserted), it
points at MathJax.js of the installed ``jupyter-server-mathjax`` (a file on this machine, never a
CDN), and no ``text/x-mathjax-config`` block (which only ``eval`` could run) is left. Long lines
wrap. The course configuration points the exporter at that copy. A real page in Chromium:
``tests/test_feedback_page_browser.py``.
"""
from __future__ import annotations

import base64
import hashlib
import os
import re
import urllib.parse
import urllib.request
from html.parser import HTMLParser
from pathlib import Path

from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook, new_output
from traitlets.config import Config

from rlhf_lab.instructor.grader import html_safety as hs

REPO = Path(__file__).resolve().parents[1]


class _Scripts(HTMLParser):
    def __init__(self):
        super().__init__(convert_charrefs=False)
        self.scripts, self.csp, self._in = [], None, None

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if tag == "script":
            self._in = {"attrs": attrs, "text": ""}
            self.scripts.append(self._in)
        if tag == "meta" and (attrs.get("http-equiv") or "").lower() == "content-security-policy":
            self.csp = attrs["content"]

    def handle_data(self, data):
        if self._in is not None:
            self._in["text"] += data

    def handle_endtag(self, tag):
        if tag == "script":
            self._in = None


def _nbgrader_feedback_template() -> dict:
    """The HTMLExporter settings ``nbgrader generate_feedback`` uses (nbgrader's ``feedback`` template)."""
    import nbgrader

    here = Path(nbgrader.__file__).parent / "server_extensions" / "formgrader"
    return {"template_name": "feedback", "extra_template_basedirs": [str(here / "templates")],
            "extra_template_paths": [str(here / "static" / "node_modules" / "bootstrap" / "dist" / "css")]}


def _page(**traits) -> tuple[str, _Scripts]:
    nb = new_notebook(cells=[
        new_markdown_cell("The ratio $\\rho = \\pi_\\text{new}(a)/\\pi_\\text{old}(a)$ and $$\\min(\\rho A, c A)$$"),
        new_code_cell("raise AssertionError('x' * 400)", outputs=[new_output(
            "error", ename="AssertionError", evalue="a diagnosis " + "long " * 200, traceback=["AssertionError"])]),
    ])
    exporter = hs.FeedbackExporter(config=Config({"HTMLExporter": _nbgrader_feedback_template(),
                                                  "FeedbackExporter": traits}))
    resources = {"nbgrader": {"notebook": "01_demo", "score": 1.0, "max_score": 2.0, "late_penalty": 0.0}}
    page, _ = exporter.from_notebook_node(nb, resources=resources)
    parser = _Scripts()
    parser.feed(page)
    return page, parser


def _script_src(policy: str) -> list[str]:
    for directive in policy.split(";"):
        parts = directive.split()
        if parts and parts[0] == "script-src":
            return parts[1:]
    raise AssertionError(f"no script-src in {policy!r}")


def test_the_only_script_is_the_mathjax_loader_and_the_policy_names_its_hash():
    page, parsed = _page()
    assert parsed.csp is not None
    assert "x-mathjax-config" not in page and "cdnjs" not in page and "cdn.jsdelivr" not in page
    assert len(parsed.scripts) == 1, [s["attrs"] for s in parsed.scripts]
    (loader,) = parsed.scripts
    assert loader["attrs"] == {}, loader["attrs"]  # inline, no src, no type: exactly what the hash covers
    digest = base64.b64encode(hashlib.sha256(loader["text"].encode("utf-8")).digest()).decode()
    assert _script_src(parsed.csp) == [f"'sha256-{digest}'", "'strict-dynamic'"], parsed.csp
    for directive in ("default-src 'none'", "connect-src 'none'", "object-src 'none'", "form-action 'none'",
                      "base-uri 'none'", "frame-src 'none'"):
        assert directive in parsed.csp, parsed.csp
    # the MathJax it loads is the course environment's file, on this machine
    urls = re.findall(r'"((?:file|https?)://[^"]*MathJax\.js[^"]*)"', loader["text"])
    assert urls and all(u.startswith("file://") for u in urls), urls
    path = Path(urllib.request.url2pathname(urllib.parse.urlparse(urls[0]).path))
    assert path.is_file() and "jupyter_server_mathjax" in path.parts, path
    assert (path.parent / "config" / "TeX-AMS-MML_HTMLorMML-full.js").is_file()
    assert "white-space: pre-wrap" in page and "overflow-wrap: anywhere" in page


def test_without_a_mathjax_url_the_page_runs_no_script_at_all():
    page, parsed = _page(mathjax_url="")
    assert parsed.scripts == [] and "x-mathjax-config" not in page
    assert _script_src(parsed.csp) == ["'none'"], parsed.csp


def test_allow_script_touches_only_script_and_font_sources():
    policy = hs.allow_script(hs.FEEDBACK_CSP, "'sha256-abc='")
    assert _script_src(policy) == ["'sha256-abc='", "'strict-dynamic'"]
    assert "font-src 'self' data:" in policy
    def rest(p):
        return sorted(d.strip() for d in p.split(";") if not d.strip().startswith(("script-src", "font-src")))

    assert rest(policy) == rest(hs.FEEDBACK_CSP)


def test_course_config_points_feedback_pages_at_the_installed_mathjax():
    from traitlets.config.loader import PyFileConfigLoader

    saved = dict(os.environ)
    try:
        os.environ.update(RLHF_COURSE_ROOT=str(REPO), RLHF_COURSE_DB="sqlite:///" + str(REPO / "gradebook.db"))
        cfg = PyFileConfigLoader("nbgrader_config.py", path=str(REPO)).load_config()
    finally:
        os.environ.clear()
        os.environ.update(saved)
    url = cfg.FeedbackExporter.mathjax_url
    assert url.startswith("file://") and url.endswith("?config=TeX-AMS-MML_HTMLorMML-full,Safe"), url
    assert Path(urllib.request.url2pathname(urllib.parse.urlparse(url).path)).is_file(), url
    assert cfg.FeedbackExporter.wrap_long_lines is True
    assert "jupyter-server-mathjax==0.2.6" in (REPO / "requirements.txt").read_text().split()
