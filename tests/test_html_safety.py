"""Student HTML is data: ``rlhf_lab/instructor/grader/html_safety.py`` and its wiring in ``nbgrader_config.py``.

Fast tests. A notebook built with nbformat carries every payload of the attack review (a
``text/html`` script, an SVG with ``onload``, ``application/javascript``, a widget view, markdown
with ``<script>``/``<img onerror>``/``<form>``/``<iframe>``/``<meta refresh>``/``javascript:`` links,
an ``<a target formaction>``, image metadata that breaks out of nbconvert's unquoted ``width=``, a
string execution count) next to benign content (a pandas-style table, headings, math, code, a PNG
plot). After :class:`SanitizeNotebook` the notebook is rendered with nbconvert's own templates and
the page is parsed with :mod:`html.parser`: no element, attribute or URL that can run script may be
left, and the benign content must still be there. The course configuration is loaded as nbgrader
loads it and checked to sanitise on every HTML path without changing a grade.

The module is loaded by its file path, as ``nbgrader_config.py`` loads it.
"""
from __future__ import annotations

import copy
import importlib.util
import re
from html import unescape
from html.parser import HTMLParser
from pathlib import Path

import nbformat
import pytest
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook, new_output, new_raw_cell
from course_support import course_config

REPO = Path(__file__).resolve().parents[1]
MODULE = REPO / "helpers" / "rlhf_lab" / "instructor" / "grader" / "html_safety.py"

PNG = ("iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAAAABJRU5ErkJggg==")
JS = "window.__pwned = 1; document.title = 'pwned'; alert(1)"
NOTE = "[an output that runs script was removed by the grader]"


