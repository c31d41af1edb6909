"""JupyterHub configuration of the course (``make hub`` runs ``jupyterhub -f hub/jupyterhub_config.py``).

Everything is read from environment variables, with these defaults (the ``make`` variables set them):

* ``HUB_PORT`` (8000): the hub on http://127.0.0.1:$HUB_PORT/, the proxy's API on the next port,
  the hub's own server on the one after;
* ``RLHF_ROSTER`` (``roster.csv`` of the course): who may log in (plus the staff), the members of
  the group ``nbgrader-<course>``;
* ``RLHF_HUB_INSTRUCTOR`` (``instructor``) and ``RLHF_HUB_GRADERS`` (none): the group
  ``formgrade-<course>``; the instructor's server runs Formgrader on the course root;
* ``RLHF_HUB_COURSE`` (``/srv/rlhf-course``): the course root, owned by the instructor, mode 0700;
* ``RLHF_EXCHANGE`` (``/srv/nbgrader/exchange``): nbgrader's exchange, outside homes and course root;
* ``RLHF_HUB_STATE`` (``/srv/rlhf-hub``): the hub's database, cookie secret, proxy token and the
  Jupyter configs handed to each server; nothing is written into the repository.
* ``RLHF_HUB_LOG_LEVEL`` (``WARN``): JupyterHub's log level.

The course id comes from the course's ``nbgrader_config.py``. What each setting does and why (PAM,
the groups, the token scopes, Formgrader on the instructor's server) is in
:mod:`rlhf_lab.instructor.operations.hub`, which also creates the accounts and the exchange
(``make hub-users``) and checks everything before the hub starts (``make hub``).
"""
from rlhf_lab.instructor.operations.hub import configure

c = get_config()  # noqa: F821 (provided by traitlets when JupyterHub loads this file)
configure(c)
