"""Instructor tools: the nbgrader pipeline of the course and its bundled example class.

Subpackages, lowest first (each may import only those before it; ``tests/test_import_graph.py``):

* :mod:`.course`: the course being graded, one object built from a root and passed to everything;
* :mod:`.grader`: grading one submission, the grader's side of the sandbox (pre-flight, sandbox and
  kernel limits, library builds, compile cache, the judge, safe files and pages);
* :mod:`.authoring`: the source notebooks instructors edit (lint rules, jupytext pairs);
* :mod:`.classrun`: running a class (the orchestrator and its executors, the pipeline, run records);
* :mod:`.operations`: the instructor's week (exchange, LMS downloads, roster, release, feedback,
  guides, export, backup).

Command-line entry points: ``python -m rlhf_lab.demo`` (``make demo``), ``tools/make_release.py``
and ``tools/make_examples.py`` (the example and hostile submissions are test fixtures:
``tests/fixtures/``).
"""
from .classrun.pipeline import (  # noqa: F401
    COURSE_ID, REPO_ROOT, CellGrade, ClassRun, CollectResult, CommandRun, Grades, PipelineError,
    StudentRun, ValidateResult, assignments, autograde, autograde_student, check_config,
    clean_outputs, collect, copy_course, course_root, export_csv, feedback, feedback_files, format_tables,
    generate, graded_assignments, nbgrader_env, notebooks, pending, read_grades, run_class,
    run_nbgrader, submitted_students, validate, venv_bin,
)
