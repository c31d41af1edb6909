"""Grading one submission: the grader's side of the sandbox.

What runs inside nbgrader's own processes (``autograde`` and ``generate_feedback``, wired in
``nbgrader_config.py``) to turn one student's files into a grade and a feedback page, trusting
nothing the student left:

* pre-flight of the submitted files: :mod:`.integrity` (the entry point and its findings' policy),
  :mod:`.preflight` (its checks, one module per kind of finding), :mod:`.rebinding` (statements
  that rebind JAX, NumPy or the library), :mod:`.preflight_hook` (the same check inside every
  ``nbgrader autograde``), :mod:`.safe_files` (reading, copying and walking student paths without
  following links or special files);
* the kernel: :mod:`.sandbox` (bubblewrap), :mod:`.kernel_guard` (limits, dead or hung kernels),
  :mod:`.library_build` (the notebook's build of the course library), :mod:`.compile_cache`;
* the verdicts: :mod:`.judge` (hidden tests decided outside the kernel), :mod:`.judge_server` (one
  judge per class run), (gradients: the judge differentiates the program a function traces to, :mod:`rlhf_lab.judging.program`);
* the pages: :mod:`.preprocessors`, :mod:`.html_safety` (student HTML is data),
  :mod:`.feedback_filter` (feedback without hidden tests).

May import: :mod:`rlhf_lab.judging`, the core library and :mod:`rlhf_lab.instructor.course`; never
:mod:`..classrun`, :mod:`..operations` or :mod:`..authoring` (``tests/test_import_graph.py``). Several
of these modules are loaded by file path (nbgrader must not import JAX), so they import their
siblings by path too.
"""
