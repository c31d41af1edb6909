"""Student HTML never runs in an instructor's or a classmate's browser.

A submitted notebook is data written by the student: its outputs can carry ``text/html`` with
``<script>``, an SVG with ``onload``, ``application/javascript``, a widget view; its markdown cells
can carry raw HTML (``<img onerror>``, ``<iframe>``, ``<form>``, ``javascript:`` links, ``<meta
http-equiv=refresh>``). Formgrader renders the autograded notebook on the same origin as the
Jupyter API (with its XSRF cookie), and the feedback pages students open are rendered from the
same notebooks, so anything that runs there acts as the instructor.

This module sanitises the notebook *as data* (stdlib, nbconvert with its jinja2, bleach and
traitlets only; the course's ``nbgrader_config.py`` loads it by file path):

* :class:`SanitizeNotebook` (an nbconvert preprocessor) keeps, in every output, only
  ``text/plain``, ``text/latex``, ``image/png``, ``image/jpeg`` (valid base64), sanitised
  ``text/html`` and ``text/markdown`` and an ``image/svg+xml`` rebuilt from an allowlist; an output
  that carries script (``application/javascript``, a widget view, ...) is replaced by the note
  :data:`SCRIPT_NOTE`. Image metadata keeps only numeric sizes (nbconvert writes ``width=`` without
  quotes), execution counts must be integers. Markdown cell sources keep their markdown and math;
  their raw HTML is rebuilt tag by tag from an allowlist (:func:`clean_markdown`), and link
  destinations with other schemes than http(s)/mailto/relative become ``#``. ``stream`` and
  ``error`` outputs and all cell metadata are left exactly as they are (nbconvert escapes them).
* :func:`clean_html` is the bleach policy for HTML fragments; ``nbgrader_config.py`` also registers
  it as the exporters' ``clean_html`` filter, which nbconvert applies to HTML and markdown outputs
  once ``HTMLExporter.sanitize_html`` is on.
* :class:`FeedbackExporter` is nbconvert's HTML exporter plus a Content-Security-Policy ``<meta>``
  (:data:`FEEDBACK_CSP`: no requests, no forms, no frames, and no script but the course's MathJax)
  in every page. The page loads MathJax from the course environment (``jupyter-server-mathjax``,
  never a CDN): one inline loader whose SHA-256 is the only script source the policy names
  (``'strict-dynamic'`` lets the files MathJax loads itself run, nothing parser-inserted); its long
  lines wrap (:data:`WRAP_CSS`), so a failing cell's diagnosis is never cut off.

Everything is idempotent: cleaning a clean notebook changes nothing.
"""
from __future__ import annotations

import base64
import binascii
import hashlib
import html
import importlib.util
import json
import re
import urllib.parse
import xml.etree.ElementTree as ET
from pathlib import Path

from jinja2 import DictLoader
from nbconvert.exporters import HTMLExporter
from nbconvert.preprocessors import Preprocessor
from traitlets import Bool, Unicode, default

SCRIPT_NOTE = "[an output that runs script was removed by the grader]"
UNSAFE_NOTE = "[an output that cannot be shown safely was removed by the grader]"
SVG_NOTE = "[an SVG image that could not be checked was removed by the grader]"

#: Mime types an output keeps (each one checked or cleaned, see :func:`clean_output`).
KEPT_MIMES = ("text/plain", "text/latex", "image/png", "image/jpeg", "text/html", "text/markdown",
              "image/svg+xml")

#: The Content-Security-Policy of feedback pages: nothing in them may run, fetch, submit or frame.
#: :class:`FeedbackExporter` lets exactly its MathJax loader run (see :func:`allow_script`).
FEEDBACK_CSP = ("default-src 'none'; script-src 'none'; object-src 'none'; frame-src 'none'; "
                "connect-src 'none'; form-action 'none'; base-uri 'none'; img-src 'self' data: https:; "
                "style-src 'unsafe-inline'; font-src data:")

# ------------------------------------------------------------------------------------ the policy
ALLOWED_TAGS = frozenset("""
a abbr b blockquote br caption center cite code col colgroup dd del details dfn div dl dt em
figcaption figure h1 h2 h3 h4 h5 h6 hr i img ins kbd li mark ol p pre q s samp small span strike
strong sub summary sup table tbody td tfoot th thead tr tt u ul var
""".split())
VOID_TAGS = frozenset({"br", "col", "hr", "img"})
_GLOBAL_ATTRS = frozenset({"title", "align", "class", "style", "lang", "dir"})
_TAG_ATTRS = {
    "a": {"href"},
    "img": {"src", "alt", "width", "height"},
    "td": {"colspan", "rowspan", "valign"},
    "th": {"colspan", "rowspan", "valign", "scope"},
    "col": {"span", "width"},
    "colgroup": {"span", "width"},
    "ol": {"start", "type"},
    "li": {"value"},
    "table": {"border", "cellpadding", "cellspacing", "width"},
    "details": {"open"},
    "abbr": {"title"},
    "q": {"cite"},
    "blockquote": {"cite"},
}
_NUMERIC_ATTRS = frozenset({"width", "height", "colspan", "rowspan", "span", "start", "value", "border",
                            "cellpadding", "cellspacing"})
