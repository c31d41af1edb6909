"""The pre-flight's checks, one module per kind of finding (the entry point is :mod:`..integrity`).

:func:`rlhf_lab.instructor.grader.integrity.preflight` runs them on every submitted folder, in this
order; the findings, their codes and their messages are listed in :mod:`..integrity`'s docstring.

* :mod:`.findings`: :class:`~.findings.Finding`, :class:`~.findings.IntegrityReport`, the severities
  and the output paths (standard library only).
* :mod:`.release`: what the release says a notebook is (:class:`~.release.NotebookSpec`: cells, ids,
  kinds, kernel) (nbformat).
* :mod:`.names`: student folder names and file names nbgrader cannot address or that need a look
  (``student-id-*``, and the reasons behind ``file-name``).
* :mod:`.files`: what the folder holds besides the notebooks: links, special and oversized files,
  unusable file names, modules that would shadow real ones, extra files, the folder itself a link.
* :mod:`.notebooks`: which notebooks were handed in: not readable (``invalid-notebook``), missing,
  renamed, unknown.
* :mod:`.cells`: one notebook's cells against the release's ids: another assignment's notebook,
  kernel, duplicated, deleted and reordered cells, code above the locked first cell.
* :mod:`.locked`: one notebook's locked and graded cells changed: text, type, points, metadata.
* :mod:`.review`: answer code reported for review: copies of library functions (``library-copy``),
  statements that rebind or reach into the kernel (``rebinding``, ``introspection``).
* :mod:`.repair`: the repairs of what nbgrader would refuse (duplicates, cell types, metadata).
* :mod:`.quarantine`: moving files out of a submission and keeping repaired notebooks' originals.
* :mod:`.checker`: :class:`~.checker.Checker`, one student's folder through all of the above.
* :mod:`.overrides`: withholding points in the gradebook for the blocking findings (nbgrader).

May import: :mod:`..safe_files`, :mod:`..rebinding` and :mod:`..library_build` (the last two only
inside the review functions), :mod:`rlhf_lab.instructor.course`, nbformat and nbgrader; never
:mod:`..integrity` (which imports these) nor anything above the grader layer.
"""
