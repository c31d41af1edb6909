"""nbgrader settings for STUDENTS of the course ``rlhf-ppo`` (read by their JupyterLab's Assignment List).

This folder is the students' Jupyter config dir (``JUPYTER_CONFIG_DIR``, set by ``make student-lab``):
it also disables nbgrader's instructor extensions (Formgrader and Create Assignment, in
``labconfig/page_config.json`` and ``jupyter_server_config.json``) so students see only the
Assignment List, the Course List and Validate. The instructor's own set-up is not touched.

* the exchange is the course's: ``$RLHF_EXCHANGE``, else the ``exchange`` folder of the course
  this file belongs to (the same rule as the instructor's ``nbgrader_config.py``);
* ``$RLHF_STUDENT_ID``, when set, is the id submissions are filed under (for machines where
  students share one login); otherwise nbgrader uses the login name.
"""
import os

_course = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))

c = get_config()  # noqa: F821 (provided by traitlets when it executes this file)
c.CourseDirectory.course_id = "rlhf-ppo"
c.Exchange.root = os.path.abspath(os.environ.get("RLHF_EXCHANGE") or os.path.join(_course, "exchange"))
c.Exchange.path_includes_course = False
if os.environ.get("RLHF_STUDENT_ID"):
    c.CourseDirectory.student_id = os.environ["RLHF_STUDENT_ID"]
