"""The judge server: one judge for a class run, reached by each student's grader process.

Fast tests with a fake kernel side (a :class:`~rlhf_lab.judging.core.LocalStudent` over plain
functions stands for :class:`~rlhf_lab.instructor.grader.judge.RemoteStudent`):

* every kind of request (call, grad, value, scenario) goes from the server's check back to the
  grader side and its plain answer returns to the check, which decides as it would in-process;
* a check that raises is the grader's failure (named), not the student's;
* a request that timed out on the kernel side costs that test only, and the same connection
  judges the next cell; a kernel that is gone stops the check and is raised on the grader side;
* a server killed in the middle of a check: the grader process judges the cell itself (same
  verdict) and logs one line; a server that is not there, the same;
* a client with the wrong key is refused; the socket lives in a private folder, removed at stop.

The same grades with and without the server on real submissions: ``tests/test_preflight_hook.py``
grades one small class with the course command (which judges in its run's server) and with bare
``nbgrader autograde`` (each process judging by itself) and compares the gradebooks row by row.
"""
from __future__ import annotations

import logging
import multiprocessing
import os
import shutil
import signal
import stat
import time

import numpy as np
import pytest

from rlhf_lab.instructor.grader import judge, judge_server
from rlhf_lab.judging import CHECKS, core
from rlhf_lab.judging.registry import Check


@pytest.fixture
def server():
    srv = judge_server.JudgeServer(warm=False)
    try:
        yield srv
    finally:
        srv.close()


def link_to(srv, key: bytes | None = None, wait: float = 60.0) -> judge.ServerLink:
    return judge.ServerLink(srv.address, srv.authkey if key is None else key, wait=wait)


def right_reward(reward, beta, kl):
    return reward - beta * kl


def wrong_reward(reward, beta, kl):
    return reward + beta * kl


class CountingStudent(core.LocalStudent):
    """The kernel side of the tests: answers from a namespace, and remembers what it was asked."""

    def __init__(self, namespace, on_call=None):
        super().__init__(namespace)
        self.asked, self._on_call = [], on_call

    def call(self, name, *args, **kwargs):
        self.asked.append(("call", name))
        if self._on_call is not None:
            self._on_call(name)
        return super().call(name, *args, **kwargs)

    def grad(self, name, argnums, *args, **kwargs):
        self.asked.append(("grad", name))
        return super().grad(name, argnums, *args, **kwargs)

    def value(self, name):
        self.asked.append(("value", name))
        return super().value(name)

    def scenario(self, source, needs, *args, **kwargs):
        self.asked.append(("scenario", source.name))
        return super().scenario(source, needs, *args, **kwargs)


def _all_four(student, rng, ref):
    """A check that uses every request kind; its expected values are written out by hand."""
    x = rng.normal(size=4)
    doubled = student.call("double", core.Jax(x.astype(np.float32)))
    core.close(doubled, 2 * x, "double", atol=1e-5)
    slope = student.grad("square_sum", 0, core.Jax(x.astype(np.float32)))
    core.close(slope, 2 * x, "grad of square_sum", atol=1e-4)
    core.equal(student.value("answer"), 42, "answer")
    twice = student.scenario(core.Source("def twice(v, double):\n    return double(double(v))\n", "twice"),
                             ("double",), core.Jax(x.astype(np.float32)))
    core.close(twice, 4 * x, "twice", atol=1e-5)


@pytest.fixture
def all_four(monkeypatch):
    monkeypatch.setitem(CHECKS, "test_all_four", Check(name="test_all_four", run=_all_four, task="double",
                                                        needs=("double",)))
    return "test_all_four"


def square_sum(x):
    return (x * x).sum()


def test_every_request_kind_goes_back_to_the_grader_side_and_its_answer_decides(server, all_four):
    link = link_to(server)
    good = CountingStudent({"double": lambda x: 2 * x, "square_sum": square_sum, "answer": 42})
    assert link.judge(all_four, good) == []
    assert [kind for kind, _ in good.asked] == ["call", "grad", "value", "scenario"]
    bad = CountingStudent({"double": lambda x: 3 * x, "square_sum": square_sum, "answer": 42})
    out = link.judge(all_four, bad)  # the same connection judges the next cell
    assert len(out) == 1 and out[0]["ename"] == judge.FAILED and "double" in out[0]["evalue"]
    assert server.stats()["served"] == 2


