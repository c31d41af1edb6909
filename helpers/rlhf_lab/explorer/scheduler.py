"""Coalescing of update requests ("latest wins") on the kernel's asyncio event loop.

A slider change does not compute anything itself: it records the new value and, if no update is
pending yet, schedules ONE update on the running event loop after ``delay`` seconds (30 ms by
default). When that update runs it reads the *current* values, so a fast drag that sends twenty
values while one update is pending costs one run, with the newest value; there is never a queue of
stale runs. With no running event loop (a plain script, the tests) each request runs the update
synchronously instead, and :meth:`LatestWins.hold` groups several requests into one.

Standard library only (asyncio); knows nothing about the explorer's model or widgets.
"""
from __future__ import annotations

import asyncio
import contextlib
from typing import Callable

__all__ = ["LatestWins"]


class LatestWins:
    """At most one pending update; requests made while one is pending are absorbed into it.

    ``request()`` schedules ``callback`` after ``delay`` seconds on the running asyncio loop (the
    kernel's loop inside Jupyter) unless an update is already pending. The callback reads the
    current state when it runs, so it always computes the latest values. Without a running loop
    ``request()`` runs the callback immediately (synchronous mode, used by scripts and tests).
    """

    def __init__(self, callback: Callable[[], None], delay: float = 0.03):
        self.callback = callback
        self.delay = float(delay)
        self._handle = None
        self._held = 0
        self.requests = 0
        self.runs = 0

    @property
    def pending(self) -> bool:
        return self._handle is not None

    @contextlib.contextmanager
    def hold(self):
        """Collect the requests made inside the block into one (made when the block ends)."""
        self._held += 1
        before = self.requests
        try:
            yield
        finally:
            self._held -= 1
        if self._held == 0 and self.requests != before:
            self.requests -= 1  # the request below stands for the whole block
            self.request()

    def request(self) -> None:
        self.requests += 1
        if self._held or self._handle is not None:
            return  # an update is already scheduled (or will be) and will see the newest values
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            loop = None
        if loop is None:
            self._run()
        else:
            self._handle = loop.call_later(self.delay, self._run)

    def _run(self) -> None:
        self._handle = None
        self.runs += 1
        self.callback()

    def cancel(self) -> None:
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None

