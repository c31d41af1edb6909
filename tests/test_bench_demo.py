"""The pure parts of ``bench/bench_demo.py``: the kinds its CPU sampler sorts the demo's processes
into, checked against the command lines the course really starts (so a renamed launcher cannot
silently move a kernel's CPU into "everything else"), the CPU-floor table on numbers worked out by
hand, and a sample of a real child process. Nothing here runs a demo."""
from __future__ import annotations

import subprocess
import sys

import pytest

from course_support import REPO, load_module


@pytest.fixture(scope="module")
def bench():
    return load_module(REPO / "bench" / "bench_demo.py", "bench_demo")


def test_each_kind_matches_the_command_line_the_course_starts(bench):
    from rlhf_lab.instructor import course

    nbgrader = " ".join(course.nbgrader_command())
    assert bench.kind_of(f"{sys.executable} -m ipykernel_launcher -f /tmp/k.json").startswith("grading kernels")
    assert bench.kind_of(f"{nbgrader} autograde a1_ppo_objective --student ada --force").startswith(
        "nbgrader autograde")
    assert bench.kind_of(f"{nbgrader} generate_feedback a1_ppo_objective --force").startswith(
        "nbgrader generate_feedback")
    assert bench.kind_of(f"{nbgrader} collect a1_ppo_objective --update").startswith("other nbgrader steps")
    assert bench.kind_of(f"{sys.executable} -B -c from multiprocessing.spawn import spawn_main; "
                         "spawn_main(tracker_fd=5, pipe_handle=7) --multiprocessing-fork").startswith("pool workers")
    assert bench.kind_of(f"{sys.executable} -m rlhf_lab.demo --workers 2").startswith("the demo's own")
    assert bench.kind_of("bwrap --unshare-pid /bin/true").startswith("everything else")
    # the sandbox's bubblewrap carries the kernel's command line: it is not a second kernel
    assert bench.kind_of(f"/usr/bin/bwrap --unshare-pid --die-with-parent {sys.executable} -m ipykernel_launcher "
                         "-f /tmp/k.json").startswith("everything else")


def test_the_cpu_table_gives_each_kinds_share_and_the_floor(bench):
    run = {"label": "run2-w2", "workers": 2, "wall": 400.0, "machine_busy": 700.0,
           "cpu_by_kind": {"grading kernels": (300.0, 70), "nbgrader autograde": (100.0, 23),
                           "everything else": (200.0, 300)}}
    text = "\n".join(bench.cpu_table(run, 2))
    assert "| grading kernels | 70 | 300.0 | 50% |" in text
    assert "| everything else | 300 | 200.0 | 33% |" in text
    assert text.index("grading kernels") < text.index("everything else") < text.index("nbgrader autograde")
    assert "Sampled: 600 core-seconds (the machine was busy 700" in text
    assert "CPU floor on 2 cores: 300 s" in text and "under 480 core-seconds" in text


def test_the_sampler_counts_a_child_started_after_it_and_not_what_ran_before(bench):
    marker = "# bench-demo-sampler-test"  # other tests may start processes meanwhile: find ours by it
    before = subprocess.Popen([sys.executable, "-c", f"import time\ntime.sleep(3)  {marker}-before"])
    try:
        sampler = bench.CpuSampler(period=0.1).start()
        subprocess.run([sys.executable, "-c", "import time\nt = time.process_time()\n"
                        f"while time.process_time() - t < 0.6: pass\ntime.sleep(0.3)  {marker}"], check=True)
        by_kind = sampler.stop()
    finally:
        before.kill()
        before.wait()
    ours = [cpu for cmd, cpu in sampler.seen.values() if marker in cmd]
    assert len(ours) == 1 and ours[0] == pytest.approx(0.6, abs=0.25)  # the one started before is not there
    assert sum(count for _, count in by_kind.values()) == len(sampler.seen)