_URL_ATTRS = frozenset({"href", "src", "cite"})
#: CSS properties a ``style`` attribute may set (no positioning: a page must not cover the grading UI).
ALLOWED_CSS = frozenset("""
color background-color font-weight font-style font-size font-family text-align text-decoration
vertical-align white-space width height min-width max-width border border-collapse border-color
border-style border-width border-top border-bottom border-left border-right padding padding-left
padding-right padding-top padding-bottom margin margin-left margin-right margin-top margin-bottom
line-height
""".split())
#: Class names a fragment may use: Pygments' short token classes, pandas' and a few text styles.
#: (Not Formgrader's own classes, which its scripts look up, such as ``score`` or ``full-credit``.)
_CLASS = re.compile(r"^(?:[a-z]{1,3}[0-9]?|highlight|hl-[a-z0-9]+|dataframe|alert(?:-(?:info|warning|success|danger))?"
                    r"|text-(?:left|right|center)|mark)$")
_NUMBER = re.compile(r"^\s*\d{1,5}(?:\.\d{1,4})?\s*%?\s*$")
_BASE64 = re.compile(r"^[A-Za-z0-9+/=\s]*$")
_SCHEME = re.compile(r"^([a-zA-Z][a-zA-Z0-9+.\-]*):")


def _normalised_url(value: str) -> str:
    """``value`` as a browser reads its scheme: entities decoded, backslash escapes, whitespace and
    control characters removed, lower case."""
    url = html.unescape(value)
    url = re.sub(r"[\x00-\x20\x7f-\xa0`\\]+", "", url)
    return url.lower()


def safe_url(value: str, image: bool = False) -> bool:
    """Whether a link (``image=False``) or an image source may point at ``value``.

    Links: http(s), mailto, ``#anchor`` and relative paths. Images: http(s), relative paths that
    stay below the page (no ``/...`` or ``..``, so no request to the Jupyter server's own API) and
    ``data:image/png|jpeg;base64``. Never ``javascript:``, ``vbscript:`` or another ``data:``.
    """
    url = _normalised_url(value)
    match = _SCHEME.match(url)
    if match:
        scheme = match.group(1)
        if scheme in ("http", "https"):
            return True
        if scheme == "mailto":
            return not image
        if scheme == "data":
            return bool(re.match(r"^data:image/(?:png|jpeg);base64,[a-z0-9+/=]*$", url))
        if scheme == "attachment":  # a markdown cell's own attachment (nbconvert embeds it)
            return image
        return False
    if ":" in url.split("/", 1)[0].split("?", 1)[0].split("#", 1)[0]:
        return False  # a scheme the pattern did not recognise
    if not image:
        return True
    if url.startswith("//"):
        return True  # another host, over http(s)
    path = urllib.parse.unquote(url)
    return not path.startswith("/") and ".." not in re.split(r"[/?#]", path)


def clean_style(value: str) -> str:
    """The declarations of a ``style`` attribute that :data:`ALLOWED_CSS` allows and that load
    nothing (no ``url()``, ``expression()``, ``@import``, CSS escapes or comments)."""
    kept = []
    for declaration in value.split(";"):
        name, sep, val = declaration.partition(":")
        name, val = name.strip().lower(), val.strip()
        if not sep or name not in ALLOWED_CSS:
            continue
        if re.search(r"url\s*\(|expression|image-set|@|\\|/\*|javascript|[<>\"]", val, re.I):
            continue
        if not re.fullmatch(r"[#%\w\s.,()+\-!']*", val):
            continue
        kept.append(f"{name}: {val}")
    return "; ".join(kept)


def clean_class(value: str) -> str:
    """The class names of ``value`` that :data:`_CLASS` allows."""
    return " ".join(token for token in value.split() if _CLASS.match(token))


def clean_attribute(tag: str, name: str, value: str) -> str | None:
    """The value attribute ``name`` of a ``tag`` element may keep, or ``None`` to drop it.

    No event handler (``on*``), ``target``, ``formaction``, ``srcdoc``, ``id`` or ``name`` (a page
    must not shadow Formgrader's own elements) survives: only :data:`_GLOBAL_ATTRS` and the
    attributes listed for the tag, with URLs checked by :func:`safe_url`, numbers checked as
    numbers, classes and styles filtered.
    """
    tag, name = tag.lower(), name.lower()
    if name not in _GLOBAL_ATTRS and name not in _TAG_ATTRS.get(tag, ()):
        return None
    if name in _URL_ATTRS:
        return value if safe_url(value, image=(tag == "img")) else None
    if name in _NUMERIC_ATTRS:
        return value if _NUMBER.match(value) else None
    if name == "class":
        value = clean_class(value)
    elif name == "style":
        value = clean_style(value)
    elif name == "type":
        value = value if re.fullmatch(r"[1aAiI]|disc|circle|square", value.strip()) else None
    elif name in ("valign", "scope", "align", "dir"):
        value = value if re.fullmatch(r"[A-Za-z\-]{1,12}", value.strip()) else None
    if name in ("class", "style") and not value:
        return None  # nothing of it was allowed
    return value


