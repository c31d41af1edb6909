"""``nbgrader collect``'s owner check on the course's exchange (rlhf_lab/instructor/grader/preflight_hook.py).

nbgrader warns "<folder> claims to be submitted by X but is owned by Y; cheating attempt?" for
every submission whose folder's Unix owner is not named like its student id. This course hands
submissions in with ``nbgrader submit --student ID`` from the instructor's own account (the demo,
the tests, a course on one machine), so nbgrader said it for every student of every collect. The
course's collect checks the owner itself: a folder owned by the collecting account (only that
account or root can make one) or by the student's own account is not reported; a folder owned by
any other account still is, with what it means.

The test makes the exchange's inbound folders as ``nbgrader submit`` leaves them and runs the real
``nbgrader collect`` on the course's configuration.
"""
from __future__ import annotations

import os
import pwd
from pathlib import Path

import pytest

from course_support import REPO
from rlhf_lab.instructor.classrun import pipeline
from rlhf_lab.instructor.operations import exchange

A = "a1_ppo_objective"
STAMP = "2026-12-01 08:00:00.000000 UTC"


def _other_account() -> pwd.struct_passwd | None:
    """An account that is neither this process's user nor named like a student of the test."""
    for name in ("nobody", "daemon", "bin"):
        try:
            entry = pwd.getpwnam(name)
        except KeyError:
            continue
        if entry.pw_uid != os.geteuid():
            return entry
    return None


def _submission(ex: Path, student: str, uid: int | None = None) -> Path:
    folder = ex / pipeline.COURSE_ID / "inbound" / f"{student}+{A}+{STAMP}+{student[:4]}0123456789"
    folder.mkdir(parents=True)
    nb = REPO / "release" / A / "01_clipped_objective.ipynb"
    (folder / nb.name).write_bytes(nb.read_bytes())
    (folder / "timestamp.txt").write_text(STAMP)
    if uid is not None:
        for path in (folder, *folder.iterdir()):
            os.chown(path, uid, -1)
    return folder


@pytest.mark.slow
@pytest.mark.skipif(os.geteuid() != 0 or _other_account() is None,
                    reason="making a folder owned by another account needs root")
def test_collect_reports_only_a_submission_another_account_handed_in(tmp_path):
    root = pipeline.copy_course(tmp_path / "course", REPO, include=("nbgrader_config.py", "release"))
    ex = exchange.ensure_exchange(path=root / "exchange")
    other = _other_account()
    _submission(ex, "ada_correct")  # handed in from this (the collecting) account: the course's case
    _submission(ex, other.pw_name, other.pw_uid)  # the student's own account: nbgrader's own case
    planted = _submission(ex, "ben_unchanged", other.pw_uid)  # someone else's account, in ben's name
    run = exchange.collect(A, root, f"sqlite:///{root}/gradebook.db", ex)  # the owner check is on
    out = run.output
    for student in ("ada_correct", other.pw_name, "ben_unchanged"):  # everyone is collected
        assert (root / "submitted" / student / A / "01_clipped_objective.ipynb").is_file(), out
        assert f"Collecting submission: {student} {A}" in out, out
    assert "cheating attempt" not in out, out  # nbgrader's own message, for everyone, is gone
    warnings = run.warnings()
    assert len(warnings) == 1, warnings
    assert warnings[0].startswith(f"collect: the submission {planted.name} of student 'ben_unchanged' was handed "
                                  f"in by the Unix account {other.pw_name!r}"), warnings[0]
    assert "another account submitted in this student's name" in warnings[0]
