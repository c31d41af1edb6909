"""Instructor tools: the nbgrader pipeline of the course and its bundled example class.

* :mod:`.pipeline`: generate -> collect -> autograde (one process per student) -> feedback ->
  export, plus the gradebook read back as tables (:func:`~.pipeline.run_class` does it all);
* :mod:`.authoring`: the source notebooks instructors edit: lint rules, jupytext pairs, the
  canonical form Jupyter's additions are normalised to;
* :mod:`.preprocessors`: the autograde step that keeps harmless stderr from costing points;
* :mod:`.judge`: hidden tests decided in the grader's process from the outputs of the student's
  functions; :mod:`.sandbox` and :mod:`.library_build`: every grading kernel in bubblewrap, with a
  course library that lacks the functions the notebook asks for; :mod:`.kernel_guard`: limits and
  dead or hung kernels; :mod:`.integrity`: the pre-flight of submitted files;
* :mod:`.exchange`, :mod:`.lms`, :mod:`.roster`, :mod:`.guide`, :mod:`.give_feedback`: running a
  class the nbgrader way (exchange, Canvas/Moodle downloads, roster, grader's guides, feedback hold).

Command-line entry points: ``python -m rlhf_lab.demo`` (``make demo``), ``tools/make_release.py``
and ``tools/make_examples.py`` (the example and hostile submissions are test fixtures:
``tests/fixtures/``).
"""
from .pipeline import (  # noqa: F401
    COURSE_ID, REPO_ROOT, CellGrade, ClassRun, CollectResult, CommandRun, Grades, PipelineError,
    StudentRun, ValidateResult, assignments, autograde, autograde_student, check_config,
    clean_outputs, collect, copy_course, course_root, export_csv, feedback, feedback_files, format_tables,
    generate, graded_assignments, nbgrader_env, notebooks, pending, read_grades, run_class,
    run_nbgrader, submitted_students, validate, venv_bin,
)