# ----------------------------------------------------------------------------------- HTML (bleach)
_STYLE_BLOCK = re.compile(r"<style\b[^>]*>.*?</style\s*>", re.I | re.S)


def _bleach_attribute(tag: str, name: str, value: str) -> bool:
    """bleach's attribute filter: keep an attribute only when the policy keeps all of it (a style
    with every declaration allowed, a class with every name allowed, an unchanged value)."""
    cleaned = clean_attribute(tag, name, value)
    if cleaned is None:
        return False
    if name.lower() == "style":
        declarations = [d for d in value.split(";") if d.strip()]
        return len(cleaned.split("; ")) == len(declarations)
    return cleaned == value


def clean_html(fragment) -> str:
    """An HTML fragment reduced to the course policy with bleach (escaped, never executed).

    ``<style>`` elements are removed with their content (a stylesheet could cover or restyle
    Formgrader's page); any other tag outside :data:`ALLOWED_TAGS` is escaped, so the instructor
    sees the markup as text. Registered as the exporters' ``clean_html`` filter, so it accepts the
    ``bytes`` nbconvert passes for SVG too.
    """
    import bleach
    from bleach.css_sanitizer import CSSSanitizer

    text = fragment.decode("utf-8", "replace") if isinstance(fragment, bytes) else str(fragment)
    text = _STYLE_BLOCK.sub("", text)
    return bleach.clean(
        text, tags=ALLOWED_TAGS, attributes=_bleach_attribute,
        protocols={"http", "https", "mailto", "data", "attachment"}, strip=False, strip_comments=True,
        css_sanitizer=CSSSanitizer(allowed_css_properties=ALLOWED_CSS),
    )


# ----------------------------------------------------------------------------------- markdown
_ATTR_NAME = r"[A-Za-z_:][A-Za-z0-9_.:\-]*"
_ATTR_VALUE = r"(?:\"[^\"]*\"|'[^']*'|[^\s\"'=<>`]+)"
_ATTR = re.compile(rf"\s+({_ATTR_NAME})(?:\s*=\s*({_ATTR_VALUE}))?")
_OPEN_TAG = re.compile(rf"<([A-Za-z][A-Za-z0-9\-]*)((?:\s+{_ATTR_NAME}(?:\s*=\s*{_ATTR_VALUE})?)*)\s*/?>")
_CLOSE_TAG = re.compile(r"</([A-Za-z][A-Za-z0-9\-]*)\s*>")
_AUTOLINK = re.compile(r"<((?:https?|mailto):[^\s<>\"']*)>", re.I)
_TAG_START = re.compile(r"<(?=[A-Za-z!?/])")
_FENCE = re.compile(r"^( {0,3})(`{3,}|~{3,})(.*)$")
_REFERENCE = re.compile(r"^( {0,3}\[[^\]\n]+\]:[ \t]*)(<[^<>\n]*>|\S+)", re.M)
_MATH_CLOSERS = (("$$", "$$"), ("\\[", "\\]"), ("\\(", "\\)"), ("$", "$"))


def _attribute_value(raw: str | None) -> str:
    if raw is None:
        return ""
    if raw[:1] in ("'", '"'):
        raw = raw[1:-1]
    return html.unescape(raw)


def rebuild_tag(match: re.Match) -> str | None:
    """The safe form of one matched start or end tag, or ``None`` when the tag is not allowed."""
    text = match.group(0)
    name = match.group(1).lower()
    if name not in ALLOWED_TAGS:
        return None
    if text.startswith("</"):
        return f"</{name}>"
    parts, seen = [name], set()
    for attr in _ATTR.finditer(match.group(2) or ""):
        attr_name = attr.group(1).lower()
        if attr_name in seen:
            continue  # a browser keeps the first of two equal names
        seen.add(attr_name)
        value = clean_attribute(name, attr_name, _attribute_value(attr.group(2)))
        if value is not None:
            parts.append(f'{attr_name}="{html.escape(value, quote=True)}"')
    return "<" + " ".join(parts) + ">"


