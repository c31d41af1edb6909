"""Deployment beyond one server (issue 21, docs/deployment.md): the configs in ``deploy/`` parse and agree
with the one-server hub.

Fast, no server started: the YAML files load with ``yaml.safe_load``; the JupyterHub config snippets
are compiled and executed against a real ``traitlets.config.Config``, as JupyterHub loads them, and
what they set is compared with :mod:`rlhf_lab.instructor.operations.hub` (``DEFAULT_EXCHANGE``,
``DEFAULT_COURSE``, ``DEFAULT_INSTRUCTOR``, the course id of ``nbgrader_config.py``, the group and
role names, ``server_scopes``) and the roster module (``ID_RULE``, ``COLUMNS``), never with literals
of this file, so a name that drifts in either place fails here. An LTI 1.1 launch is signed the way
Canvas signs it (OAuth 1.0a, HMAC-SHA1 over the POST form) and, once verified, logs the student in
as their roster id through JupyterHub's own ``Authenticator`` with the LTI snippet's config.
"""
from __future__ import annotations

import asyncio
import csv
import importlib.util
import time
import urllib.parse
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml
from traitlets.config import Config

from rlhf_lab.instructor.operations import hub
from rlhf_lab.instructor.operations import roster as roster_mod

REPO = Path(__file__).resolve().parents[1]
DEPLOY = REPO / "deploy"
ROSTER = REPO / "examples" / "roster.csv"
COURSE = hub.course_id_from_config(REPO / "nbgrader_config.py")
GROUPS = DEPLOY / "hub" / "rlhf_groups.py"
LTI = DEPLOY / "lti" / "jupyterhub_config_lti.py"
K8S = DEPLOY / "z2jh" / "rlhf_k8s.py"
TLJH_SPAWNER = DEPLOY / "tljh" / "rlhf_spawner.py"
#: the top-level keys TLJH reads from config.yaml (tljh/configurer.py `default`, and `auth`)
TLJH_KEYS = {"base_url", "auth", "users", "limits", "http", "https", "traefik_api", "user_environment", "services"}
RLHF_ENV = ("RLHF_ROSTER", "RLHF_COURSE_ID", "RLHF_HUB_INSTRUCTOR", "RLHF_HUB_GRADERS", "RLHF_HUB_COURSE",
            "RLHF_COURSE_PVC", "RLHF_INSTRUCTOR_IMAGE", "RLHF_LTI_VERSION", "RLHF_LTI_MATCH", "RLHF_LTI_STAFF",
            "RLHF_LTI11_CONSUMER_KEY", "RLHF_LTI11_SHARED_SECRET", "RLHF_LTI13_CLIENT_ID", "RLHF_TLJH_COURSE_JSON")


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch):
    for name in RLHF_ENV:
        monkeypatch.delenv(name, raising=False)


def load_snippet(path: Path, c: Config | None = None, source: str | None = None) -> tuple[Config, dict]:
    """Execute a config snippet the way JupyterHub's config loader does (``c`` and ``get_config`` given)."""
    c = Config() if c is None else c
    text = path.read_text(encoding="utf-8") if source is None else source
    code = compile(text, str(path), "exec")
    namespace = {"c": c, "get_config": lambda: c, "__name__": "__main__"}
    exec(code, namespace)
    return c, namespace


def roster_rows(path: Path = ROSTER) -> list[dict]:
    with open(path, newline="", encoding="utf-8-sig") as fh:
        return list(csv.DictReader(fh))


def settings(**kw) -> hub.Settings:
    return hub.Settings(roster=ROSTER, course_id=COURSE, **kw)


def fake_spawner(name: str, **kw):
    return SimpleNamespace(user=SimpleNamespace(name=name), environment={}, notebook_dir="", **kw)


# --- the snippet every hub loads: allowed users, nbgrader's groups, the grader role ----------------------

