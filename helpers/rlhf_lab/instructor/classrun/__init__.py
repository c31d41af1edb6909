"""Running a class: every (student, assignment) through the one grading path.

Modules, lowest first; each may import only those before it (``tests/test_import_graph.py``,
``CLASSRUN_ORDER``):

* :mod:`.nbgrader_cli`: nbgrader's own command line, started faster (the one command line every
  nbgrader process runs, :func:`rlhf_lab.instructor.course.nbgrader_command`, points at it);
* :mod:`.progress`: what a long run shows a person: phases announced, a bar and an estimate;
* :mod:`.records`: which runs finished, so a re-run grades only the rest;
* :mod:`.orchestrator`: :func:`~.orchestrator.grade_submission` per (student, assignment), the
  pre-flight around it (:func:`~.orchestrator.grade_assignment`), and the pool of one
  (:class:`~.orchestrator.SequentialExecutor`);
* :mod:`.executors`: the pools of N beside it: :class:`~.executors.DaskExecutor` (Dask, one task per
  student), :class:`~.executors.ClassExecutor` (a whole class run's pool of any size), the
  LocalCluster and the gradebook prepared once before a fan-out;
* :mod:`.pipeline`: the course command, generate -> collect -> autograde -> feedback -> export on
  real nbgrader, the gradebook read back, the one result type :class:`~.pipeline.ClassRun`, the one
  table formatter (:func:`~.pipeline.table`: the grade tables and a run's table) and the one course
  copy (:func:`~.pipeline.copy_course`);
* :mod:`.parallel`: the command line of one assignment fanned out
  (``python -m rlhf_lab.instructor.classrun.parallel``), a front end on the layers above: it returns
  the pipeline's :class:`~.pipeline.ClassRun` and prints its table.

May import: :mod:`..grader`, :mod:`rlhf_lab.instructor.course` and below; never :mod:`..operations`.
"""