def _clean_tag_at(text: str, i: int) -> tuple[str, int]:
    """Handle the ``<`` at ``text[i]``: ``(replacement, index after it)``.

    Allowed tags are rebuilt, comments dropped, http(s)/mailto autolinks become a rebuilt link;
    everything else that a browser could read as markup gets its ``<`` escaped.
    """
    if not _TAG_START.match(text, i):
        return "<", i + 1
    if text.startswith("<!--", i):
        end = text.find("-->", i + 4)
        if end >= 0:
            return "", end + 3
        return "&lt;", i + 1
    for pattern in (_OPEN_TAG, _CLOSE_TAG):
        match = pattern.match(text, i)
        if match:
            rebuilt = rebuild_tag(match)
            if rebuilt is None:
                return "&lt;", i + 1
            return rebuilt, match.end()
    match = _AUTOLINK.match(text, i)
    if match and safe_url(match.group(1)):
        url = html.escape(html.unescape(match.group(1)), quote=True)
        return f'<a href="{url}">{url}</a>', match.end()
    return "&lt;", i + 1


def _code_span_at(text: str, i: int) -> tuple[str, int] | None:
    """The code span that starts at the backticks at ``text[i]``: ``(replacement, end)``.

    A span whose content looks like markup becomes ``<code>`` with escaped content (it renders
    the same); other spans are kept as they are. ``None`` when the backticks open no span (no
    later run of exactly as many backticks).
    """
    run = re.match(r"`+", text[i:]).end()
    closing = next((m for m in re.finditer(r"`+", text[i + run:]) if m.end() - m.start() == run), None)
    if closing is None:
        return None
    start, end = i + run + closing.start(), i + run + closing.end()
    content = text[i + run:start]
    if not _TAG_START.search(content):
        return text[i:end], end
    shown = content.replace("\n", " ")
    if len(shown) > 2 and shown.startswith(" ") and shown.endswith(" ") and shown.strip():
        shown = shown[1:-1]
    return f"<code>{html.escape(shown, quote=False)}</code>", end


def _math_at(text: str, i: int) -> tuple[str, int] | None:
    """The math span at ``text[i]``: its markup-like ``<`` written as TeX's ``\\lt`` (MathJax shows
    the same symbol; an escaped ``&lt;`` would show as text). ``None`` when no span starts here."""
    for opener, closer in _MATH_CLOSERS:
        if text.startswith(opener, i):
            end = text.find(closer, i + len(opener))
            if end < 0 or (opener == "$" and end == i + 1):
                continue
            body = text[i + len(opener):end]
            body = _TAG_START.sub(r"\\lt ", body)
            return opener + body + closer, end + len(closer)
    match = re.match(r"\\begin\{([A-Za-z*]+)\}", text[i:])
    if match:
        closer = "\\end{" + match.group(1) + "}"
        end = text.find(closer, i + match.end())
        if end >= 0:
            body = _TAG_START.sub(r"\\lt ", text[i + match.end():end])
            return match.group(0) + body + closer, end + len(closer)
    return None


def _link_destination_at(text: str, i: int) -> tuple[str, int] | None:
    """At ``](`` (``text[i]`` is ``]``): the link's destination replaced by ``#`` when it is unsafe."""
    if not text.startswith("](", i):
        return None
    j = i + 2
    while j < len(text) and text[j] in " \t\n":
        j += 1
    if j < len(text) and text[j] == "<":
        end = text.find(">", j)
        if end < 0:
            return None
        dest, stop = text[j + 1:end], end + 1
    else:
        depth, stop = 0, j
        while stop < len(text) and not text[stop].isspace():
            if text[stop] == "(":
                depth += 1
            elif text[stop] == ")":
                if depth == 0:
                    break
                depth -= 1
            stop += 1
        dest = text[j:stop]
    if safe_url(dest) or safe_url(dest, image=True):
        return None
    return text[i:j] + "#", stop


def _clean_inline(text: str) -> str:
    """Markdown outside fenced code blocks: code spans, math, links and raw HTML (see
    :func:`clean_markdown`)."""
    text = _REFERENCE.sub(
        lambda m: m.group(0) if safe_url(m.group(2).strip("<>")) or safe_url(m.group(2).strip("<>"), image=True)
        else m.group(1) + "#", text)
    out, i, n = [], 0, len(text)
    while i < n:
        ch = text[i]
        if ch == "\\" and i + 1 < n and text[i + 1] in "`$<]":
            if text[i + 1] == "<" and _TAG_START.match(text, i + 1):
                out.append("&lt;")  # "\<" shows "<" too; as "&lt;" it starts no markup anywhere
            else:
                out.append(text[i:i + 2])
            i += 2
            continue
        if ch == "`":
            span = _code_span_at(text, i)
            if span is None:
                run = len(text[i:]) - len(text[i:].lstrip("`"))
                out.append(text[i:i + run])
                i += run
            else:
                out.append(span[0])
                i = span[1]
            continue
        if ch in "$\\":
            math = _math_at(text, i)
            if math is not None:
                out.append(math[0])
                i = math[1]
                continue
        if ch == "]":
            link = _link_destination_at(text, i)
            if link is not None:
                out.append(link[0])
                i = link[1]
                continue
        if ch == "<":
            piece, i = _clean_tag_at(text, i)
            out.append(piece)
            continue
        out.append(ch)
        i += 1
    return "".join(out)