def test_groups_snippet_matches_the_one_server_hub(monkeypatch):
    monkeypatch.setenv("RLHF_ROSTER", str(ROSTER))
    monkeypatch.setenv("RLHF_HUB_GRADERS", "ta_one, ta_two")
    c = Config()
    c.Authenticator.allowed_users = {"someone_else"}           # set earlier by the platform (TLJH users.allowed)
    c.JupyterHub.load_roles = [{"name": "idle-culler", "scopes": ["list:users"], "services": ["culler"]}]
    c, ns = load_snippet(GROUPS, c)

    ids = hub.roster_ids(ROSTER)
    s = settings(graders=("ta_one", "ta_two"))
    assert ns["RLHF_DEFAULT_COURSE_ID"] == COURSE
    assert ns["RLHF_DEFAULT_INSTRUCTOR"] == hub.DEFAULT_INSTRUCTOR
    assert ns["RLHF_DEFAULT_ROSTER"] == str(Path(hub.DEFAULT_COURSE) / "roster.csv")
    assert ns["RLHF_ID_RULE"].pattern == roster_mod.ID_RULE.pattern
    assert c.Authenticator.allowed_users == {"someone_else", *ids, *s.staff()}
    assert c.JupyterHub.load_groups == {
        f"nbgrader-{COURSE}": {"users": sorted(set(ids) | {hub.DEFAULT_INSTRUCTOR})},
        f"formgrade-{COURSE}": {"users": sorted(s.staff())},
    }
    roles = {r["name"]: r for r in c.JupyterHub.load_roles}
    assert set(roles) == {"idle-culler", f"grader-{COURSE}"}
    assert roles[f"grader-{COURSE}"]["users"] == sorted(s.staff())
    # the servers' token scopes are exactly the one-server hub's, for a student and for the staff
    ours, theirs = c.Spawner.server_token_scopes, hub.server_scopes(s)
    for name in (ids[0], hub.DEFAULT_INSTRUCTOR, "ta_two"):
        assert ours(fake_spawner(name)) == theirs(fake_spawner(name)), name
    staff_extra = set(theirs(fake_spawner(hub.DEFAULT_INSTRUCTOR))) - set(theirs(fake_spawner(ids[0])))
    assert set(roles[f"grader-{COURSE}"]["scopes"]) == staff_extra


def test_groups_snippet_refuses_a_bad_roster_with_its_line(tmp_path, monkeypatch):
    bad = tmp_path / "roster.csv"
    bad.write_text("id,first_name,last_name,email,lms_user_id\nada,A,O,a@x,1\nAda Lovelace,A,L,b@x,2\n"
                   "ada,A,O,c@x,3\ninstructor,I,N,d@x,4\n", encoding="utf-8")
    monkeypatch.setenv("RLHF_ROSTER", str(bad))
    with pytest.raises(ValueError) as err:
        load_snippet(GROUPS)
    assert "line 3: id 'Ada Lovelace' is not a valid Linux user name" in str(err.value)
    assert "line 4: id ada already on line 2" in str(err.value)
    assert roster_mod.id_problem("Ada Lovelace")  # the course's own rule refuses it as well
    bad.write_text("id,lms_user_id\nada,1\ninstructor,4\n", encoding="utf-8")
    with pytest.raises(ValueError, match="also the instructor/grader account"):
        load_snippet(GROUPS)


# --- TLJH -----------------------------------------------------------------------------------------------

def test_tljh_config_yaml():
    cfg = yaml.safe_load((DEPLOY / "tljh" / "config.yaml").read_text(encoding="utf-8"))
    assert set(cfg) <= TLJH_KEYS, set(cfg) - TLJH_KEYS
    assert cfg["auth"]["type"] == "jupyterhub.auth.PAMAuthenticator"   # the accounts of `make hub-users`
    assert cfg["auth"]["PAMAuthenticator"] == {"open_sessions": False}  # as hub.configure sets it
    assert cfg["users"]["admin"] == []        # a TLJH admin has passwordless sudo
    assert cfg["users"]["allowed"] == []      # the roster is the list (10-rlhf-groups.py)
    assert cfg["user_environment"]["default_app"] == "jupyterlab"
    assert isinstance(cfg["limits"]["memory"], str) and cfg["limits"]["cpu"]
    assert cfg["services"]["cull"]["users"] is False  # the culler never deletes the roster's hub users


