"""The wire between the judge and a student's kernel: requests out, plain data back, as JSON text.

This module is self-contained on purpose (the standard library and NumPy only): the judge imports
it, and sends its *source text* to the student's kernel, where it is executed once to define
``bridge(request_text) -> response_text``. Nothing the kernel sends back is trusted: the judge
decodes it with :func:`decode` (which accepts only the node types below) and converts it again to
plain data before a check sees it.

Nodes (JSON):

* ``null``, booleans, integers, floats (``NaN``/``inf`` allowed), short strings: themselves;
* ``{"t": "nd", "dtype": "float32", "shape": [2, 3], "data": "<base64>"}``: a numeric array;
* ``{"t": "tuple", "v": [...]}``, ``{"t": "list", "v": [...]}``, ``{"t": "dict", "v": {...}}``;
* arguments only: ``{"t": "jax", "v": <nd>}`` (pass as a JAX array), ``{"t": "key", "seed": n}``
  (``jax.random.key(seed)``), ``{"t": "src", "source": "...", "name": "f"}`` (a function the
  check wrote, built where the call runs).

A request is ``{"op": "call" | "trace" | "value" | "scenario", "name": ..., "argnums": ...,
"needs": [...], "source": {...}, "args": [...], "kwargs": {...}}``; a response is
``{"ok": true, "value": <node>}`` or ``{"ok": false, "kind": "missing" | "raised" | "refused" |
"untraceable", "error": "..."}``. A ``trace`` (a gradient check) answers the value of the call and,
beside it, ``"program"``: the function's traced program as plain data (:func:`describe`), which the
judge rebuilds and differentiates with its own JAX (:mod:`rlhf_lab.judging.program`); the kernel never
computes a gradient the judge uses.

The kernel hands a response back as the ``text/plain`` repr of that JSON text (the value of a
``user_expression``). On the judge side nothing of it is parsed before it is known to be small:
:func:`read_text` checks the repr's length, then decodes it with a strict reader of one Python
``str`` literal (it can build nothing but one string); :func:`response` checks the JSON text's length,
counts its nodes and nesting (:func:`scan`, without building anything), and only then parses and
decodes it. Anything over a bound is :class:`TooLarge`.
"""
import base64
import json
import math
import re

import numpy as np

NUMERIC_KINDS = "biuf"
MAX_TEXT = 10_000
MAX_DEPTH = 8
MAX_BYTES = 64 * 1024 * 1024
#: Bounds of one response on the judge side, checked before it is parsed. Measured on the judged checks
#: of the correct example submissions of the three graded assignments (48 checks, 128 responses, real
#: kernel): the largest response was 2,669 characters of JSON with 183 nodes, 9 levels deep (test_loop's
#: scenario); the largest request 3,679 characters with 92 nodes (test_seq_batch_rewards). The bounds
#: are about 12x those figures (a student's float64 arrays take twice the base64 of float32 ones,
#: extra dict keys more), and still keep the parsed objects of a response under a few megabytes.
MAX_RESPONSE_CHARS = 32 * 1024
MAX_RESPONSE_NODES = 2_048
#: The deepest JSON a response can be whose nodes :func:`decode` accepts (a container node is two
#: levels, an array's shape one more, the envelope one): anything deeper is refused before parsing.
MAX_RESPONSE_DEPTH = 2 * MAX_DEPTH + 3
#: The ``text/plain`` repr of a response's JSON text: the bridge's JSON is ASCII, whose repr doubles at
#: most its backslashes (plus the two quotes).
MAX_LITERAL_CHARS = 2 * MAX_RESPONSE_CHARS + 2
#: The bounds of a ``trace`` response (a value and a program). The programs of the course's gradient
#: checks, answered by the model answers, take 4-40 KiB of JSON; a program closing over large arrays
#: or made of thousands of equations is refused before it is parsed.
MAX_PROGRAM_CHARS = 384 * 1024
MAX_PROGRAM_NODES = 200_000
MAX_PROGRAM_DEPTH = 24
MAX_PROGRAM_LITERAL_CHARS = 2 * MAX_PROGRAM_CHARS + 2


class Refused(Exception):
    """A value that is not plain data (raised while encoding or decoding)."""


class TooLarge(Refused):
    """A response over the judge side's bounds, refused before it is parsed; the message ends a sentence
    that starts "the answer ..." (for example "is 50,000,002 characters long; the grader reads at most
    32,768")."""