def _fenced_blocks(text: str) -> list[tuple[bool, str]]:
    """``text`` split into ``(is_fenced_code, chunk)`` pieces, in order."""
    pieces, buf, fence = [], [], None
    for line in text.splitlines(keepends=True):
        if fence is None:
            match = _FENCE.match(line.rstrip("\n"))
            if match and not (match.group(2)[0] == "`" and "`" in match.group(3)):
                if buf:
                    pieces.append((False, "".join(buf)))
                buf, fence = [line], match.group(2)
                continue
            buf.append(line)
        else:
            buf.append(line)
            stripped = line.strip()
            if stripped and set(stripped) == {fence[0]} and len(stripped) >= len(fence) \
                    and len(line) - len(line.lstrip(" ")) <= 3:
                pieces.append((True, "".join(buf)))
                buf, fence = [], None
    if buf:
        pieces.append((fence is not None, "".join(buf)))
    return pieces


def _clean_fenced(block: str) -> str:
    """A fenced code block; one whose code looks like markup becomes ``<pre><code>`` with the code
    escaped (it shows the same text)."""
    lines = block.splitlines(keepends=True)
    closed = len(lines) > 1 and lines[-1].strip() and set(lines[-1].strip()) <= set("`~")
    body = "".join(lines[1:-1] if closed else lines[1:])
    if not _TAG_START.search(body):
        return block
    ending = "\n" if block.endswith("\n") else ""
    return "<pre><code>" + html.escape(body.rstrip("\n"), quote=False) + "</code></pre>" + ending


def clean_markdown(text: str) -> str:
    """Markdown with its raw HTML reduced to the course policy; markdown, math and code unchanged.

    After this, every ``<`` that a browser could read as the start of markup is either a tag this
    function wrote itself from :data:`ALLOWED_TAGS` and :func:`clean_attribute` or escaped, whatever
    a markdown renderer makes of the rest: code spans and fenced blocks with markup in them become
    ``<code>``/``<pre>`` with their text escaped, math writes ``<`` as ``\\lt``, comments are
    dropped, and link destinations outside :func:`safe_url` become ``#``.
    """
    if not text:
        return text
    return "".join(_clean_fenced(chunk) if fenced else _clean_inline(chunk)
                   for fenced, chunk in _fenced_blocks(text))


# ----------------------------------------------------------------------------------- SVG
SVG_NS = "http://www.w3.org/2000/svg"
XLINK_NS = "http://www.w3.org/1999/xlink"
ET.register_namespace("", SVG_NS)
ET.register_namespace("xlink", XLINK_NS)
SVG_TAGS = frozenset("""
svg g defs symbol use path rect circle ellipse line polyline polygon text tspan textPath title desc
clipPath mask pattern linearGradient radialGradient stop marker image style filter feBlend
feColorMatrix feComponentTransfer feComposite feFlood feGaussianBlur feMerge feMergeNode feOffset
feFuncA feFuncB feFuncG feFuncR
""".split())
_SVG_STYLE_BAD = re.compile(r"@import|expression|javascript|\\|behavior|binding|</", re.I)


def _svg_value_ok(value: str) -> bool:
    """A presentation value loads nothing: every ``url(...)`` points inside the image (``#id``)."""
    if _SVG_STYLE_BAD.search(value):
        return False
    return all(ref.strip().strip("'\"").startswith("#") for ref in re.findall(r"url\s*\(([^)]*)\)", value, re.I))


def _clean_svg_element(element) -> None:
    """Remove, in place, the children and attributes of ``element`` the SVG policy does not allow."""
    for child in list(element):
        local = child.tag.split("}", 1)[-1] if isinstance(child.tag, str) else ""
        if not isinstance(child.tag, str) or not child.tag.startswith("{" + SVG_NS + "}") or local not in SVG_TAGS:
            element.remove(child)
            continue
        if local == "style" and not _svg_value_ok(child.text or ""):
            element.remove(child)
            continue
        _clean_svg_element(child)
    local = element.tag.split("}", 1)[-1]
    for name in list(element.attrib):
        value = element.attrib[name]
        bare = name.split("}", 1)[-1].lower()
        if bare.startswith("on") or bare in ("attributename", "to", "values", "from", "by"):
            del element.attrib[name]
        elif bare == "href":
            ok = value.strip().startswith("#") or (local == "image" and safe_url(value, image=True)
                                                   and _normalised_url(value).startswith("data:"))
            if not ok:
                del element.attrib[name]
        elif not _svg_value_ok(value):
            del element.attrib[name]


def clean_svg(text: str) -> str | None:
    """An SVG document rebuilt from :data:`SVG_TAGS` (no script, ``foreignObject``, animation,
    event handler or outside reference), or ``None`` when it is not a plain SVG document."""
    if re.search(r"<!ENTITY|<!DOCTYPE[^>]*\[", text, re.I):
        return None
    body = re.sub(r"<!DOCTYPE[^>]*>", "", text, flags=re.I)
    body = re.sub(r"^\s*<\?xml[^>]*\?>", "", body)
    try:
        root = ET.fromstring(body)
    except ET.ParseError:
        return None
    if root.tag != "{" + SVG_NS + "}svg":
        return None
    wrapper = ET.Element("wrapper")
    wrapper.append(root)
    _clean_svg_element(wrapper)
    if not len(wrapper):
        return None
    return ET.tostring(root, encoding="unicode")