def test_tljh_spawner_runs_each_server_as_the_roster_account(tmp_path, monkeypatch):
    import json

    s = settings()
    ids = hub.roster_ids(ROSTER)
    student_env = {"PYTHONPATH": "/srv/rlhf-student-lib", "RLHF_EXCHANGE": str(s.exchange)}
    staff_env = {"PYTHONPATH": f"{s.course_root}/.library", "RLHF_COURSE_ROOT": str(s.course_root)}
    data = {"course_id": COURSE, "course_root": str(s.course_root), "exchange": str(s.exchange),
            "instructor": s.instructor, "staff": s.staff(), "server_bin": "/srv/rlhf-hub/venv/bin",
            "environment": {"student": student_env, "instructor": staff_env}}
    path = tmp_path / "tljh-course.json"
    path.write_text(json.dumps(data), encoding="utf-8")
    # the keys the snippet reads are the ones prepare_course.py writes
    prepare = (DEPLOY / "tljh" / "prepare_course.py").read_text(encoding="utf-8")
    for key in data:
        assert f'"{key}"' in prepare, key
    compile(prepare, "prepare_course.py", "exec")

    monkeypatch.setenv("RLHF_TLJH_COURSE_JSON", str(path))
    c, _ = load_snippet(TLJH_SPAWNER)
    assert c.JupyterHub.spawner_class == "systemdspawner.SystemdSpawner"  # not TLJH's jupyter-<name> accounts
    assert c.SystemdSpawner.username_template == "{USERNAME}"
    assert c.SystemdSpawner.disable_user_sudo is True and c.SystemdSpawner.isolate_tmp is True
    assert c.Spawner.cmd == ["/srv/rlhf-hub/venv/bin/jupyterhub-singleuser"]
    student, teacher = fake_spawner(ids[0]), fake_spawner(s.instructor)
    c.Spawner.pre_spawn_hook(student)
    c.Spawner.pre_spawn_hook(teacher)
    assert student.environment == student_env and student.notebook_dir == ""
    assert teacher.environment == staff_env and teacher.notebook_dir == str(s.course_root)
    assert teacher.user_workingdir == str(s.course_root)

    monkeypatch.setenv("RLHF_TLJH_COURSE_JSON", str(tmp_path / "missing.json"))
    with pytest.raises(RuntimeError, match="prepare_course.py"):
        load_snippet(TLJH_SPAWNER)


# --- Zero to JupyterHub ---------------------------------------------------------------------------------

def z2jh_values() -> dict:
    return yaml.safe_load((DEPLOY / "z2jh" / "values.yaml").read_text(encoding="utf-8"))


def test_z2jh_values_agree_with_the_hub():
    v = z2jh_values()
    single, env = v["singleuser"], v["hub"]["extraEnv"]
    mounts = single["storage"]["extraVolumeMounts"]
    volumes = single["storage"]["extraVolumes"]
    exchange = [m for m in mounts.values() if m["mountPath"] == hub.DEFAULT_EXCHANGE]
    assert exchange, f"no volume mounted at {hub.DEFAULT_EXCHANGE}: {mounts}"
    assert exchange[0]["name"] in {vol["name"] for vol in volumes.values()}
    assert "persistentVolumeClaim" in volumes[exchange[0]["name"]]
    assert single["extraEnv"]["RLHF_EXCHANGE"] == hub.DEFAULT_EXCHANGE
    assert env["RLHF_COURSE_ID"] == COURSE
    assert env["RLHF_HUB_INSTRUCTOR"] == hub.DEFAULT_INSTRUCTOR
    assert env["RLHF_HUB_COURSE"] == hub.DEFAULT_COURSE
    assert v["hub"]["extraFiles"]["rlhf-roster"]["mountPath"] == env["RLHF_ROSTER"]
    header = v["hub"]["extraFiles"]["rlhf-roster"]["stringData"].strip().split(",")
    assert tuple(header) == roster_mod.COLUMNS
    assert single["uid"] == 1000  # the chart's jovyan: docs/deployment.md explains what that means
    # the claims exist in volumes.yaml, shared (ReadWriteMany): the exchange's and the course's
    docs = [d for d in yaml.safe_load_all((DEPLOY / "z2jh" / "volumes.yaml").read_text(encoding="utf-8")) if d]
    claims = {d["metadata"]["name"]: d for d in docs if d["kind"] == "PersistentVolumeClaim"}
    for claim in (volumes[exchange[0]["name"]]["persistentVolumeClaim"]["claimName"], env["RLHF_COURSE_PVC"]):
        assert claims[claim]["spec"]["accessModes"] == ["ReadWriteMany"], claim
    # the images bake in the same exchange, course id and the student build
    dockerfile = (DEPLOY / "z2jh" / "Dockerfile").read_text(encoding="utf-8")
    assert f'c.Exchange.root = "{hub.DEFAULT_EXCHANGE}"' in dockerfile
    assert f'c.CourseDirectory.course_id = "{COURSE}"' in dockerfile
    assert f'load_subconfig("{hub.DEFAULT_COURSE}/nbgrader_config.py")' in dockerfile
    student_lib = str(hub_student_lib_default())
    assert f"--dest {student_lib}" in dockerfile and f"PYTHONPATH={student_lib}" in dockerfile