def test_a_registered_check_gives_the_in_process_verdict(server):
    link = link_to(server)
    assert link.judge("test_penalized_reward", CountingStudent({"penalized_reward": right_reward})) == []
    remote = link.judge("test_penalized_reward", CountingStudent({"penalized_reward": wrong_reward}))
    local = judge.run_check("test_penalized_reward", CountingStudent({"penalized_reward": wrong_reward}))
    assert remote and local
    # the same diagnosis (the inputs, hence beta in the message, are fresh on each side)
    assert "SUBTRACTED" in remote[0]["evalue"] and "SUBTRACTED" in local[0]["evalue"]
    unknown = link.judge("test_no_such_cell", CountingStudent({}))
    assert unknown == judge.run_check("test_no_such_cell", CountingStudent({}))


def test_a_check_that_raises_is_the_graders_failure_and_named(server, monkeypatch):
    def broken(student, rng, ref):
        student.value("answer")
        raise ZeroDivisionError("reference blew up")

    monkeypatch.setitem(CHECKS, "test_broken", Check(name="test_broken", run=broken, task="t", needs=()))
    link = link_to(server)
    with pytest.raises(judge.CheckCrashed) as info:
        link.judge("test_broken", CountingStudent({"answer": 1}))
    assert info.value.kind == "ZeroDivisionError" and "reference blew up" in info.value.text
    assert link.judge("test_penalized_reward", CountingStudent({"penalized_reward": right_reward})) == []


def test_a_request_that_timed_out_costs_only_that_test(server):
    said = "penalized_reward: your code did not answer within 3 s (an infinite loop, or far too much work?)"

    class Slow(CountingStudent):
        def call(self, name, *args, **kwargs):  # what RemoteStudent raises after interrupting the kernel
            raise core.GradingError(said)

    link = link_to(server)
    out = link.judge("test_penalized_reward", Slow({}))
    assert out == [judge.error_output(said)]
    assert link.judge("test_penalized_reward", CountingStudent({"penalized_reward": right_reward})) == []


def test_a_kernel_that_is_gone_stops_the_check_and_is_raised_on_the_grader_side(server):
    class Gone(CountingStudent):
        def call(self, name, *args, **kwargs):
            raise judge.KernelGone("the notebook's kernel died")

    link = link_to(server)
    with pytest.raises(judge.KernelGone, match="died"):
        link.judge("test_penalized_reward", Gone({}))
    assert link.judge("test_penalized_reward", CountingStudent({"penalized_reward": right_reward})) == []


def test_the_wrong_key_is_refused(server):
    with pytest.raises(judge.ServerUnavailable):
        link_to(server, key=b"x" * 32).judge("test_penalized_reward", CountingStudent({}))
    from multiprocessing import AuthenticationError
    from multiprocessing.connection import Client

    with pytest.raises((AuthenticationError, EOFError, OSError)):
        Client(server.address, family="AF_UNIX", authkey=b"guess")
    deadline = time.monotonic() + 5
    while server.stats()["failed_handshakes"] < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert server.stats() == {"served": 0, "failed_handshakes": 2, "pid": os.getpid()}


def test_the_socket_is_in_a_private_folder_removed_at_stop():
    srv = judge_server.shared()
    try:
        assert judge_server.shared() is srv
        folder = srv.directory
        assert stat.S_IMODE(os.stat(folder).st_mode) == 0o700
        assert stat.S_ISSOCK(os.stat(srv.address).st_mode) and os.path.dirname(srv.address) == folder
        env = judge_server.child_env()
        assert env == {judge.ADDRESS_ENV: srv.address, judge.AUTHKEY_ENV: srv.authkey.hex()}
        assert len(srv.authkey) == 32
    finally:
        stats = judge_server.stop_shared()
    assert stats["served"] == 0 and not os.path.exists(folder)
    assert judge_server.stop_shared() == {}


