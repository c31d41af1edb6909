"""TLJH config snippet: each server runs as the course's own Linux account, with its role's environment.

Install as ``/opt/tljh/config/jupyterhub_config.d/30-rlhf-spawner.py`` (after ``10-rlhf-groups.py``)
and ``sudo tljh-config reload hub``. It reads ``/srv/rlhf-hub/tljh-course.json``
(``$RLHF_TLJH_COURSE_JSON``), written by ``deploy/tljh/prepare_course.py`` from the one-server
hub's functions, so both hubs hand their servers the same environment.

Why it replaces TLJH's spawner. TLJH's ``UserCreatingSpawner`` runs the hub user ``ada_correct`` as
a Unix account it creates, ``jupyter-ada_correct``. nbgrader names a submission after the Unix
account (``nbgrader.utils.get_username``), and the course's collect refuses a submission whose
folder is owned by an account that is not the student's (``SafeExchangeCollect.refuse_foreign_owner``),
so with the prefix every submission would carry a name that is not on the roster. Here the
servers are started by ``systemdspawner.SystemdSpawner`` (TLJH's spawner's own base class, installed
in TLJH's hub environment) as the accounts ``make hub-users`` made from the roster, named exactly
as the roster ids. Kept from TLJH: systemd units per user with ``limits.memory``/``limits.cpu``,
a private ``/tmp`` and ``/dev``, no sudo, the idle culler, Traefik and HTTPS.
"""
import json as _rlhf_json
import os as _rlhf_os

RLHF_TLJH_COURSE_JSON = _rlhf_os.environ.get("RLHF_TLJH_COURSE_JSON") or "/srv/rlhf-hub/tljh-course.json"


def rlhf_apply_spawner(c, path=RLHF_TLJH_COURSE_JSON):
    try:
        with open(path, encoding="utf-8") as fh:
            course = _rlhf_json.load(fh)
    except FileNotFoundError:
        raise RuntimeError(f"{path} is missing: run `sudo .venv/bin/python deploy/tljh/prepare_course.py` "
                           "in the course's checkout first") from None
    staff = set(course["staff"])
    env = course["environment"]

    c.JupyterHub.spawner_class = "systemdspawner.SystemdSpawner"
    c.SystemdSpawner.username_template = "{USERNAME}"  # the roster id is the Unix account
    c.SystemdSpawner.unit_name_template = "jupyter-{USERNAME}"
    c.SystemdSpawner.isolate_tmp = True
    c.SystemdSpawner.isolate_devices = True
    c.SystemdSpawner.disable_user_sudo = True
    c.SystemdSpawner.extra_paths = [course["server_bin"]]
    c.Spawner.cmd = [_rlhf_os.path.join(course["server_bin"], "jupyterhub-singleuser")]
    c.Spawner.default_url = "/lab"
    c.Spawner.start_timeout = 180
    c.Spawner.http_timeout = 180

    def rlhf_pre_spawn(spawner):
        name = spawner.user.name
        role = "instructor" if name in staff else "student"
        spawner.environment = dict(env[role])
        # the instructor's server opens in the course root (0700, theirs) with Formgrader; graders and
        # students in their own homes (SystemdSpawner's default working folder)
        spawner.user_workingdir = course["course_root"] if name == course["instructor"] else None
        spawner.notebook_dir = course["course_root"] if name == course["instructor"] else ""

    c.Spawner.pre_spawn_hook = rlhf_pre_spawn
    return course


rlhf_apply_spawner(c)  # noqa: F821 (``c`` is the config object JupyterHub loads this file with)
