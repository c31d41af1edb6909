"""The hidden tests of the course as ordinary, unit-tested library code.

Every graded test cell's hidden region is one line, ``grading.judge("<grade_id>")``. The check it
names (:data:`CHECKS`) generates fresh inputs, asks the student's code for outputs through a
:class:`~rlhf_lab.judging.core.Student`, computes the expected values with the reference
implementations, compares them, and names the classic mistake when they differ. A check sees the
student's code only through plain data, so it runs in a grader process outside the kernel (the
judge, :mod:`rlhf_lab.instructor.grader.judge`: every grade) or, for an instructor trying a source
notebook and for the compile-cache seed build, inside it (:func:`rlhf_lab.grading.judge`).

* :mod:`.core`: the :class:`~.core.Student` vocabulary, argument markers, plain-data conversion and
  the comparisons that decide;
* :mod:`.registry`: :data:`CHECKS`, by grade id;
* :mod:`.objective`, :mod:`.losses`, :mod:`.reward_reference`, :mod:`.rollouts`,
  :mod:`.make_it_yours`: the checks of each notebook; :mod:`.procedures`: the trusted procedures
  (with the classic mistakes) several checks share.
"""
from . import core, registry  # noqa: F401
from . import losses, make_it_yours, objective, reward_reference, rollouts  # noqa: F401  (register their checks)
from . import sequences_checks  # noqa: F401  (a3_ppo_sequences)
from .registry import CHECKS, Check  # noqa: F401