def hub_student_lib_default() -> Path:
    from rlhf_lab.instructor.operations import student_library
    return student_library.DEFAULT_DEST


def test_z2jh_extra_config_is_the_snippets_and_runs(monkeypatch):
    spec = importlib.util.spec_from_file_location("rlhf_sync_values", DEPLOY / "z2jh" / "sync_values.py")
    sync = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(sync)
    v = z2jh_values()
    extra = v["hub"]["extraConfig"]
    assert list(extra) == sorted(extra) == list(sync.SNIPPETS)  # JupyterHub runs them in key order
    for key, path in sync.SNIPPETS.items():
        assert extra[key] == path.read_text(encoding="utf-8"), (
            f"hub.extraConfig[{key!r}] differs from {path}: run .venv/bin/python deploy/z2jh/sync_values.py")

    # run them as the hub pod would: with hub.extraEnv (the roster file is the bundled class's here)
    for name, value in v["hub"]["extraEnv"].items():
        monkeypatch.setenv(name, str(value))
    monkeypatch.setenv("RLHF_ROSTER", str(ROSTER))
    c = Config()
    for key in extra:
        c, _ = load_snippet(DEPLOY / key, c, source=extra[key])
    assert set(c.JupyterHub.load_groups) == {f"nbgrader-{COURSE}", f"formgrade-{COURSE}"}
    assert c.JupyterHub.authenticator_class == "ltiauthenticator.lti13.auth.LTI13Authenticator"
    assert c.LTI13Authenticator.username_key == "custom_canvas_user_id"

    ids = hub.roster_ids(ROSTER)
    staff_pod = fake_spawner(hub.DEFAULT_INSTRUCTOR, image="student", volumes={"rlhf-exchange": {}},
                             volume_mounts={"rlhf-exchange": {"mountPath": hub.DEFAULT_EXCHANGE}})
    student_pod = fake_spawner(ids[0], image="student", volumes={"rlhf-exchange": {}},
                               volume_mounts={"rlhf-exchange": {"mountPath": hub.DEFAULT_EXCHANGE}})
    asyncio.run(c.KubeSpawner.pre_spawn_hook(staff_pod))
    asyncio.run(c.KubeSpawner.pre_spawn_hook(student_pod))
    assert staff_pod.image == v["hub"]["extraEnv"]["RLHF_INSTRUCTOR_IMAGE"]
    assert staff_pod.volume_mounts["rlhf-course"]["mountPath"] == hub.DEFAULT_COURSE
    assert staff_pod.notebook_dir == hub.DEFAULT_COURSE
    assert student_pod.image == "student" and set(student_pod.volume_mounts) == {"rlhf-exchange"}
    assert set(student_pod.volumes) == {"rlhf-exchange"} and student_pod.environment == {}


# --- LTI ------------------------------------------------------------------------------------------------

LTI_CASES = [
    ("1.1", "lms_user_id", "ltiauthenticator.lti11.auth.LTI11Authenticator", "custom_canvas_user_id"),
    ("1.1", "login_id", "ltiauthenticator.lti11.auth.LTI11Authenticator", "custom_canvas_user_login_id"),
    ("1.3", "lms_user_id", "ltiauthenticator.lti13.auth.LTI13Authenticator", "custom_canvas_user_id"),
    ("1.3", "login_id", "ltiauthenticator.lti13.auth.LTI13Authenticator", "custom_canvas_user_login_id"),
]


def lti_env(monkeypatch, version, match, staff="40001=instructor"):
    monkeypatch.setenv("RLHF_ROSTER", str(ROSTER))
    monkeypatch.setenv("RLHF_LTI_VERSION", version)
    monkeypatch.setenv("RLHF_LTI_MATCH", match)
    monkeypatch.setenv("RLHF_LTI11_CONSUMER_KEY", "course-key")
    monkeypatch.setenv("RLHF_LTI11_SHARED_SECRET", "course-secret")
    monkeypatch.setenv("RLHF_LTI13_CLIENT_ID", "10000000000001")
    if staff and match == "lms_user_id":
        monkeypatch.setenv("RLHF_LTI_STAFF", staff)


