"""The grader's timeline (rlhf_lab/instructor/grader/timeline.py): phases recorded only when asked."""
from __future__ import annotations

import pytest

from rlhf_lab.instructor.grader import timeline


def test_nothing_is_written_without_the_variable(tmp_path, monkeypatch):
    monkeypatch.delenv(timeline.ENV, raising=False)
    with timeline.phase("cell", index=1) as fields:
        fields["x"] = 1
    assert list(tmp_path.iterdir()) == []


def test_a_phase_is_one_line_with_its_fields_also_when_the_body_raised(tmp_path, monkeypatch):
    path = tmp_path / "t.jsonl"
    monkeypatch.setenv(timeline.ENV, str(path))
    with timeline.phase("notebook", notebook="01") as fields:
        fields["extra"] = 2
    with pytest.raises(ValueError):
        with timeline.phase("cell", index=3):
            raise ValueError("student's problem")
    records = timeline.read(path)
    assert [r["phase"] for r in records] == ["notebook", "cell"]
    assert records[0]["notebook"] == "01" and records[0]["extra"] == 2 and records[0]["seconds"] >= 0
    assert records[1]["index"] == 3
    assert timeline.read(tmp_path / "missing.jsonl") == []