def _array_node(arr):
    arr = np.array(arr, order="C", copy=True)  # (ascontiguousarray would turn a 0-d array into 1-d)
    if arr.dtype.kind not in NUMERIC_KINDS:
        raise Refused(f"an array of dtype {arr.dtype} is not numeric")
    if arr.nbytes > MAX_BYTES:
        raise Refused(f"an array of {arr.nbytes} bytes is too large")
    return {"t": "nd", "dtype": arr.dtype.str, "shape": list(arr.shape),
            "data": base64.b64encode(arr.tobytes()).decode("ascii")}


def encode(value, depth=0):
    """``value`` as a node; :class:`Refused` for anything that is not plain data."""
    if depth > MAX_DEPTH:
        raise Refused("nested too deeply")
    kind = type(value)
    if value is None or kind in (bool, int, float):
        return value
    if kind is str:
        if len(value) > MAX_TEXT:
            raise Refused(f"a text of {len(value)} characters")
        return value
    if kind in (tuple, list):
        return {"t": kind.__name__, "v": [encode(v, depth + 1) for v in value]}
    if kind is dict:
        out = {}
        for k, v in value.items():
            if type(k) is not str:
                raise Refused(f"a dict key of type {type(k).__name__}")
            out[k] = encode(v, depth + 1)
        return {"t": "dict", "v": out}
    if kind is np.ndarray or (isinstance(value, np.generic) and kind.__module__ == "numpy"):
        return _array_node(np.asarray(value))
    module = getattr(kind, "__module__", "") or ""
    if module.startswith("jax") or module.startswith("jaxlib"):
        import jax

        if jax.dtypes.issubdtype(value.dtype, jax.dtypes.prng_key):
            value = jax.random.key_data(value)
        return _array_node(np.asarray(value))
    raise Refused(f"a {kind.__name__}")


def encode_argument(value, depth=0):
    """Like :func:`encode`, plus the argument markers of :mod:`rlhf_lab.judging.core`."""
    name = type(value).__name__
    if name == "Jax" and hasattr(value, "value"):
        return {"t": "jax", "v": _array_node(np.asarray(value.value))}
    if name == "Key" and hasattr(value, "seed"):
        return {"t": "key", "seed": int(value.seed)}
    if name == "Source" and hasattr(value, "source"):
        return {"t": "src", "source": value.source, "name": value.name}
    if type(value) in (tuple, list):
        return {"t": type(value).__name__, "v": [encode_argument(v, depth + 1) for v in value]}
    if type(value) is dict:
        return {"t": "dict", "v": {k: encode_argument(v, depth + 1) for k, v in value.items()}}
    return encode(value, depth)


def decode(node, live=False, depth=0):
    """A node back to Python; ``live=True`` (the kernel side) also builds the argument markers."""
    if depth > MAX_DEPTH:
        raise Refused("nested too deeply")
    if node is None or type(node) in (bool, int, float):
        return node
    if type(node) is str:
        if len(node) > MAX_TEXT:
            raise Refused(f"a text of {len(node)} characters")
        return node
    if type(node) is not dict or type(node.get("t")) is not str:
        raise Refused(f"an unknown node {type(node).__name__}")
    t = node["t"]
    if t == "nd":
        dtype = np.dtype(node["dtype"])
        if dtype.kind not in NUMERIC_KINDS:
            raise Refused(f"an array of dtype {dtype}")
        data = base64.b64decode(node["data"].encode("ascii"), validate=True)
        shape = tuple(int(s) for s in node["shape"])
        if (len(data) > MAX_BYTES or len(shape) > 32 or min(shape, default=0) < 0
                or math.prod(shape) * dtype.itemsize != len(data)):
            raise Refused("an array whose data does not match its shape")
        return np.frombuffer(data, dtype=dtype).reshape(shape).copy()
    if t in ("tuple", "list"):
        items = [decode(v, live, depth + 1) for v in node["v"]]
        return tuple(items) if t == "tuple" else items
    if t == "dict":
        return {str(k): decode(v, live, depth + 1) for k, v in node["v"].items()}
    if live and t == "jax":
        import jax.numpy as jnp

        return jnp.asarray(decode(node["v"], live, depth + 1))
    if live and t == "key":
        import jax

        return jax.random.key(int(node["seed"]))
    if live and t == "src":
        return build_source(node["source"], node["name"])
    raise Refused(f"an unexpected node {t!r}")


def build_source(source, name):
    """The function ``name`` defined by ``source`` (``jax``, ``jnp`` and ``np`` in scope)."""
    import jax
    import jax.numpy as jnp

    namespace = {"jax": jax, "jnp": jnp, "np": np, "__name__": "judge_source_" + name}
    exec(compile(source, "<check source " + name + ">", "exec"), namespace)
    return namespace[name]