# ----------------------------------------------------------------------------------- notebook
def _text(value) -> str:
    return "".join(value) if isinstance(value, list) else str(value)


def _is_base64(text: str) -> bool:
    """Whether ``text`` is base64 and nothing else (it is written into an ``<img src>``)."""
    if not _BASE64.match(text):
        return False
    try:
        base64.b64decode(re.sub(r"\s+", "", text), validate=True)
    except (binascii.Error, ValueError):
        return False
    return True


def _is_script_mime(mime: str) -> bool:
    mime = mime.lower()
    return any(word in mime for word in ("javascript", "ecmascript", "widget", "jupyter.widget"))


def _clean_image_metadata(meta) -> dict:
    """The display metadata of one image: numeric ``width``/``height``, known background hints."""
    if not isinstance(meta, dict):
        return {}
    out = {}
    for key in ("width", "height"):
        value = meta.get(key)
        if isinstance(value, (int, float)) and not isinstance(value, bool) and 0 <= value < 100000:
            out[key] = value
        elif isinstance(value, str) and re.fullmatch(r"\d{1,5}", value.strip()):
            out[key] = int(value)
    if meta.get("needs_background") in ("light", "dark"):
        out["needs_background"] = meta["needs_background"]
    if meta.get("unconfined") is True:
        out["unconfined"] = True
    return out


def _clean_data(data: dict) -> tuple[dict, list]:
    """The kept mime bundle of one output and the mime types dropped from it."""
    kept, dropped = {}, []
    for mime, value in data.items():
        if mime not in KEPT_MIMES:
            dropped.append(mime)
            continue
        text = _text(value)
        if mime in ("image/png", "image/jpeg"):
            if not _is_base64(text):
                dropped.append(mime)
                continue
            kept[mime] = text
        elif mime == "text/html":
            kept[mime] = clean_html(text)
        elif mime == "text/markdown":
            kept[mime] = clean_markdown(text)
        elif mime == "image/svg+xml":
            svg = clean_svg(text)
            if svg is None:
                dropped.append(mime)
                kept.setdefault("text/plain", SVG_NOTE)
            else:
                kept[mime] = svg
        else:
            kept[mime] = value
    return kept, dropped


def clean_output(output) -> bool:
    """Sanitise one output in place (see the module docstring); whether anything changed.

    ``stream`` and ``error`` outputs are never touched (their text is escaped when rendered), so a
    failing test cell keeps its message. The output type never changes.
    """
    kind = output.get("output_type")
    if kind not in ("display_data", "execute_result", "update_display_data"):
        return False
    before = repr(output)
    data = output.get("data") or {}
    if any(_is_script_mime(m) for m in data):
        output["data"] = {"text/plain": SCRIPT_NOTE}
        output["metadata"] = {}
    else:
        kept, dropped = _clean_data(data)
        if not kept:
            kept = {"text/plain": UNSAFE_NOTE}
        output["data"] = kept
        meta = output.get("metadata") or {}
        output["metadata"] = {m: _clean_image_metadata(meta[m]) for m in ("image/png", "image/jpeg")
                              if m in kept and m in meta and _clean_image_metadata(meta[m])}
    if kind == "execute_result":
        count = output.get("execution_count")
        output["execution_count"] = count if isinstance(count, int) and not isinstance(count, bool) else None
    return repr(output) != before


def _clean_attachments(cell) -> None:
    """A markdown cell's attachments: only valid base64 PNG/JPEG (a name that loses everything keeps
    an empty bundle, so a reference to it still renders, as a missing image)."""
    attachments = cell.get("attachments")
    if not isinstance(attachments, dict):
        return
    for name, bundle in list(attachments.items()):
        bundle = bundle if isinstance(bundle, dict) else {}
        kept, _ = _clean_data({m: v for m, v in bundle.items() if m in ("image/png", "image/jpeg")})
        attachments[name] = kept or {"image/png": ""}


def _is_html_raw(cell) -> bool:
    fmt = str(cell.get("metadata", {}).get("raw_mimetype") or cell.get("metadata", {}).get("format") or "")
    return fmt == "" or "html" in fmt.lower()


