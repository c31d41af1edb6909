"""Where one autograde's time goes: the grader's phases, timed, when ``RLHF_TIMELINE`` names a file.

Off by default (one environment lookup per phase). With ``RLHF_TIMELINE=/path/file.jsonl`` every
:func:`phase` appends one JSON line ``{"phase": name, "start": unix time, "seconds": duration,
"pid": ..., **fields}`` when it ends (also when it raised), so a benchmark can say how an
``nbgrader autograde`` process spent its wall clock: the pre-flight, each notebook (the kernel's
start, each cell, the kernel's stop), the judge's cells, the rest being
nbgrader's own work. Only the grader's process writes it; a kernel never sees the variable (the
sandbox passes no such variable on).

This module imports nothing of the course: any layer may use it.
"""
from __future__ import annotations

import contextlib
import json
import os
import time

#: The environment variable naming the file the phases are appended to.
ENV = "RLHF_TIMELINE"


def enabled() -> bool:
    return bool(os.environ.get(ENV))


def record(name: str, start: float, seconds: float, **fields) -> None:
    """Append one phase (``start`` a ``time.time()`` instant) to the timeline file, if there is one."""
    path = os.environ.get(ENV)
    if not path:
        return
    line = json.dumps({"phase": name, "start": start, "seconds": seconds, "pid": os.getpid(), **fields},
                      default=str)
    with open(path, "a", encoding="utf-8") as handle:
        handle.write(line + "\n")


@contextlib.contextmanager
def phase(name: str, **fields):
    """Time the body as the phase ``name`` (see :func:`record`); a no-op without ``RLHF_TIMELINE``.

    Yields the phase's ``fields`` (a dict): what the body adds to it is recorded too."""
    if not enabled():
        yield fields
        return
    start, t0 = time.time(), time.perf_counter()
    try:
        yield fields
    finally:
        record(name, start, time.perf_counter() - t0, **fields)


def read(path) -> list[dict]:
    """The phases recorded in ``path`` (a missing file: none)."""
    try:
        with open(path, encoding="utf-8") as handle:
            return [json.loads(line) for line in handle if line.strip()]
    except FileNotFoundError:
        return []
