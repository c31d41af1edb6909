"""The grader's own compilation cache (judge.use_compile_cache): where it is, and when it is off."""
from __future__ import annotations

import os

import jax  # noqa: F401  (loaded, as in a process that imported JAX before asking for the cache)

from rlhf_lab.instructor.grader import judge


def _clean(monkeypatch, level="3"):
    for name in ("RLHF_NO_SANDBOX", "RLHF_COMPILE_CACHE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("TF_CPP_MIN_LOG_LEVEL", level)


def test_it_lives_under_the_course_root(tmp_path, monkeypatch):
    _clean(monkeypatch)
    try:
        assert judge.use_compile_cache(tmp_path) == os.path.join(str(tmp_path), ".cache", "jax-grader")
        assert os.environ["TF_CPP_MIN_LOG_LEVEL"] == "3"
    finally:
        judge._COMPILE_CACHE.clear()


def test_it_is_off_without_the_sandbox_or_with_the_compile_cache_off(tmp_path, monkeypatch):
    """Without the sandbox a kernel runs as the grader inside the course: it could plant entries."""
    for name, value in (("RLHF_NO_SANDBOX", "1"), ("RLHF_COMPILE_CACHE", "0")):
        _clean(monkeypatch)
        monkeypatch.setenv(name, value)
        assert judge.use_compile_cache(tmp_path) is None
        assert judge._COMPILE_CACHE == []


def test_it_is_off_where_jax_already_logs_cache_reads(tmp_path, monkeypatch):
    """JAX loaded with XLA's warnings on: every cache read would print lines on the instructor's terminal."""
    _clean(monkeypatch, level="2")
    assert judge.use_compile_cache(tmp_path) is None
    assert os.environ["TF_CPP_MIN_LOG_LEVEL"] == "2"