def clean_cell(cell) -> bool:
    """Sanitise one cell in place: outputs of code cells, sources of markdown (and HTML raw) cells.

    Cell metadata (nbgrader's grade ids, points, checksums) is never touched.
    """
    changed = False
    if cell.get("cell_type") == "code":
        for output in cell.get("outputs", []):
            changed |= clean_output(output)
        count = cell.get("execution_count")
        if count is not None and (not isinstance(count, int) or isinstance(count, bool)):
            cell["execution_count"] = None
            changed = True
    elif cell.get("cell_type") == "markdown":
        source = _text(cell.get("source", ""))
        cleaned = clean_markdown(source)
        if cleaned != source:
            cell["source"] = cleaned
            changed = True
        before = repr(cell.get("attachments"))
        _clean_attachments(cell)
        changed |= repr(cell.get("attachments")) != before
    elif cell.get("cell_type") == "raw" and _is_html_raw(cell):
        source = _text(cell.get("source", ""))
        cleaned = clean_html(source)
        if cleaned != source:
            cell["source"] = cleaned
            changed = True
    return changed


def clean_notebook(nb) -> list[int]:
    """Sanitise a whole notebook in place; the indices of the cells that changed.

    The notebook-level widget state is dropped too (nbconvert's templates would embed it for a
    widget manager script).
    """
    changed = [i for i, cell in enumerate(nb.get("cells", [])) if clean_cell(cell)]
    metadata = nb.get("metadata", {})
    if "widgets" in metadata:
        del metadata["widgets"]
    return changed


class SanitizeNotebook(Preprocessor):
    """nbconvert/nbgrader preprocessor: :func:`clean_notebook` on every notebook it sees.

    The indices of the changed cells are recorded in ``resources['html_sanitized_cells']``.
    """

    enabled = Bool(True, help="Sanitise notebooks (on by default, unlike nbconvert's own preprocessors)").tag(config=True)

    def preprocess(self, nb, resources):
        changed = clean_notebook(nb)
        if changed:
            resources["html_sanitized_cells"] = changed
            self.log.info("Sanitised the HTML of %d cell(s): %s", len(changed), changed)
        return nb, resources


# ----------------------------------------------------------------------------------- feedback pages
#: The MathJax configuration file of ``jupyter-server-mathjax`` (MathJax 2.7.9 with its STIX-Web
#: fonts, HTML-CSS output) and the ``Safe`` extension (no ``\href{javascript:...}``, ``\style``, ...).
MATHJAX_QUERY = "?config=TeX-AMS-MML_HTMLorMML-full,Safe"
#: Where a Jupyter server with ``jupyter-server-mathjax`` (the course's JupyterLab) serves MathJax,
#: relative to its base URL.
SERVER_MATHJAX_PATH = "static/jupyter_server_mathjax/MathJax.js"
#: MathJax's configuration (given as ``window.MathJax`` before MathJax.js loads: a
#: ``text/x-mathjax-config`` block would need ``eval``, which the policy forbids). Delimiters as
#: nbconvert's and JupyterLab's; fonts as the classic notebook's, the only ones the package ships.
MATHJAX_CONFIG = {
    "tex2jax": {"inlineMath": [["$", "$"], ["\\(", "\\)"]], "displayMath": [["$$", "$$"], ["\\[", "\\]"]],
                "processEscapes": True, "processEnvironments": True},
    "TeX": {"equationNumbers": {"autoNumber": "AMS", "useLabelIds": True}},
    "displayAlign": "center",
    "messageStyle": "none",
    "HTML-CSS": {"availableFonts": [], "imageFont": None, "preferredFont": None, "webFont": "STIX-Web",
                 "linebreaks": {"automatic": True}},
}
#: Long lines wrap (outputs, tracebacks, code): a failing cell's diagnosis is never cut off at the
#: right edge or hidden behind a scroll bar (nbconvert's classic CSS keeps ``white-space: pre``);
#: a wide plot shrinks to the page instead of widening it.
WRAP_CSS = ("pre, div.output_area pre, div.output_subarea pre, div.input_area pre, .highlight pre "
            "{ white-space: pre-wrap; overflow-wrap: anywhere; word-break: normal; }\n"
            "div.output_area img { max-width: 100%; height: auto; }")
#: Replaces nbconvert's ``mathjax.html.j2`` in feedback pages: its macro would load MathJax from a
#: CDN and configure it with a script block only ``eval`` can run.
_NO_CDN_MATHJAX = ("{%- macro mathjax(url=None) -%}<!-- MathJax: the course's own copy, "
                   "added by rlhf_lab's FeedbackExporter -->{%- endmacro %}")


def local_mathjax_url() -> str:
    """``file://`` URL of MathJax.js in the installed ``jupyter-server-mathjax`` (with
    :data:`MATHJAX_QUERY`), found without importing it; ``""`` when the package is not installed."""
    spec = importlib.util.find_spec("jupyter_server_mathjax")
    if spec is None or not spec.submodule_search_locations:
        return ""
    path = Path(list(spec.submodule_search_locations)[0]) / "static" / "MathJax.js"
    return path.resolve().as_uri() + MATHJAX_QUERY if path.is_file() else ""


def _js(value) -> str:
    """``value`` as a JavaScript literal that is safe inside an HTML ``<script>`` element."""
    text = json.dumps(value, sort_keys=True, ensure_ascii=True)
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