def test_the_grader_process_takes_the_address_out_of_its_environment():
    environ = {judge.ADDRESS_ENV: "/tmp/x/judge.sock", judge.AUTHKEY_ENV: "ab" * 32, "HOME": "/h"}
    assert judge.take_server_env(environ) == ("/tmp/x/judge.sock", bytes.fromhex("ab" * 32))
    assert environ == {"HOME": "/h"}
    assert judge.take_server_env({judge.ADDRESS_ENV: "/a", judge.AUTHKEY_ENV: "not hex"}) is None
    assert judge.take_server_env({}) is None


def test_the_switch():
    assert judge_server.enabled({})
    assert not judge_server.enabled({"RLHF_JUDGE_SERVER": "0"})
    assert judge_server.enabled({"RLHF_JUDGE": "0"})  # (no longer a switch: the judge always decides)


# ------------------------------------------------------------------------ fallback in the grader


class Cells(judge.JudgeCells):
    """The judge's decision step alone (no nbgrader, no kernel)."""

    log = logging.getLogger("test_judge_server.cells")


def _serve_in_child(conn) -> None:  # runs in a spawned process
    srv = judge_server.JudgeServer(warm=False)
    conn.send((srv.address, srv.authkey))
    while True:
        time.sleep(1)


@pytest.fixture
def child_server():
    ctx = multiprocessing.get_context("spawn")
    parent, child = ctx.Pipe()
    proc = ctx.Process(target=_serve_in_child, args=(child,), daemon=True)
    proc.start()
    address = None
    try:
        assert parent.poll(120), "the judge server process did not start"
        address = parent.recv()
        yield proc, address
    finally:
        if proc.is_alive():
            proc.kill()
        proc.join(10)
        if address is not None:  # a killed server cannot remove its own folder
            shutil.rmtree(os.path.dirname(address[0]), ignore_errors=True)


def test_a_server_killed_mid_check_makes_the_grader_judge_the_cell_itself(child_server, monkeypatch, caplog):
    proc, address = child_server
    monkeypatch.setattr(judge, "SERVER", address)

    def kill_server(name):
        if proc.is_alive():
            os.kill(proc.pid, signal.SIGKILL)
            proc.join(10)

    student = CountingStudent({"penalized_reward": wrong_reward}, on_call=kill_server)
    cells = Cells()
    with caplog.at_level(logging.WARNING, logger=Cells.log.name):
        out = cells._decide("test_penalized_reward", student)
    assert not proc.is_alive()
    # asked once by the dying server, then once by the check run in this process
    assert student.asked == [("call", "penalized_reward")] * 2
    assert len(out) == 1 and "SUBTRACTED" in out[0]["evalue"]
    warnings = [r for r in caplog.records if "judge server" in r.getMessage()]
    assert len(warnings) == 1 and "judging in this process" in warnings[0].getMessage()
    # later cells go straight to this process, without another line
    good = CountingStudent({"penalized_reward": right_reward})
    with caplog.at_level(logging.WARNING, logger=Cells.log.name):
        assert cells._decide("test_penalized_reward", good) == []
    assert len([r for r in caplog.records if "judge server" in r.getMessage()]) == 1


def test_no_server_or_an_unreachable_one_judges_in_process(tmp_path, monkeypatch, caplog):
    monkeypatch.setattr(judge, "SERVER", None)
    assert Cells()._decide("test_penalized_reward", CountingStudent({"penalized_reward": right_reward})) == []
    monkeypatch.setattr(judge, "SERVER", (str(tmp_path / "gone.sock"), b"k" * 32))
    with caplog.at_level(logging.WARNING, logger=Cells.log.name):
        out = Cells()._decide("test_penalized_reward", CountingStudent({"penalized_reward": wrong_reward}))
    assert len(out) == 1 and "SUBTRACTED" in out[0]["evalue"]
    assert any("cannot connect" in r.getMessage() for r in caplog.records)


def test_through_the_server_a_cell_gets_the_verdict(server, monkeypatch):
    monkeypatch.setattr(judge, "SERVER", (server.address, server.authkey))
    cells = Cells()
    try:
        assert cells._decide("test_penalized_reward", CountingStudent({"penalized_reward": right_reward})) == []
        out = cells._decide("test_penalized_reward", CountingStudent({"penalized_reward": wrong_reward}))
    finally:
        cells._close_judge_link()
    assert "SUBTRACTED" in out[0]["evalue"] and server.stats()["served"] == 2
