"""Running a class: every (student, assignment) through the one grading path.

* :mod:`.orchestrator`: :func:`~.orchestrator.grade_submission` per (student, assignment), run by
  an executor of any size (sequential here, Dask in :mod:`.parallel`);
* :mod:`.pipeline`: generate -> collect -> autograde -> feedback -> export on real nbgrader, and the
  gradebook read back as tables; :mod:`.parallel`: the same class run fanned out on Dask;
* :mod:`.records`: which runs finished, so a re-run grades only the rest;
  :mod:`.nbgrader_cli`: nbgrader's own command line, started faster.

May import: :mod:`..grader`, :mod:`rlhf_lab.instructor.course` and below; never :mod:`..operations`.
"""