def _load():
    spec = importlib.util.spec_from_file_location("rlhf_lab_course_html_safety_test", MODULE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


hs = _load()


# ------------------------------------------------------------------------------ the hostile notebook
def _display(data, metadata=None, kind="display_data"):
    if kind == "execute_result":
        return new_output("execute_result", data=data, metadata=metadata or {}, execution_count=3)
    return new_output("display_data", data=data, metadata=metadata or {})


HOSTILE_MARKDOWN = [
    f"<script>{JS}</script>",
    f'<img src="x" onerror="{JS}">',
    "<form action=\"javascript:alert(1)\"><button formaction=\"javascript:alert(2)\">go</button></form>",
    "<iframe srcdoc=\"<script>parent.__pwned=1</script>\"></iframe>",
    "<object data=\"javascript:alert(1)\"></object><embed src=\"javascript:alert(1)\">",
    "<meta http-equiv=\"refresh\" content=\"0;url=javascript:alert(1)\"><base href=\"https://evil.example/\">",
    "<link rel=\"stylesheet\" href=\"https://evil.example/x.css\"><style>body{background:url(https://evil.example/b)}</style>",
    "[click me](javascript:alert(1)) and [me too](jav&#x61;script:alert(2)) and <javascript:alert(3)>",
    "[ref]: javascript:alert(4)\n\n[by reference][ref]",
    "<a href=\"javascript:alert(1)\">js link</a> <a href=\"https://ok.example/\" target=\"_blank\" onclick=\"x()\">ok</a>",
    "<a href=\" java\tscript:alert(1)\">tab</a> <a href=\"data:text/html,<script>alert(1)</script>\">data</a>",
    "<svg onload=\"alert(1)\"><circle r=\"1\"></circle></svg>",
    "<details open ontoggle=\"alert(1)\"><summary>s</summary>x</details>",
    "<div onfocus=alert(1) autofocus tabindex=1 \"broken\">x</div>",
    "<div <img src=x onerror=alert(1)>",
]

#: Markup that nbconvert's markdown renderer does not make live but a browser (or another renderer,
#: inside an HTML block) would: ``(payload, what the cleaned source must be)``.
BROWSER_ONLY_MARKDOWN = [
    ("<div>\n<https://ok.example/x/onmouseover=alert(1)>\n</div>",
     '<div>\n<a href="https://ok.example/x/onmouseover=alert(1)">https://ok.example/x/onmouseover=alert(1)</a>\n</div>'),
    ("<div>\n<javascript:alert(1)/onmouseover=alert(1)>\n</div>", "<div>\n&lt;javascript:alert(1)/onmouseover=alert(1)>\n</div>"),
    ("<!--> <img src=x onerror=alert(1)> -->", ""),
    ("<div>\n\\<img src=x onerror=alert(1)>\n</div>", "<div>\n&lt;img src=x onerror=alert(1)>\n</div>"),
    ("<div>\n<x-y <img src=x onerror=alert(1)>\n</div>", '<div>\n&lt;x-y <img src="x">\n</div>'),
]

SVG_BAD = ('<svg xmlns="http://www.w3.org/2000/svg" xmlns:xlink="http://www.w3.org/1999/xlink" '
           'onload="alert(1)"><script>alert(2)</script><foreignObject><div>x</div></foreignObject>'
           '<a xlink:href="javascript:alert(3)"><circle r="5"/></a><set attributeName="href" to="javascript:alert(4)"/>'
           '<rect width="2" height="2" fill="url(https://evil.example/x)" onclick="alert(5)"/></svg>')


def hostile_outputs():
    return [
        _display({"text/html": f"<b>bold</b><script>{JS}</script><img src=x onerror=\"{JS}\">", "text/plain": "<HTML>"}),
        _display({"application/javascript": JS, "text/plain": "<IPython.core.display.Javascript object>"}),
        _display({"application/vnd.jupyter.widget-view+json": {"model_id": "abc", "version_major": 2,
                                                              "version_minor": 0}, "text/plain": "IntSlider(value=0)"}),
        _display({"image/svg+xml": SVG_BAD}),
        _display({"text/markdown": f"md <img src=x onerror=\"{JS}\"> [x](javascript:alert(1))"}),
        _display({"image/png": "AAAA"}, {"image/png": {"width": "1 onerror=alert(1)", "height": 2}}),
        _display({"image/png": "\" onerror=\"alert(1)"}),
        _display({"text/html": "<p>isolated</p>"}, {"text/html": {"isolated": True}}),
        _display({"text/vnd.mermaid": "graph TD; A-->B"}),
        _display({"text/html": "<b>x</b>"}, kind="execute_result"),
    ]


TABLE = ('<div><style scoped>.dataframe tbody tr th { vertical-align: top; }</style>'
         '<table border="1" class="dataframe"><thead><tr style="text-align: right;"><th></th><th>reward</th></tr>'
         '</thead><tbody><tr><th>0</th><td>1.5</td></tr></tbody></table></div>')
BENIGN_MARKDOWN = ("# Clipped objective\n\nThe ratio $r_t(\\theta)$ with $A < 0$ and $y_{i,<t}$:\n\n"
                   "$$L = \\min(r A, \\mathrm{clip}(r, 1-\\epsilon, 1+\\epsilon) A)$$\n\n"
                   "| step | loss |\n|---|---|\n| 1 | **0.5** |\n\n"
                   "Tokens `<eos>` and `<pad>`; see <a href=\"https://arxiv.org/abs/1707.06347\">the paper</a>.\n\n"
                   "```python\nif ratio < 1:\n    loss = -ratio\n```\n\n"
                   "<b>bold</b> and <span style=\"color: red\">red</span> ![plot](attachment:plot.png)")


def hostile_notebook():
    nb = new_notebook()
    nb.metadata["widgets"] = {"application/vnd.jupyter.widget-state+json": {"state": {}}}
    nb.cells.append(new_markdown_cell(BENIGN_MARKDOWN, attachments={"plot.png": {"image/png": PNG}}))
    nb.cells.extend(new_markdown_cell(src) for src in HOSTILE_MARKDOWN)
    nb.cells.append(new_raw_cell(f"<script>{JS}</script><b>raw</b>", metadata={"raw_mimetype": "text/html"}))
    nb.cells.append(new_code_cell("show()", execution_count=2, outputs=hostile_outputs()))
    nb.cells.append(new_code_cell("df", execution_count=4, outputs=[
        new_output("execute_result", data={"text/html": TABLE, "text/plain": "   reward\n0     1.5"}, execution_count=4),
        new_output("display_data", data={"image/png": PNG, "text/plain": "<Figure>"}, metadata={"image/png": {"width": 300}}),
        new_output("stream", name="stdout", text="<script>printed, not run</script>\n"),
        new_output("error", ename="AssertionError", evalue="<img src=x onerror=alert(1)> is wrong",
                   traceback=["\x1b[0;31mAssertionError\x1b[0m: <img src=x onerror=alert(1)> is wrong"]),
    ]))
    return nb


# ------------------------------------------------------------------------------------ the oracle
FORBIDDEN_TAGS = {"script", "iframe", "frame", "frameset", "object", "embed", "form", "button", "input", "textarea",
                  "meta", "base", "link", "style", "svg", "math", "applet", "template", "select", "portal"}


VOID = {"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "source", "track", "wbr"}


class Page(HTMLParser):
    """Every start tag of an HTML page, with its attributes (entities decoded), and its text.

    With ``regions`` (class names), only what is inside an element of one of those classes.
    """

    def __init__(self, text: str, regions: tuple = ()):
        super().__init__(convert_charrefs=True)
        self.tags: list[tuple[str, dict]] = []
        self.text: list[str] = []
        self.regions, self.stack, self.inside = set(regions), [], 0
        self.feed(text)

    def _counts(self) -> bool:
        return not self.regions or self.inside > 0

    def handle_starttag(self, tag, attrs):
        attrs = {k: (v or "") for k, v in attrs}
        opens = bool(self.regions & set(attrs.get("class", "").split()))
        if self._counts() or opens:
            self.tags.append((tag, attrs))
        if tag not in VOID:
            self.stack.append((tag, opens))
            self.inside += opens

    def handle_startendtag(self, tag, attrs):
        if self._counts():
            self.tags.append((tag, {k: (v or "") for k, v in attrs}))

    def handle_endtag(self, tag):
        while self.stack:
            name, opened = self.stack.pop()
            self.inside -= opened
            if name == tag:
                break

    def handle_data(self, data):
        if self._counts():
            self.text.append(data)


def _scheme(url: str) -> str:
    url = re.sub(r"[\x00-\x20\x7f]+", "", unescape(url)).lower()
    match = re.match(r"^([a-z][a-z0-9+.\-]*):", url)
    return match.group(1) if match else ""


def script_surfaces(page: str, regions: tuple = ()) -> list[str]:
    """Everything in ``page`` (in its ``regions``) a browser could run: forbidden elements, event
    handlers, unsafe URLs."""
    found = []
    parsed = Page(page, regions)
    for tag, attrs in parsed.tags:
        if tag in FORBIDDEN_TAGS:
            found.append(f"<{tag}>")
        for name, value in attrs.items():
            if name.startswith("on") or name in ("formaction", "srcdoc", "target", "autofocus"):
                found.append(f"<{tag} {name}>")
            if name in ("href", "src", "action", "data", "xlink:href", "content", "background", "poster"):
                scheme = _scheme(value)
                if scheme in ("javascript", "vbscript", "file"):
                    found.append(f"<{tag} {name}={value[:40]}>")
                if scheme == "data" and not (tag == "img" and re.match(r"data:image/(png|jpeg|svg\+xml);base64,", value)):
                    found.append(f"<{tag} {name}={value[:40]}>")
    return found


def _render(nb, **config) -> str:
    """``nb`` rendered with nbconvert's classic HTML template (the one nbgrader's templates extend),
    without any sanitising of nbconvert's own unless ``config`` asks for it."""
    from nbconvert.exporters import HTMLExporter
    from traitlets.config import Config

    cfg = Config({"HTMLExporter": {"template_name": "classic", "exclude_input_prompt": False, **config}})
    body, _ = HTMLExporter(config=cfg).from_notebook_node(copy.deepcopy(nb))
    return body


def _cells_html(page: str) -> str:
    """The notebook part of a classic page (its <head> scripts are the template's, not the student's)."""
    start = page.find('<div class="cell')
    assert start > 0, page[:500]
    return page[start:]


# ------------------------------------------------------------------------------------ tests
def test_the_hostile_notebook_is_hostile_without_the_sanitiser():
    """The payloads really reach nbconvert's page as script (else the tests below prove nothing)."""
    found = script_surfaces(_cells_html(_render(hostile_notebook())))
    for surface in ("<script>", "<img onerror>", "<iframe>", "<form>", "<meta>", "<button formaction>", "<a target>",
                    "<svg>", "<details ontoggle>"):
        assert surface in found, (surface, found)
    assert any(s.startswith("<a href=javascript") for s in found), found
    assert any("img" in s and "onerror" in s for s in found)


def test_sanitised_notebook_renders_without_any_script_surface():
    nb = hostile_notebook()
    hs.SanitizeNotebook().preprocess(nb, {})
    page = _cells_html(_render(nb))
    assert script_surfaces(page) == []
    text = "".join(Page(page).text)
    # what the student tried is shown as text, not run
    assert "<script>" in text and "alert(1)" in text


def test_script_outputs_become_a_note_and_widget_state_is_dropped():
    nb = hostile_notebook()
    hs.clean_notebook(nb)
    outputs = nb.cells[-2].outputs
    assert outputs[1].data == {"text/plain": NOTE}  # application/javascript
    assert outputs[2].data == {"text/plain": NOTE}  # widget view
    assert all(o.output_type == "display_data" for o in outputs[:-1])
    assert "widgets" not in nb.metadata
    assert nb.cells[-2].outputs[-1].execution_count == 3
    assert "text/vnd.mermaid" not in outputs[8].data


def test_execution_counts_that_are_not_numbers_are_cleared():
    """A kernel reports whatever execution count student code makes it report; nbconvert would
    refuse to render the notebook (and Formgrader could not show it)."""
    nb = hostile_notebook()
    nb.cells[-2].execution_count = "<img src=x onerror=alert(1)>"
    nb.cells[-2].outputs[-1].execution_count = "<img src=x onerror=alert(2)>"
    hs.clean_notebook(nb)
    assert nb.cells[-2].execution_count is None and nb.cells[-2].outputs[-1].execution_count is None
    assert script_surfaces(_cells_html(_render(nb))) == []


def test_image_outputs_keep_only_base64_and_numeric_sizes():
    nb = hostile_notebook()
    hs.clean_notebook(nb)
    outputs = nb.cells[-2].outputs
    assert outputs[5].data == {"image/png": "AAAA"}
    assert outputs[5].metadata == {"image/png": {"height": 2}}
    assert "image/png" not in outputs[6].data
    assert outputs[7].metadata == {}  # no "isolated" iframe either
    plot = nb.cells[-1].outputs[1]
    assert plot.data["image/png"] == PNG and plot.metadata == {"image/png": {"width": 300}}


def test_svg_is_rebuilt_without_script_or_outside_references():
    nb = hostile_notebook()
    hs.clean_notebook(nb)
    svg = nb.cells[-2].outputs[3].data["image/svg+xml"]
    lowered = svg.lower()
    for bad in ("onload", "<script", "foreignobject", "javascript", "onclick", "<set", "evil.example"):
        assert bad not in lowered, (bad, svg)
    assert "<circle" not in lowered  # it was inside the javascript: link
    assert 'width="2"' in svg


def test_svg_that_is_not_plain_svg_becomes_text():
    out = _display({"image/svg+xml": '<!DOCTYPE svg [<!ENTITY x "y">]><svg xmlns="http://www.w3.org/2000/svg">&x;</svg>'})
    hs.clean_output(out)
    assert out.data == {"text/plain": "[an SVG image that could not be checked was removed by the grader]"}


def test_benign_content_survives():
    nb = hostile_notebook()
    hs.clean_notebook(nb)
    page = _cells_html(_render(nb))
    parsed = Page(page)
    tags = [t for t, _ in parsed.tags]
    text = "".join(parsed.text)
    # the table of the DataFrame, headings, markdown table, code block, images
    assert {"table", "thead", "tbody", "th", "td", "h1", "pre", "code", "b", "span", "a"} <= set(tags)
    assert any(t == "table" and a.get("class") == "dataframe" for t, a in parsed.tags)
    assert any(t == "img" and a.get("src") == f"data:image/png;base64,{PNG}" for t, a in parsed.tags)
    assert any(t == "a" and a.get("href") == "https://arxiv.org/abs/1707.06347" for t, a in parsed.tags)
    assert any(t == "span" and a.get("style") == "color: red" for t, a in parsed.tags)
    # math reaches MathJax as TeX; "<" as \lt (the same symbol), never as an escaped entity
    assert "$r_t(\\theta)$" in text and "$A < 0$" in text and "$y_{i,\\lt t}$" in text
    assert "\\mathrm{clip}(r, 1-\\epsilon, 1+\\epsilon)" in text
    # code keeps its text
    assert "<eos>" in text and "<pad>" in text and "if ratio < 1:" in text
    # streams and errors are exactly as they were (escaped by nbconvert, not by us)
    assert "<script>printed, not run</script>" in text
    assert "<img src=x onerror=alert(1)> is wrong" in text
    assert "Clipped objective" in text and "0.5" in text and "1.5" in text


def test_streams_errors_and_cell_metadata_are_untouched():
    nb = hostile_notebook()
    for cell in nb.cells:
        cell.metadata["nbgrader"] = {"grade": True, "grade_id": f"g{id(cell) % 97}", "points": 2,
                                     "checksum": "abc", "solution": False, "locked": True}
    before = copy.deepcopy(nb)
    hs.clean_notebook(nb)
    for old, new in zip(before.cells, nb.cells):
        assert old.metadata == new.metadata
        if old.cell_type == "code":
            assert [o for o in old.outputs if o.output_type in ("stream", "error")] == \
                   [o for o in new.outputs if o.output_type in ("stream", "error")]
            assert [o.output_type for o in old.outputs] == [o.output_type for o in new.outputs]
            assert old.source == new.source


def test_cleaning_is_idempotent():
    nb = hostile_notebook()
    hs.clean_notebook(nb)
    once = copy.deepcopy(nb)
    assert hs.clean_notebook(nb) == []
    assert nb == once


@pytest.mark.parametrize("source", HOSTILE_MARKDOWN)
def test_each_markdown_payload_alone(source):
    from nbconvert.filters.markdown_mistune import markdown2html_mistune

    assert script_surfaces(markdown2html_mistune(source)), "the payload must be live before cleaning"
    cleaned = hs.clean_markdown(source)
    assert script_surfaces(markdown2html_mistune(cleaned)) == [], cleaned


@pytest.mark.parametrize("source,expected", BROWSER_ONLY_MARKDOWN)
def test_markup_a_browser_would_read_is_escaped(source, expected):
    assert hs.clean_markdown(source) == expected


def test_course_markdown_renders_the_same():
    """Every markdown cell of the course's own notebooks shows the same text after cleaning."""
    from nbconvert.filters.markdown_mistune import markdown2html_mistune

    def shown(src: str) -> str:
        # (a bare <eos> outside code is an unknown HTML element: the original page hides it, the
        # cleaned page shows it as text; both are compared without it)
        text = "".join(Page(markdown2html_mistune(src)).text).replace("\\lt ", "<").replace("<eos>", "")
        return re.sub(r"\s+", " ", text)

    checked = 0
    for path in sorted((REPO / "source").glob("*/*.ipynb")):
        for cell in nbformat.read(path, as_version=4).cells:
            if cell.cell_type == "markdown":
                assert shown(hs.clean_markdown(cell.source)) == shown(cell.source), (path.name, cell.source[:200])
                checked += 1
    assert checked > 20


def test_clean_html_keeps_tables_and_drops_script():
    cleaned = hs.clean_html(TABLE + f"<script>{JS}</script><a href='javascript:x()' target=_blank>l</a>")
    assert "<table border=\"1\" class=\"dataframe\">" in cleaned and "<th>reward</th>" in cleaned
    assert "<style" not in cleaned and "<script" not in cleaned and "javascript" not in cleaned
    assert "target" not in cleaned
    assert hs.clean_html(cleaned) == cleaned


def test_classes_that_formgrader_scripts_use_are_dropped():
    cleaned = hs.clean_markdown('<span class="score full-credit">10</span> <button class="btn">x</button>')
    assert "score" not in cleaned and "full-credit" not in cleaned and "<button" not in cleaned


def test_feedback_pages_carry_a_csp_that_forbids_script():
    from traitlets.config import Config

    nb = hostile_notebook()
    exporter = hs.FeedbackExporter(config=Config({"HTMLExporter": {"template_name": "classic"}}))
    page, _ = exporter.from_notebook_node(nb)
    head = page[page.lower().index("<head"):]
    first = Page(head).tags[1]  # the tag right after <head>
    assert first[0] == "meta" and first[1]["http-equiv"] == "Content-Security-Policy", first
    policy = first[1]["content"]
    # no script but the page's own MathJax loader, by its hash (tests/test_feedback_page.py)
    assert re.search(r"script-src 'sha256-[A-Za-z0-9+/]+=*' 'strict-dynamic'(;|$)", policy), policy
    assert "connect-src 'none'" in policy and "form-action 'none'" in policy


# ------------------------------------------------------------------------------ the course config


def test_course_config_sanitises_every_html_path_after_grading():
    cfg = course_config()
    names = [p.__name__ for p in cfg.Autograde.autograde_preprocessors]
    assert names[-1] == "SanitizeNotebook", names
    assert names.index("SaveAutoGrades") < names.index("SanitizeNotebook")
    assert [p.__name__ for p in cfg.GenerateFeedback.preprocessors][-1] == "SanitizeNotebook"
    assert cfg.GenerateFeedback.exporter_class.__name__ == "FeedbackExporter"
    assert cfg.HTMLExporter.sanitize_html is True
    assert [p.__name__ for p in cfg.HTMLExporter.preprocessors] == ["SanitizeNotebook"]
    assert cfg.HTMLExporter.filters["clean_html"].__name__ == "clean_html"
    assert {"float", "round"} <= set(cfg.HTMLExporter.filters)


def test_formgrader_exporter_with_course_config_renders_an_unsanitised_notebook_safely():
    """Formgrader builds ``HTMLExporter(config=...)`` from the course config with its ``formgrade``
    template; a notebook autograded before the sanitiser existed must render safely too."""
    from nbconvert.exporters import HTMLExporter
    from nbgrader.server_extensions.formgrader import handlers
    from traitlets.config import Config

    cfg = course_config()
    cfg.merge(Config({"HTMLExporter": {"template_name": "formgrade", "extra_template_basedirs": [handlers.template_path]}}))
    nb = hostile_notebook()
    for i, cell in enumerate(nb.cells):  # a student's answer cells, as Formgrader shows them
        cell.metadata["nbgrader"] = {"solution": True, "grade": cell.cell_type == "markdown", "grade_id": f"answer_{i}",
                                     "points": 1, "locked": False, "schema_version": 3}
    resources = {"assignment_id": "a1", "notebook_id": "nb", "submission_id": "s1", "index": 0, "total": 1,
                 "base_url": "", "student": "hx", "last_name": "X", "first_name": "H", "notebook_path": "x"}
    page, _ = HTMLExporter(config=cfg).from_notebook_node(nb, resources=resources)
    # the student's parts of the page: rendered markdown, outputs, code (the rest is Formgrader's own
    # grading form, with its buttons and inputs)
    student = ("text_cell_render", "output_subarea", "input_area")
    assert len(Page(page, student).tags) > 50
    assert script_surfaces(page, student) == [], script_surfaces(page, student)
    assert "<table" in page and "data:image/png;base64," in page
    # without the course config the same page is live: the check sees what it must
    plain = Config({"HTMLExporter": {"template_name": "formgrade", "extra_template_basedirs": [handlers.template_path]}})
    live, _ = HTMLExporter(config=plain).from_notebook_node(hostile_notebook_with(nb), resources=resources)
    assert "<script>" in script_surfaces(live, student) and "<img onerror>" in script_surfaces(live, student)


def hostile_notebook_with(nb):
    """A fresh hostile notebook with the cell metadata of ``nb``."""
    fresh = hostile_notebook()
    for new, old in zip(fresh.cells, nb.cells):
        new.metadata = copy.deepcopy(old.metadata)
    return fresh


def test_grades_of_a_graded_notebook_do_not_change():
    """nbgrader's own grade of every grade cell is the same before and after the sanitiser."""
    from nbgrader.utils import determine_grade, is_grade

    nb = nbformat.read(REPO / "release" / "a1_ppo_objective" / "01_clipped_objective.ipynb", as_version=4)
    graded = 0
    for cell in nb.cells:
        if cell.cell_type == "code" and is_grade(cell):
            # partial credit read from text/plain next to a script; a failure; a pass with script outputs
            last = [new_output("execute_result", data={"text/plain": "0.5", "text/html": f"<script>{JS}</script>"},
                               execution_count=1),
                    new_output("error", ename="AssertionError", evalue="<b>x</b>", traceback=["<b>x</b>"]),
                    new_output("stream", name="stdout", text="<b>ok</b>\n")][graded % 3]
            cell.outputs = [o for o in hostile_outputs() if o.output_type == "display_data"] + [last]
            graded += 1
        elif cell.cell_type == "markdown":
            cell.source += "\n\n<img src=x onerror=alert(1)>"
    before = [(c.metadata.get("nbgrader"), determine_grade(c)) for c in nb.cells if is_grade(c) and c.cell_type == "code"]
    hs.clean_notebook(nb)
    after = [(c.metadata.get("nbgrader"), determine_grade(c)) for c in nb.cells if is_grade(c) and c.cell_type == "code"]
    assert graded >= 3 and before == after
    assert {grade for _, (grade, _) in before} >= {0, 0.5 * before[0][1][1]} or len({g for _, (g, _) in before}) >= 2