def request(op, name=None, args=(), kwargs=None, argnums=None, source=None, needs=()):
    """The JSON text of one request (the judge side)."""
    body = {"op": op, "name": name, "args": [encode_argument(a) for a in args],
            "kwargs": {k: encode_argument(v) for k, v in (kwargs or {}).items()}, "needs": list(needs)}
    if argnums is not None:
        body["argnums"] = list(argnums) if isinstance(argnums, (tuple, list)) else int(argnums)
    if source is not None:
        body["source"] = {"source": source.source, "name": source.name}
    return json.dumps(body)


def describe(closed):
    """The kernel side: a ``ClosedJaxpr`` as plain JSON data (the judge side reads it with
    :func:`rlhf_lab.judging.program.parse`, which trusts none of it).

    ``{"jaxprs": [J, ...], "consts": [<nd>, ...]}``, the program being ``jaxprs[0]``. A jaxpr ``J`` is
    ``{"in": [var...], "const": [[var, const index]...], "eqns": [[primitive name, [atom...], [var...],
    {param: value}]...], "out": [atom...]}``; a var is ``[id, dtype, shape]``, an atom a var's id or
    ``{"lit": <nd>}``. Nested programs (``jit``, ``custom_jvp_call``, control flow) are parameters
    ``{"jaxpr": index}``, always to a later entry of ``jaxprs``; other parameter values are numbers,
    texts, lists, ``{"dtype": name}``, ``{"enum": type, "name": member}``, ``{"nt": type, "v": {...}}``
    or ``{"opaque": type}`` (a value the judge has no use for: shardings, layouts, custom rules)."""
    import enum

    import jax
    from jax.extend import core as jcore

    jaxprs, consts = [], []

    def param(value, depth=0):
        if depth > 8:
            raise Refused("a program parameter nested too deeply")
        if value is None or type(value) in (bool, int, float):
            return value
        if isinstance(value, (np.bool_, np.integer, np.floating)):
            return value.item()
        if type(value) is str:
            return value[:200]
        if isinstance(value, np.dtype):
            return {"dtype": value.name}
        if isinstance(value, jcore.ClosedJaxpr):
            return {"jaxpr": add(value.jaxpr, value.consts)}
        if isinstance(value, jcore.Jaxpr):
            return {"jaxpr": add(value, [])}
        if isinstance(value, enum.Enum):
            return {"enum": type(value).__name__, "name": value.name}
        if isinstance(value, tuple) and hasattr(value, "_fields"):
            return {"nt": type(value).__name__, "v": {f: param(getattr(value, f), depth + 1) for f in value._fields}}
        if isinstance(value, (tuple, list)):
            return [param(v, depth + 1) for v in value]
        if isinstance(value, type) and issubclass(value, np.generic):
            return {"dtype": np.dtype(value).name}
        return {"opaque": type(value).__name__}

    def add(jaxpr, values):
        index = len(jaxprs)
        jaxprs.append(None)
        ids = {}

        def var(v):
            ids[v] = len(ids)
            try:
                dtype = np.dtype(v.aval.dtype).name
            except TypeError:  # a PRNG key, a token: named, and refused by the judge
                dtype = str(getattr(v.aval, "dtype", type(v.aval).__name__))[:40]
            return [ids[v], dtype, [int(d) for d in getattr(v.aval, "shape", ())]]

        def atom(v):
            if isinstance(v, jcore.Literal):
                return {"lit": _array_node(np.asarray(v.val, dtype=v.aval.dtype))}
            return ids[v]

        const = []
        for v, c in zip(jaxpr.constvars, values):
            consts.append(encode(c if type(c).__module__.startswith(("jax", "jaxlib")) else np.asarray(c)))
            const.append([var(v), len(consts) - 1])
        invars = [var(v) for v in jaxpr.invars]
        eqns = []
        for e in jaxpr.eqns:
            ins = [atom(v) for v in e.invars]
            params = {k: param(v) for k, v in e.params.items()}
            eqns.append([e.primitive.name, ins, [var(v) for v in e.outvars], params])
        jaxprs[index] = {"in": invars, "const": const, "eqns": eqns, "out": [atom(v) for v in jaxpr.outvars]}
        return index

    add(closed.jaxpr, closed.consts)
    del jax
    return {"jaxprs": jaxprs, "consts": consts}


