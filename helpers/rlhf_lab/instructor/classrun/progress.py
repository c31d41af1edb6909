"""What a long class run shows a person while it works: every phase announced, with a bar and an estimate.

A :class:`Reporter` hands out one :class:`Phase` at a time (``with reporter.phase(...) as ph``).
Each phase is announced on stdout with one line (what it does, how many items, how many at a
time, the estimate) and closed with one line (how long it took), so a log shows them too. While
it runs, a progress bar (`tqdm <https://tqdm.github.io/>`_) on **stderr** shows the items done and
the time left; bars appear only when stderr is a terminal, or when ``RLHF_PROGRESS=1`` forces
them (``RLHF_PROGRESS=0`` switches them off). A bar is removed when its phase ends, and lines
printed meanwhile (:meth:`Phase.write`) go above it, so stdout, where the grade table is printed,
never holds a bar.

The estimate: before any item of the phase has finished, the caller's prior (seconds on a quiet
2-core machine, see ``bench/results/demo.md``) minus the time spent; once items finish, the time
per unit of weight measured so far times the weight left (a phase's items may differ in cost: an
assignment of four notebooks weighs twice one of two). A ticker thread redraws the bar every
second, so the elapsed time and the estimate move while a long item runs; a phase whose items
are files appearing on disk (feedback pages) gives a ``poll`` function the ticker calls.
"""
from __future__ import annotations

import contextlib
import os
import sys
import threading
import time
from typing import Callable, Sequence, TextIO

FORCE_ENV = "RLHF_PROGRESS"


def bars_wanted(stream: TextIO, environ=None) -> bool:
    """Whether to draw bars on ``stream``: ``RLHF_PROGRESS=1`` yes, ``=0`` no, else when it is a terminal."""
    value = (os.environ if environ is None else environ).get(FORCE_ENV, "").strip()
    if value == "1":
        return True
    if value == "0":
        return False
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):
        return False


def fmt_seconds(seconds: float | None) -> str:
    """``"--"``, ``"8 s"``, ``"2 min 05 s"``, ``"1 h 02 min"``."""
    if seconds is None:
        return "--"
    s = max(0, int(round(seconds)))
    if s < 60:
        return f"{s} s"
    m, s = divmod(s, 60)
    if m < 60:
        return f"{m} min {s:02d} s"
    h, m = divmod(m, 60)
    return f"{h} h {m:02d} min"


class Phase:
    """One phase of a run: ``total`` items (weights optional), a prior estimate, a bar while it runs."""

    def __init__(self, reporter: "Reporter", name: str, total: int, unit: str = "item",
                 estimate: float | None = None, weights: Sequence[float] | None = None, workers: int = 1,
                 poll: Callable[[], int] | None = None, what: str = ""):
        self.reporter, self.name, self.total, self.unit = reporter, name, max(0, int(total)), unit
        self.workers = max(1, int(workers))
        self.estimate = estimate
        self.weights = list(weights) if weights is not None else [1.0] * self.total
        self.total_weight = float(sum(self.weights)) or float(self.total) or 1.0
        self.done = 0
        self.done_weight = 0.0
        self.poll = poll
        self.what = what
        self.start = time.monotonic()
        self.bar = None
        if reporter.bars:
            from tqdm import tqdm

            self.bar = tqdm(total=self.total, desc=name, unit=unit, file=reporter.err, leave=False,
                            dynamic_ncols=True, mininterval=0.2,
                            bar_format="{desc}: {percentage:3.0f}%|{bar}| {n_fmt}/{total_fmt} {unit} "
                                       "[{elapsed}{postfix}]")
            self._redraw()

    # -------------------------------------------------------------------------------- the estimate
    def elapsed(self) -> float:
        return time.monotonic() - self.start

    def eta(self) -> float | None:
        """Seconds left: measured rate once an item finished, else the prior minus the time spent."""
        left = max(0.0, self.total_weight - self.done_weight)
        if self.done >= self.total:
            return 0.0
        if self.done_weight > 0:
            return self.elapsed() / self.done_weight * left
        if self.estimate is not None and self.elapsed() < self.estimate:
            return self.estimate - self.elapsed()
        return None

    def postfix(self) -> str:
        """``about 1 min 05 s left``, or (nothing finished yet, past the prior) that the estimate is passed."""
        eta = self.eta()
        if eta is not None:
            return f"about {fmt_seconds(eta)} left"
        if self.estimate is not None:
            return f"slower than the estimate of {fmt_seconds(self.estimate)} (a busy machine?)"
        return ""

    def _redraw(self) -> None:
        if self.bar is None:
            return
        self.bar.set_postfix_str(self.postfix(), refresh=False)
        self.bar.refresh()

    # ------------------------------------------------------------------------------------ progress
    def advance(self, n: int = 1, weight: float | None = None) -> None:
        """``n`` more items done (their weight: ``weight``, else the next ``n`` weights in order)."""
        if weight is None:
            weight = sum(self.weights[self.done:self.done + n]) if self.done < len(self.weights) else float(n)
        with self.reporter.lock:
            self.done += n
            self.done_weight += weight
            if self.bar is not None:
                self.bar.update(n)
                self._redraw()

    def set_done(self, n: int) -> None:
        """The count done is ``n`` (a polled phase): items are taken as of equal weight."""
        n = min(max(0, int(n)), self.total)
        with self.reporter.lock:
            if n == self.done:
                return
            self.done = n
            self.done_weight = self.total_weight * n / self.total if self.total else 0.0
            if self.bar is not None:
                self.bar.n = n
                self._redraw()

    def write(self, text: str) -> None:
        """A line for the person (stdout), printed above the bar."""
        self.reporter.write(text)

    def tick(self) -> None:
        if self.poll is not None:
            try:
                self.set_done(self.poll())
            except Exception:  # noqa: BLE001 - a failed count only delays the bar
                pass
        with self.reporter.lock:
            self._redraw()

    def close(self) -> None:
        if self.poll is not None:
            self.tick()
        with self.reporter.lock:
            if self.bar is not None:
                self.bar.close()
                self.bar = None


