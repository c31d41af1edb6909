"""JupyterHub config snippet: students arrive from the LMS (Canvas) through LTI, as their roster id.

Load it after the hub's own config: on the one-server hub, after ``hub/jupyterhub_config.py``
(``jupyterhub -f hub/jupyterhub_config.py --JupyterHub.config_file=...`` loads one file, so append
``load_subconfig("deploy/lti/jupyterhub_config_lti.py")`` to a copy of it); on TLJH as
``/opt/tljh/config/jupyterhub_config.d/20-rlhf-lti.py``; on Zero to JupyterHub it is
``hub.extraConfig["20-rlhf-lti"]`` of ``deploy/z2jh/values.yaml`` (the test keeps them equal).
It needs ``jupyterhub-ltiauthenticator`` in the *hub's* environment (z2jh's hub image ships it;
the course venv does not pin it: see docs/deployment.md).

Which LTI (``RLHF_LTI_VERSION``):

``1.3`` (default) ``ltiauthenticator.lti13.auth.LTI13Authenticator``. The platform's settings come
    from ``RLHF_LTI13_ISSUER``, ``RLHF_LTI13_CLIENT_ID`` (comma separated), ``RLHF_LTI13_AUTHORIZE_URL``
    and ``RLHF_LTI13_JWKS_ENDPOINT`` (defaults: Canvas cloud, https://canvas.instructure.com).
``1.1``           ``ltiauthenticator.lti11.auth.LTI11Authenticator``: the consumer key and shared
    secret from ``RLHF_LTI11_CONSUMER_KEY`` and ``RLHF_LTI11_SHARED_SECRET`` (or ``..._FILE``, a
    file holding it). Canvas signs every launch with them (OAuth 1.0a, HMAC-SHA1, over the POST form).

Who the student is (``RLHF_LTI_MATCH``):

``lms_user_id`` (default) The LMS sends Canvas's numeric user id: LTI 1.1 as
    ``custom_canvas_user_id`` (Canvas adds it when the tool's privacy is "public"), LTI 1.3 as the
    custom claim ``canvas_user_id`` (add the custom field ``canvas_user_id=$Canvas.user.id`` to the
    Developer Key; the authenticator's ``username_key`` is then ``custom_canvas_user_id``). The
    roster's ``lms_user_id`` column maps it to the roster id (``Authenticator.username_map``):
    ``40101`` logs in as ``ada_correct``. A roster id always starts with a letter or ``_``, so an
    LMS id nobody mapped can never be mistaken for a student: it is simply not allowed.
``login_id``  The roster ids *are* the LMS's login ids: LTI 1.1 ``custom_canvas_user_login_id``,
    LTI 1.3 the custom field ``canvas_user_login_id=$Canvas.user.loginId``; no map.

The staff log in through the LMS too: ``RLHF_LTI_STAFF="<lms id>=<account>,..."`` (for example
``40001=instructor``) adds them to the map. Everybody else who launches the tool (a student not on
the roster, a TA nobody listed) is not in ``allowed_users`` and gets no server.
"""
import csv as _rlhf_lti_csv
import os as _rlhf_lti_os

RLHF_LTI_CLASSES = {
    "1.1": "ltiauthenticator.lti11.auth.LTI11Authenticator",
    "1.3": "ltiauthenticator.lti13.auth.LTI13Authenticator",
}
#: username_key of each authenticator for each way of matching the roster
RLHF_LTI_USERNAME_KEYS = {
    ("1.1", "lms_user_id"): "custom_canvas_user_id",
    ("1.1", "login_id"): "custom_canvas_user_login_id",
    ("1.3", "lms_user_id"): "custom_canvas_user_id",
    ("1.3", "login_id"): "custom_canvas_user_login_id",
}
RLHF_LTI_DEFAULT_ROSTER = "/srv/rlhf-course/roster.csv"


def _rlhf_lti_secret(env, name):
    if env.get(name + "_FILE"):
        with open(env[name + "_FILE"], encoding="utf-8") as fh:
            return fh.read().strip()
    return (env.get(name) or "").strip()