@pytest.mark.parametrize("version,match,cls,key", LTI_CASES)
def test_lti_snippet_selects_the_authenticator_and_username(monkeypatch, version, match, cls, key):
    from jupyterhub.auth import Authenticator

    lti_env(monkeypatch, version, match)
    c, _ = load_snippet(LTI)
    short = cls.rsplit(".", 1)[1]
    assert c.JupyterHub.authenticator_class == cls
    assert c[short].username_key == key
    rows = roster_rows()
    assert "lms_user_id" in roster_mod.COLUMNS and "id" in roster_mod.COLUMNS
    auth = Authenticator(config=c)
    for row in rows:
        sent = row["lms_user_id"] if match == "lms_user_id" else row["id"].upper()  # Canvas may send upper case
        name = auth.normalize_username(sent)
        assert name == row["id"] and auth.check_allowed(name), (sent, name)
    if match == "lms_user_id":
        assert auth.normalize_username("40001") == hub.DEFAULT_INSTRUCTOR
        assert c.Authenticator.username_map == {**{r["lms_user_id"]: r["id"] for r in rows}, "40001": "instructor"}
    # someone the LMS knows but the roster does not: not allowed, no server
    assert not auth.check_allowed(auth.normalize_username("99999"))
    if version == "1.1":
        assert c.LTI11Authenticator.consumers == {"course-key": "course-secret"}
    else:
        assert c.LTI13Authenticator.client_id == {"10000000000001"}
        assert c.LTI13Authenticator.issuer.startswith("https://")


def test_lti_snippet_says_what_is_missing(monkeypatch):
    lti_env(monkeypatch, "1.1", "lms_user_id")
    monkeypatch.delenv("RLHF_LTI11_SHARED_SECRET")
    with pytest.raises(ValueError, match="RLHF_LTI11_SHARED_SECRET"):
        load_snippet(LTI)
    lti_env(monkeypatch, "1.3", "lms_user_id")
    monkeypatch.delenv("RLHF_LTI13_CLIENT_ID")
    with pytest.raises(ValueError, match="RLHF_LTI13_CLIENT_ID"):
        load_snippet(LTI)
    lti_env(monkeypatch, "1.2", "lms_user_id")
    with pytest.raises(ValueError, match="use 1.1 or 1.3"):
        load_snippet(LTI)
    lti_env(monkeypatch, "1.3", "lms_user_id", staff="40101=instructor")  # 40101 is ada_correct's
    with pytest.raises(ValueError, match="is a student's on the roster"):
        load_snippet(LTI)


# --- an LTI 1.1 launch, signed the way Canvas signs it ----------------------------------------------------

LAUNCH_URL = "https://hub.example.edu/hub/lti/launch"


def canvas_launch(row: dict, key="course-key", secret="course-secret", timestamp=None) -> dict:
    """The POST form Canvas sends for a student's launch (LTI 1.1 basic launch, privacy "public"),
    signed with the consumer key and shared secret: OAuth 1.0a, HMAC-SHA1, parameters in the body."""
    from oauthlib.oauth1 import SIGNATURE_HMAC_SHA1, SIGNATURE_TYPE_BODY, Client

    form = {
        "lti_message_type": "basic-lti-launch-request",
        "lti_version": "LTI-1p0",
        "resource_link_id": "a2b3c4d5e6f7",
        "resource_link_title": "a2_ppo_rlhf",
        "context_id": "4dde05e8ca1973bcca9bffc13e1548820eee93a3",
        "context_title": "RLHF mechanics",
        "roles": "Learner",
        "user_id": "535fa085f22b4655f48cd5a36a9215f64c062838",  # Canvas's opaque LTI id
        "custom_canvas_user_id": row["lms_user_id"],
        "custom_canvas_user_login_id": row["id"],
        "lis_person_contact_email_primary": row["email"],
        "lis_person_name_full": f"{row['first_name']} {row['last_name']}",
        "tool_consumer_info_product_family_code": "canvas",
        "launch_presentation_return_url": "https://canvas.example.edu/courses/1/external_content/success/external_tool",
    }
    client = Client(key, client_secret=secret, signature_method=SIGNATURE_HMAC_SHA1,
                    signature_type=SIGNATURE_TYPE_BODY, timestamp=timestamp)
    _, _, body = client.sign(LAUNCH_URL, http_method="POST", body=form,
                             headers={"Content-Type": "application/x-www-form-urlencoded"})
    return dict(urllib.parse.parse_qsl(body, keep_blank_values=True))