class Reporter:
    """Phases of a run for a person: lines on ``out`` (stdout), bars on ``err`` (stderr) when wanted."""

    def __init__(self, out: TextIO | None = None, err: TextIO | None = None, bars: bool | None = None,
                 announce: bool = True, tick_seconds: float = 1.0):
        self.out = out if out is not None else sys.stdout
        self.err = err if err is not None else sys.stderr
        self.bars = bars_wanted(self.err) if bars is None else bool(bars)
        self.announce = announce
        self.tick_seconds = tick_seconds
        self.lock = threading.RLock()
        self.current: Phase | None = None
        self.timings: dict = {}  # phase name -> seconds

    def write(self, text: str) -> None:
        with self.lock:
            if self.current is not None and self.current.bar is not None:
                from tqdm import tqdm

                tqdm.write(text, file=self.out)
            else:
                self.out.write(text + "\n")
            self.out.flush()

    @contextlib.contextmanager
    def phase(self, name: str, total: int, unit: str = "item", estimate: float | None = None,
              weights: Sequence[float] | None = None, workers: int = 1,
              poll: Callable[[], int] | None = None, what: str = ""):
        """Announce a phase, yield its :class:`Phase`, close it with its time (also in ``timings``)."""
        if self.announce:
            at_a_time = f", {min(workers, max(total, 1))} at a time" if workers > 1 and total > 1 else ""
            est = f"; estimate {fmt_seconds(estimate)}" if estimate is not None else ""
            self.write(f"-> {name}: {total} {unit}{'s' if total != 1 else ''}{at_a_time}{est}"
                       + (f" ({what})" if what else ""))
        ph = Phase(self, name, total, unit, estimate, weights, workers, poll, what)
        self.current = ph
        stop = threading.Event()
        ticker = None
        if ph.bar is not None:
            def loop():
                while not stop.wait(self.tick_seconds):
                    ph.tick()
            ticker = threading.Thread(target=loop, name=f"progress-{name}", daemon=True)
            ticker.start()
        try:
            yield ph
        finally:
            stop.set()
            if ticker is not None:
                ticker.join(timeout=5)
            ph.close()
            self.current = None
            seconds = ph.elapsed()
            self.timings[name] = self.timings.get(name, 0.0) + seconds
            if self.announce:
                self.write(f"   {name}: done in {fmt_seconds(seconds)}")


class LineStream:
    """A file-like view of a :class:`Reporter` for code that writes to a stream: each line written
    goes out through :meth:`Reporter.write` (above the bar, when one is drawn)."""

    def __init__(self, reporter: Reporter):
        self.reporter = reporter

    def write(self, text: str) -> int:
        for line in text.splitlines():
            self.reporter.write(line)
        return len(text)

    def flush(self) -> None:
        pass


class NullReporter(Reporter):
    """Says nothing and draws nothing (the library's default)."""

    def __init__(self):
        super().__init__(bars=False, announce=False)

    def write(self, text: str) -> None:
        pass


def null_reporter() -> Reporter:
    return NullReporter()