def rlhf_lti_roster_map(path):
    """``({lms_user_id: id}, [ids])`` of the roster at ``path`` (rows without lms_user_id map nothing)."""
    mapping, ids = {}, []
    with open(path, newline="", encoding="utf-8-sig") as fh:
        for n, row in enumerate(_rlhf_lti_csv.DictReader(fh), start=2):
            sid, lms = (row.get("id") or "").strip(), (row.get("lms_user_id") or "").strip()
            if not sid:
                raise ValueError(f"roster {path}: line {n} has no id")
            ids.append(sid)
            if lms:
                if lms in mapping:
                    raise ValueError(f"roster {path}: line {n}: lms_user_id {lms} is also {mapping[lms]}'s")
                mapping[lms] = sid
    return mapping, ids


def rlhf_apply_lti(c, env=None):
    env = _rlhf_lti_os.environ if env is None else env
    version = (env.get("RLHF_LTI_VERSION") or "1.3").strip()
    match = (env.get("RLHF_LTI_MATCH") or "lms_user_id").strip()
    if version not in RLHF_LTI_CLASSES:
        raise ValueError(f"RLHF_LTI_VERSION={version!r}: use 1.1 or 1.3")
    if (version, match) not in RLHF_LTI_USERNAME_KEYS:
        raise ValueError(f"RLHF_LTI_MATCH={match!r}: use lms_user_id or login_id")
    cls = RLHF_LTI_CLASSES[version]
    short = cls.rsplit(".", 1)[1]
    c.JupyterHub.authenticator_class = cls
    c[short].username_key = RLHF_LTI_USERNAME_KEYS[(version, match)]

    roster = env.get("RLHF_ROSTER") or RLHF_LTI_DEFAULT_ROSTER
    by_lms, ids = rlhf_lti_roster_map(roster)
    staff = {}
    for item in (env.get("RLHF_LTI_STAFF") or "").replace(" ", ",").split(","):
        if item:
            lms, _, account = item.partition("=")
            if not (lms.strip().isdigit() and account.strip()):
                raise ValueError(f"RLHF_LTI_STAFF: {item!r} is not <lms user id>=<account>")
            staff[lms.strip()] = account.strip()
    if match == "lms_user_id":
        clash = sorted(set(staff) & set(by_lms))
        if clash:
            raise ValueError(f"RLHF_LTI_STAFF: LMS id {', '.join(clash)} is a student's on the roster {roster}")
        c.Authenticator.username_map = {**by_lms, **staff}
    elif staff:
        raise ValueError("RLHF_LTI_STAFF is for RLHF_LTI_MATCH=lms_user_id; with login_id the staff log in "
                         "with their own login ids (RLHF_HUB_INSTRUCTOR / RLHF_HUB_GRADERS)")
    before = set(c.Authenticator.allowed_users) if "allowed_users" in c.Authenticator else set()
    c.Authenticator.allowed_users = before | set(ids) | set(staff.values())

    if version == "1.1":
        key = _rlhf_lti_secret(env, "RLHF_LTI11_CONSUMER_KEY")
        secret = _rlhf_lti_secret(env, "RLHF_LTI11_SHARED_SECRET")
        if not (key and secret):
            raise ValueError("LTI 1.1 needs RLHF_LTI11_CONSUMER_KEY and RLHF_LTI11_SHARED_SECRET (or ..._FILE): "
                             "the pair entered in Canvas's external app (openssl rand -hex 32 makes each)")
        c.LTI11Authenticator.consumers = {key: secret}
    else:
        # defaults: Canvas cloud, as in ltiauthenticator's examples/jupyterhub_config_lti13.py; a
        # self-hosted Canvas (or Moodle) names its own in its tool registration
        c.LTI13Authenticator.issuer = env.get("RLHF_LTI13_ISSUER") or "https://canvas.instructure.com"
        c.LTI13Authenticator.authorize_url = (env.get("RLHF_LTI13_AUTHORIZE_URL")
                                              or "https://canvas.instructure.com/api/lti/authorize_redirect")
        c.LTI13Authenticator.jwks_endpoint = (env.get("RLHF_LTI13_JWKS_ENDPOINT")
                                              or "https://canvas.instructure.com/api/lti/security/jwks")
        clients = {x.strip() for x in (env.get("RLHF_LTI13_CLIENT_ID") or "").split(",") if x.strip()}
        if not clients:
            raise ValueError("LTI 1.3 needs RLHF_LTI13_CLIENT_ID: the Client ID of the Canvas Developer Key")
        c.LTI13Authenticator.client_id = clients
    return {"version": version, "match": match, "class": cls, "roster": roster}


rlhf_apply_lti(c)  # noqa: F821 (``c`` is the config object JupyterHub loads this file with)
