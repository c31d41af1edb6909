"""Prepare the course's side of a TLJH hub (run as root, from the course venv, after `make hub-users`).

    sudo .venv/bin/python deploy/tljh/prepare_course.py [ROSTER.csv] [--server-bin DIR]

It does, with the one-server hub's own functions (:mod:`rlhf_lab.instructor.operations.hub`), what
``make hub`` does before it starts JupyterHub, minus starting it: checks the roster and that every
account exists, creates/repairs the exchange with the modes of hub.py's table, writes the per-role
Jupyter configs (nbgrader's ``JupyterHubAuthPlugin``, the exchange) under the hub's state folder,
builds the students' library (``/srv/rlhf-student-lib``) and the instructor's full library in the
0700 course root, and writes ``<state>/tljh-course.json`` (mode 0600, root), which the TLJH
snippet ``deploy/tljh/rlhf_spawner.py`` reads: the environment of a student's and of the staff's
servers, the course root, the instructor.

``--server-bin``: the ``bin`` folder the servers run ``jupyterhub-singleuser`` from. Default: the
hub's copy of the course venv without the full library (``<state>/venv/bin``, as ``make hub``).
``/opt/tljh/user/bin`` when the course's pins are installed in TLJH's user environment instead
(``sudo -E /opt/tljh/user/bin/pip install -r requirements.txt``; its Python must be the course's).
Run it again after every ``make release`` and roster change, then ``sudo tljh-config reload hub``.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from rlhf_lab.instructor.operations import hub


def prepare(settings: hub.Settings, server_bin: Path | None = None) -> Path:
    if os.geteuid() != 0:
        raise hub.HubError("prepare_course.py needs root (the exchange, the course root, the hub's state folder): "
                           "run it with sudo")
    ids = hub.roster_ids(settings.roster)
    missing = [n for n in settings.staff() + ids if not hub._user_exists(n)]
    if missing:
        raise hub.HubError(f"no Linux account for {', '.join(missing)}: run `sudo make hub-users` first")
    for line in hub.ensure_course_root(settings) + hub.ensure_exchange_tree(settings):
        print(line)
    settings.state.mkdir(parents=True, exist_ok=True)
    os.chmod(settings.state, 0o755)
    dirs = hub.write_server_configs(settings)
    runtime = Path(server_bin) if server_bin else hub.server_runtime(settings)
    libraries = {"student": hub.student_library(settings), "instructor": hub.instructor_library(settings)}
    env = {"student": hub.server_env(settings, ids[0], runtime, dirs, libraries) if ids else {},
           "instructor": hub.server_env(settings, settings.instructor, runtime, dirs, libraries)}
    data = {
        "course_id": settings.course_id,
        "course_root": str(settings.course_root),
        "exchange": str(settings.exchange),
        "instructor": settings.instructor,
        "staff": settings.staff(),
        "server_bin": str(runtime),
        "environment": {role: {k: str(v) for k, v in e.items()} for role, e in env.items()},
    }
    path = settings.state / "tljh-course.json"
    hub._write(path, json.dumps(data, indent=2, sort_keys=True) + "\n", 0o600)
    return path


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="deploy/tljh/prepare_course.py", description=__doc__.split("\n\n")[0])
    p.add_argument("roster", nargs="?", type=Path)
    p.add_argument("--server-bin", type=Path, help="bin folder of jupyterhub-singleuser (default: <state>/venv/bin)")
    args = p.parse_args(argv)
    try:
        settings = hub.Settings.from_env(roster=args.roster)
        path = prepare(settings, args.server_bin)
    except hub.HubError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"wrote {path}; now: sudo cp deploy/hub/rlhf_groups.py /opt/tljh/config/jupyterhub_config.d/10-rlhf-groups.py; "
          "sudo cp deploy/tljh/rlhf_spawner.py /opt/tljh/config/jupyterhub_config.d/30-rlhf-spawner.py; "
          "sudo tljh-config reload hub")
    return 0


if __name__ == "__main__":
    sys.exit(main())