def trace(fn, argnums, args, kwargs):
    """The kernel side of a gradient check: ``(value, program)``, where ``value`` is ``fn(*args,
    **kwargs)`` and ``program`` :func:`describe` s ``jax.make_jaxpr`` of ``fn`` as a function of the
    arguments ``argnums`` (an int or a list), the other arguments held at their values (as constants,
    as ``jax.grad`` would). Raises whatever ``fn`` raises; :class:`Untraceable` when only tracing fails."""
    import jax

    nums = tuple(argnums) if isinstance(argnums, (list, tuple)) else (argnums,)
    value = fn(*args, **kwargs)

    def picked(*chosen):
        full = list(args)
        for i, v in zip(nums, chosen):
            full[i] = v
        return fn(*full, **kwargs)

    try:
        closed = jax.make_jaxpr(picked)(*[args[i] for i in nums])
    except Exception as exc:  # noqa: BLE001 - the judge says why the function cannot be differentiated
        first = (str(exc).strip().splitlines() or [""])[0]
        raise Untraceable(type(exc).__name__ + ": " + first[:300]) from None
    try:
        return value, describe(closed)
    except Refused:
        raise
    except Exception as exc:  # noqa: BLE001 - a value in the program that plain data cannot carry
        raise Refused("a program holding a value the grader cannot read (" + type(exc).__name__ + ")") from None


class Untraceable(Exception):
    """``jax.make_jaxpr`` could not trace the function (NumPy on a traced value, ``float()``, ...)."""


def bridge(request_text):
    """Answer one request in the student's kernel (the kernel side); returns the response's JSON text."""
    try:
        from IPython import get_ipython

        namespace = get_ipython().user_ns
        req = json.loads(request_text)
        args = [decode(a, live=True) for a in req.get("args", [])]
        kwargs = {k: decode(v, live=True) for k, v in req.get("kwargs", {}).items()}
        op, name = req["op"], req.get("name")
        wanted = list(req.get("needs", [])) + ([name] if name else [])
        missing = [n for n in wanted if n not in namespace]
        if missing:
            return json.dumps({"ok": False, "kind": "missing", "error": missing[0]})
        if op == "value":
            out = namespace[name]
        elif op == "call":
            out = namespace[name](*args, **kwargs)
        elif op == "trace":
            try:
                out, program = trace(namespace[name], req["argnums"], args, kwargs)
            except Untraceable as exc:
                return json.dumps({"ok": False, "kind": "untraceable", "error": str(exc)})
            except Refused as exc:
                return json.dumps({"ok": False, "kind": "refused", "error": str(exc)})
            try:
                return json.dumps({"ok": True, "value": encode(out), "program": program})
            except Refused as exc:
                return json.dumps({"ok": False, "kind": "refused", "error": str(exc)})
        elif op == "scenario":
            procedure = build_source(req["source"]["source"], req["source"]["name"])
            students = {n: namespace[n] for n in req.get("needs", [])}
            out = procedure(*args, **students, **kwargs)
        else:
            return json.dumps({"ok": False, "kind": "refused", "error": "unknown request " + repr(op)})
    except Exception as exc:  # noqa: BLE001 - whatever the student's code raised is reported, not obeyed
        return json.dumps({"ok": False, "kind": "raised", "error": type(exc).__name__ + ": " + str(exc)[:2000]})
    try:
        return json.dumps({"ok": True, "value": encode(out)})
    except Refused as exc:
        return json.dumps({"ok": False, "kind": "refused", "error": str(exc)})
    except Exception as exc:  # noqa: BLE001 - e.g. a tracer or an array that cannot be read
        return json.dumps({"ok": False, "kind": "refused",
                           "error": "a value that cannot be read (" + type(exc).__name__ + ": " + str(exc)[:500] + ")"})


#: One ``str`` literal's body as ``repr`` writes it, for each quote: plain characters (not the quote, a
#: backslash or a control character) and the escapes ``repr`` uses.
_QUOTED = {quote: re.compile(r"(?:[^\\%s\x00-\x1f\x7f]|\\[\\'\"nrt]|\\x[0-9a-fA-F]{2}|\\u[0-9a-fA-F]{4}"
                             r"|\\U[0-9a-fA-F]{8})*" % quote) for quote in "'\""}
_ESCAPE = re.compile(r"\\(x[0-9a-fA-F]{2}|u[0-9a-fA-F]{4}|U[0-9a-fA-F]{8}|.)")
_SIMPLE_ESCAPES = {"\\": "\\", "'": "'", '"': '"', "n": "\n", "r": "\r", "t": "\t"}
#: What :func:`scan` looks at: a whole JSON string (skipped), or one bracket or comma.
_TOKEN = re.compile(r'"(?:[^"\\]|\\.)*"|[][{},]', re.DOTALL)


