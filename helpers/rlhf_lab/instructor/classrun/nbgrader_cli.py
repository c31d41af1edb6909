"""``python .../rlhf_lab/instructor/classrun/nbgrader_cli.py ARGS``: nbgrader's own command line, started faster.

This runs exactly the app of ``python -m nbgrader`` (:func:`nbgrader.apps.nbgraderapp.main`), with
two start-up costs removed from every nbgrader process (one per autograded student):

* the optional ``rfc3987_syntax`` package is hidden: jsonschema imports it (when installed) only to
  offer an ``iri`` string-format check, and importing it builds a Lark grammar, 3-6 s of CPU on
  this 2-core machine. Neither nbformat's notebook schema nor nbgrader uses that format;
* the pipeline runs this file *as a script* (not ``-m rlhf_lab...``), so the helper library's
  package ``__init__`` (which imports JAX, about 1 s) is not loaded into the grader process. The
  kernels that run the notebooks import what they need as usual.

Set ``RLHF_PLAIN_NBGRADER=1`` to make the pipeline call ``python -m nbgrader`` instead.
"""
import os
import sys

# Run as a script, Python put this folder first on sys.path: drop it so sibling modules
# (pipeline.py, release.py, ...) can never shadow a top-level import of nbgrader's.
if sys.path and os.path.abspath(sys.path[0] or ".") == os.path.dirname(os.path.abspath(__file__)):
    sys.path.pop(0)

sys.modules.setdefault("rfc3987_syntax", None)  # `import rfc3987_syntax` now raises ImportError

from nbgrader.apps.nbgraderapp import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