def verify_like_ltiauthenticator(args: dict, consumers: dict) -> bool:
    """The check of ``ltiauthenticator.lti11.validator.LTI11LaunchValidator.validate_launch_request``
    (1.6.x), on oauthlib's own primitives: the OAuth and LTI parameters it requires are there, the consumer
    key is known, the timestamp is within 30 s (its nonce cache is left out), and
    the HMAC-SHA1 of the POST's base string equals ``oauth_signature``."""
    from oauthlib.common import safe_string_equals
    from oauthlib.oauth1.rfc5849 import Client, signature

    required = ("oauth_consumer_key", "oauth_signature_method", "oauth_timestamp", "oauth_nonce", "oauth_version",
                "oauth_signature", "lti_message_type", "lti_version", "resource_link_id", "user_id")
    if not all(args.get(name) for name in required):
        return False
    if args["oauth_consumer_key"] not in consumers or abs(time.time() - int(args["oauth_timestamp"])) > 30:
        return False
    base = signature.signature_base_string(
        "POST", signature.base_string_uri(LAUNCH_URL),
        signature.normalize_parameters(signature.collect_parameters(body=list(args.items()), headers={})))
    sign = signature.sign_hmac_sha1_with_client(
        base, Client(client_key=args["oauth_consumer_key"], client_secret=consumers[args["oauth_consumer_key"]]))
    return safe_string_equals(sign, args["oauth_signature"])


def test_canvas_lti11_launch_logs_the_student_in_as_their_roster_id(monkeypatch):
    from jupyterhub.auth import Authenticator

    lti_env(monkeypatch, "1.1", "lms_user_id")
    c, _ = load_snippet(LTI)
    consumers = c.LTI11Authenticator.consumers
    key_name = c.LTI11Authenticator.username_key

    class VerifiedLaunch(Authenticator):
        """JupyterHub's Authenticator with the LTI 1.1 launch check as its ``authenticate``."""

        async def authenticate(self, handler, data):
            if not verify_like_ltiauthenticator(data, consumers):
                return None
            return {"name": data.get(key_name) or data["user_id"], "auth_state": None}

    auth = VerifiedLaunch(config=c)
    row = roster_rows()[0]
    launch = canvas_launch(row)
    assert launch["oauth_signature_method"] == "HMAC-SHA1" and launch["custom_canvas_user_id"] == row["lms_user_id"]
    user = asyncio.run(auth.get_authenticated_user(None, launch))
    assert user["name"] == row["id"]

    tampered = dict(launch, custom_canvas_user_id=roster_rows()[1]["lms_user_id"])  # claims to be a classmate
    assert asyncio.run(auth.get_authenticated_user(None, tampered)) is None
    assert asyncio.run(auth.get_authenticated_user(None, canvas_launch(row, secret="guessed"))) is None
    stranger = dict(row, lms_user_id="99999", id="not_on_roster")
    assert asyncio.run(auth.get_authenticated_user(None, canvas_launch(stranger))) is None


def test_canvas_lti11_launch_through_ltiauthenticator(monkeypatch):
    """The same launch through the real ``LTI11Authenticator`` (runs once jupyterhub-ltiauthenticator is
    pinned with the course; docs/deployment.md names the pins)."""
    lti11 = pytest.importorskip("ltiauthenticator.lti11.auth")

    lti_env(monkeypatch, "1.1", "lms_user_id")
    c, _ = load_snippet(LTI)
    auth = lti11.LTI11Authenticator(config=c)
    row = roster_rows()[0]
    launch = canvas_launch(row)
    parsed = urllib.parse.urlsplit(LAUNCH_URL)
    request = SimpleNamespace(arguments={k: [v.encode()] for k, v in launch.items()}, host=parsed.netloc,
                              uri=parsed.path, headers={"X-Forwarded-Proto": "https"}, protocol="https")
    handler = SimpleNamespace(request=request)
    user = asyncio.run(auth.get_authenticated_user(handler, None))
    assert user["name"] == row["id"]