def _unescape(match):
    code = match.group(1)
    return _SIMPLE_ESCAPES[code] if len(code) == 1 else chr(int(code[1:], 16))


def read_text(literal, max_chars=MAX_LITERAL_CHARS):
    """The judge side: the string whose ``repr`` is ``literal`` (the kernel's ``text/plain``).

    Strict: ``literal`` must be one quoted ``str`` literal as ``repr`` writes it (no prefix, no
    concatenation, only the escapes ``repr`` uses), at most :data:`MAX_LITERAL_CHARS` long, checked
    before anything is decoded; :class:`TooLarge` or :class:`Refused` otherwise."""
    if type(literal) is not str:
        raise Refused("an answer that is not text")
    if len(literal) > max_chars:
        raise TooLarge(f"is {len(literal):,} characters long; the grader reads at most {max_chars:,}")
    quote = literal[:1]
    if (len(literal) < 2 or quote not in _QUOTED or literal[-1] != quote
            or _QUOTED[quote].fullmatch(literal, 1, len(literal) - 1) is None):
        raise Refused("an answer that is not one quoted text")
    try:
        return _ESCAPE.sub(_unescape, literal[1:-1])
    except (ValueError, OverflowError):  # a \U escape beyond the last code point
        raise Refused("an answer with an invalid escape") from None


def scan(text, max_nodes=MAX_RESPONSE_NODES, max_depth=MAX_RESPONSE_DEPTH):
    """Check, without parsing, that the JSON ``text`` has at most ``max_nodes`` values and is nested at
    most ``max_depth`` levels; :class:`TooLarge` otherwise.

    Outside strings, every value but the first follows a comma or an opening bracket, so their count
    plus one bounds the number of values (and of dict keys); the brackets give the depth."""
    nodes, depth = 1, 0
    for token in _TOKEN.finditer(text):
        char = token.group()
        if char in "[{":
            depth += 1
            if depth > max_depth:
                raise TooLarge(f"is nested more than {max_depth} levels deep; the grader reads at most {max_depth}")
        elif char in "]}":
            depth -= 1
            continue
        elif char != ",":
            continue
        nodes += 1
        if nodes > max_nodes:
            raise TooLarge(f"has more than {max_nodes:,} values (numbers, texts, lists or dicts); the grader "
                           f"reads at most {max_nodes:,}")


def response(text, program=False):
    """The judge side: ``(ok, value or (kind, error))`` of a response's JSON text; :class:`Refused` if
    malformed, :class:`TooLarge` (before any parsing) if over :data:`MAX_RESPONSE_CHARS`,
    :data:`MAX_RESPONSE_NODES` or :data:`MAX_RESPONSE_DEPTH`. With ``program`` (a ``trace`` response)
    the bounds are :data:`MAX_PROGRAM_CHARS`, :data:`MAX_PROGRAM_NODES` and :data:`MAX_PROGRAM_DEPTH`,
    and a success is ``(True, (value, program))``, the program as parsed JSON, for
    :func:`rlhf_lab.judging.program.parse` to validate."""
    chars, nodes, depth = ((MAX_PROGRAM_CHARS, MAX_PROGRAM_NODES, MAX_PROGRAM_DEPTH) if program
                           else (MAX_RESPONSE_CHARS, MAX_RESPONSE_NODES, MAX_RESPONSE_DEPTH))
    if type(text) is not str:
        raise Refused("a response that is not text")
    if len(text) > chars:
        raise TooLarge(f"is {len(text):,} characters long; the grader reads at most {chars:,}")
    scan(text, nodes, depth)
    try:
        body = json.loads(text)
    except ValueError as exc:
        raise Refused("a response that is not JSON: " + str(exc)) from None
    if type(body) is not dict or type(body.get("ok")) is not bool:
        raise Refused("a response without a verdict")
    if body["ok"]:
        try:
            value = decode(body.get("value"))
        except Refused:
            raise
        except (KeyError, TypeError, ValueError, AttributeError, IndexError, OverflowError) as exc:
            raise Refused(f"a malformed node ({type(exc).__name__}: {str(exc)[:200]})") from None
        return True, ((value, body.get("program")) if program else value)
    return False, (str(body.get("kind", "raised"))[:40], str(body.get("error", ""))[:2000])
