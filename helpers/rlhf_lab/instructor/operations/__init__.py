"""Class operations: what an instructor does around grading during the week.

* moving notebooks: :mod:`.exchange` (nbgrader's exchange), :mod:`.lms` (Canvas and Moodle
  downloads), :mod:`.release` (``release/`` from ``source/``), :mod:`.roster` (the class list);
* after grading: :mod:`.give_feedback` (feedback returned, held where a grade is pending),
  :mod:`.guide` (grader's guides), :mod:`.csv_export` (``nbgrader export`` with a safe CSV
  writer), :mod:`.lms_export` (the grades in Canvas's or Moodle's gradebook import CSV),
  :mod:`.backup` (the gradebook backed up and exported cell by cell).

May import: :mod:`..classrun`, :mod:`..grader`, :mod:`..authoring`, :mod:`rlhf_lab.instructor.course`.
"""
