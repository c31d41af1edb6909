"""JupyterHub config snippet: who may log in, and nbgrader's groups, from the course roster.

The same settings ``rlhf_lab.instructor.operations.hub.configure`` makes on the one-server hub
(``make hub``), for hubs that are not started by that command:

* The Littlest JupyterHub: copy to ``/opt/tljh/config/jupyterhub_config.d/10-rlhf-groups.py``
  (TLJH loads those files after ``config.yaml``, in alphabetical order);
* Zero to JupyterHub: ``hub.extraConfig["10-rlhf-groups"]`` of ``deploy/z2jh/values.yaml`` is this
  file's text (``tests/test_deploy_configs.py`` checks they are equal).

It reads only environment variables and the roster (no import of the course library, which the
hub's own environment does not have):

``RLHF_ROSTER``          the roster CSV (default ``/srv/rlhf-course/roster.csv``, the copy in the
                         course root); columns ``id,first_name,last_name,email,lms_user_id``
``RLHF_COURSE_ID``       nbgrader's course id (default ``rlhf-ppo``, the course's nbgrader_config.py)
``RLHF_HUB_INSTRUCTOR``  the instructor's account (default ``instructor``)
``RLHF_HUB_GRADERS``     further graders, comma or space separated (default none)

and sets ``c.Authenticator.allowed_users`` (the roster and the staff), ``c.JupyterHub.load_groups``
(``nbgrader-<course>``: students and instructor; ``formgrade-<course>``: the staff, the groups
nbgrader's ``JupyterHubAuthPlugin`` reads), ``c.JupyterHub.load_roles`` (the staff may add
students to the course group, ``nbgrader db student add``) and ``c.Spawner.server_token_scopes``
(hub.py's ``server_scopes``), adding to what the platform's config set before. A roster id that is not a valid Linux
user name stops the hub with the roster's line, as ``make hub-users`` does.
"""
import csv as _rlhf_csv
import os as _rlhf_os
import re as _rlhf_re

#: the course's student-id rule (rlhf_lab.instructor.operations.roster.ID_RULE; the test compares them)
RLHF_ID_RULE = _rlhf_re.compile(r"[a-z_][a-z0-9_-]{0,31}")
RLHF_DEFAULT_ROSTER = "/srv/rlhf-course/roster.csv"
RLHF_DEFAULT_COURSE_ID = "rlhf-ppo"
RLHF_DEFAULT_INSTRUCTOR = "instructor"


def rlhf_read_roster(path):
    """``[(id, lms_user_id), ...]`` of the roster at ``path``, in file order; ``ValueError`` naming
    every bad line (a hub that starts with half a class is worse than one that does not start)."""
    rows, problems, seen = [], [], {}
    with open(path, newline="", encoding="utf-8-sig") as fh:
        reader = _rlhf_csv.DictReader(fh)
        if "id" not in (reader.fieldnames or []):
            raise ValueError(f"roster {path}: no 'id' column (columns: id,first_name,last_name,email,lms_user_id)")
        for n, row in enumerate(reader, start=2):
            sid = (row.get("id") or "").strip()
            lms = (row.get("lms_user_id") or "").strip()
            if not RLHF_ID_RULE.fullmatch(sid):
                problems.append(f"line {n}: id {sid!r} is not a valid Linux user name")
            elif sid in seen:
                problems.append(f"line {n}: id {sid} already on line {seen[sid]}")
            elif lms and not lms.isdigit():
                problems.append(f"line {n}: lms_user_id {lms!r} is not a number")
            else:
                seen[sid] = n
                rows.append((sid, lms))
    if problems:
        raise ValueError(f"roster {path}:\n  " + "\n  ".join(problems))
    return rows


def rlhf_settings(env=None):
    """The roster path, course id, instructor and graders the snippet uses."""
    env = _rlhf_os.environ if env is None else env
    instructor = env.get("RLHF_HUB_INSTRUCTOR") or RLHF_DEFAULT_INSTRUCTOR
    graders = [g for g in (env.get("RLHF_HUB_GRADERS") or "").replace(",", " ").split() if g]
    return {
        "roster": env.get("RLHF_ROSTER") or RLHF_DEFAULT_ROSTER,
        "course_id": env.get("RLHF_COURSE_ID") or RLHF_DEFAULT_COURSE_ID,
        "instructor": instructor,
        "staff": [instructor, *[g for g in graders if g != instructor]],
    }


def rlhf_apply_groups(c, env=None):
    s = rlhf_settings(env)
    ids = [sid for sid, _ in rlhf_read_roster(s["roster"])]
    clash = sorted(set(ids) & set(s["staff"]))
    if clash:
        raise ValueError(f"roster {s['roster']}: {', '.join(clash)} is also the instructor/grader account")
    course = s["course_id"]
    group = f"nbgrader-{course}"
    # merged with what the platform's own config set before (TLJH's users.allowed, z2jh's roles for
    # its services): this snippet adds the course, it never drops anything else
    before = set(c.Authenticator.allowed_users) if "allowed_users" in c.Authenticator else set()
    c.Authenticator.allowed_users = before | set(ids) | set(s["staff"])
    groups = dict(c.JupyterHub.load_groups) if "load_groups" in c.JupyterHub else {}
    groups[group] = {"users": sorted(set(ids) | {s["instructor"]})}
    groups[f"formgrade-{course}"] = {"users": sorted(s["staff"])}
    c.JupyterHub.load_groups = groups
    role = {
        "name": f"grader-{course}",
        "description": "adds students to the course group (nbgrader db student add)",
        "scopes": ["list:groups", f"read:groups!group={group}", f"groups!group={group}"],
        "users": sorted(s["staff"]),
    }
    roles = list(c.JupyterHub.load_roles) if "load_roles" in c.JupyterHub else []
    c.JupyterHub.load_roles = [r for r in roles if r.get("name") != role["name"]] + [role]
    # what a server's $JUPYTERHUB_API_TOKEN may do: nbgrader's JupyterHubAuthPlugin reads the user's
    # own groups; the staff's servers also add students to the course group (hub.server_scopes)
    staff = set(s["staff"])
    base = ["users:activity!user", "access:servers!server", "read:users!user"]

    def rlhf_server_token_scopes(spawner):
        if spawner.user.name in staff:
            return base + ["list:groups", f"read:groups!group={group}", f"groups!group={group}"]
        return list(base)

    c.Spawner.server_token_scopes = rlhf_server_token_scopes
    return s


rlhf_apply_groups(c)  # noqa: F821 (``c`` is the config object JupyterHub loads this file with)