def mathjax_loader(url: str) -> str:
    """The inline script that configures and loads MathJax: from the Jupyter server the page is
    served by when it is one (JupyterLab's ``/files/...``: the server's ``jupyter-server-mathjax``),
    else, or when that fails, from ``url`` (the course environment's copy on this machine)."""
    return (
        "(function () {\n"
        "  var urls = [], base = String(document.baseURI), at = base.indexOf(\"/files/\");\n"
        "  if (/^https?:/.test(base) && at > 0) {\n"
        f"    urls.push(base.slice(0, at + 1) + {_js(SERVER_MATHJAX_PATH + MATHJAX_QUERY)});\n"
        "  }\n"
        f"  urls.push({_js(url)});\n"
        f"  window.MathJax = {_js(MATHJAX_CONFIG)};\n"
        "  function load(i) {\n"
        "    if (i >= urls.length) { return; }\n"
        "    var script = document.createElement(\"script\");\n"
        "    script.src = urls[i];\n"
        "    script.onerror = function () { script.parentNode.removeChild(script); load(i + 1); };\n"
        "    document.head.appendChild(script);\n"
        "  }\n"
        "  load(0);\n"
        "})();"
    )


def script_hash(script: str) -> str:
    """The CSP source (``'sha256-...'``) that lets exactly the inline script ``script`` run."""
    return "'sha256-" + base64.b64encode(hashlib.sha256(script.encode("utf-8")).digest()).decode("ascii") + "'"


def allow_script(policy: str, source: str) -> str:
    """``policy`` letting the inline script of CSP source ``source`` run, and the scripts it adds
    (``'strict-dynamic'``: no parser-inserted script, no URL allow-list, no inline handler), and
    fonts from ``'self'`` (MathJax's web fonts lie next to MathJax.js)."""
    directives = [d.strip() for d in policy.split(";") if d.strip()]
    out, seen = [], set()
    for directive in directives:
        name, _, value = directive.partition(" ")
        sources = [v for v in value.split() if v != "'none'"]
        if name == "script-src":
            sources = [source, "'strict-dynamic'"] + [v for v in sources
                                                      if v not in (source, "'strict-dynamic'")]
        elif name == "font-src" and "'self'" not in sources:
            sources = ["'self'"] + sources
        seen.add(name)
        out.append(" ".join([name] + (sources or ["'none'"])))
    if "script-src" not in seen:
        out.append(f"script-src {source} 'strict-dynamic'")
    return "; ".join(out)


def add_csp_meta(page: str, policy: str) -> str:
    """``page`` with a Content-Security-Policy ``<meta>`` as the first element of its ``<head>``
    (before any script it could otherwise let through)."""
    content = html.escape(policy, quote=False).replace('"', "&quot;")
    meta = f'<meta http-equiv="Content-Security-Policy" content="{content}">'
    match = re.search(r"<head\b[^>]*>", page, re.I)
    if match is None:
        return meta + "\n" + page
    return page[:match.end()] + "\n" + meta + page[match.end():]


def add_to_head(page: str, markup: str) -> str:
    """``page`` with ``markup`` at the end of its ``<head>`` (after the template's own styles)."""
    match = re.search(r"</head\s*>", page, re.I)
    if match is None:
        return markup + "\n" + page
    return page[:match.start()] + markup + "\n" + page[match.start():]


class FeedbackExporter(HTMLExporter):
    """nbconvert's HTML exporter (every ``HTMLExporter`` setting applies) whose pages carry
    :data:`FEEDBACK_CSP`, typeset math with the course's MathJax and wrap long lines.

    ``mathjax_url`` (default :func:`local_mathjax_url`; ``""``: no MathJax and no script at all)
    is where the page loads MathJax from when no Jupyter server serves it; the loader
    (:func:`mathjax_loader`) is the one inline script the page's policy lets run, by its hash.
    """

    content_security_policy = Unicode(FEEDBACK_CSP, help="Content-Security-Policy of every page").tag(config=True)
    wrap_long_lines = Bool(True, help="Wrap long lines of outputs and code (WRAP_CSS)").tag(config=True)

    @default("mathjax_url")
    def _default_mathjax_url(self):
        return local_mathjax_url()

    @default("extra_loaders")
    def _default_extra_loaders(self):
        return [DictLoader({"mathjax.html.j2": _NO_CDN_MATHJAX})]

    def from_notebook_node(self, nb, resources=None, **kw):
        output, resources = super().from_notebook_node(nb, resources, **kw)
        policy, head = self.content_security_policy, []
        if self.wrap_long_lines:
            head.append(f"<style>\n{WRAP_CSS}\n</style>")
        if self.mathjax_url:
            loader = mathjax_loader(self.mathjax_url)
            head.append(f"<script>{loader}</script>")
            policy = allow_script(policy, script_hash(loader))
        if head:
            output = add_to_head(output, "\n".join(head))
        return add_csp_meta(output, policy), resources
