"""z2jh config snippet (``hub.extraConfig["30-rlhf-k8s"]``): the staff's pods differ from the students'.

Every pod starts from ``singleuser`` of ``deploy/z2jh/values.yaml``: the *student* image (the pinned
requirements and the students' build of ``rlhf_lab``, nothing of ``judging/`` or ``instructor/``),
the exchange volume at ``/srv/nbgrader/exchange``. For the staff (``RLHF_HUB_INSTRUCTOR``,
``RLHF_HUB_GRADERS``) this hook swaps in the *instructor* image (``RLHF_INSTRUCTOR_IMAGE``: the full
library and the course's nbgrader_config.py) and mounts the course volume (``RLHF_COURSE_PVC``,
the course root with ``source/``, the gradebook, ``submitted/``, ``autograded/``) at
``RLHF_HUB_COURSE`` (default ``/srv/rlhf-course``); the instructor's server opens there, with
Formgrader. A student's pod never has the course volume mounted, so no student kernel can read
``source/`` or the gradebook whatever its Unix permissions.
"""
import os as _rlhf_k8s_os


def rlhf_apply_k8s(c, env=None):
    env = _rlhf_k8s_os.environ if env is None else env
    instructor = env.get("RLHF_HUB_INSTRUCTOR") or "instructor"
    graders = [g for g in (env.get("RLHF_HUB_GRADERS") or "").replace(",", " ").split() if g]
    staff = {instructor, *graders}
    image = env.get("RLHF_INSTRUCTOR_IMAGE") or ""
    course_root = env.get("RLHF_HUB_COURSE") or "/srv/rlhf-course"
    claim = env.get("RLHF_COURSE_PVC") or "rlhf-course"
    if not image:
        raise ValueError("RLHF_INSTRUCTOR_IMAGE is not set: the staff's pods need the image with the full library "
                         "(the student image has no judging/ and no instructor/)")
    earlier = c.KubeSpawner.pre_spawn_hook if "pre_spawn_hook" in c.KubeSpawner else None

    async def rlhf_staff_pod(spawner):
        if earlier is not None:
            result = earlier(spawner)
            if hasattr(result, "__await__"):
                await result
        if spawner.user.name not in staff:
            return
        spawner.image = image
        volume = {"name": "rlhf-course", "persistentVolumeClaim": {"claimName": claim}}
        mount = {"name": "rlhf-course", "mountPath": course_root}
        if isinstance(spawner.volumes, dict):
            spawner.volumes = {**spawner.volumes, "rlhf-course": volume}
        else:
            spawner.volumes = [*spawner.volumes, volume]
        if isinstance(spawner.volume_mounts, dict):
            spawner.volume_mounts = {**spawner.volume_mounts, "rlhf-course": mount}
        else:
            spawner.volume_mounts = [*spawner.volume_mounts, mount]
        spawner.environment = {**spawner.environment, "RLHF_COURSE_ROOT": course_root,
                               "RLHF_ROSTER": course_root + "/roster.csv"}
        if spawner.user.name == instructor:
            spawner.notebook_dir = course_root

    c.KubeSpawner.pre_spawn_hook = rlhf_staff_pod
    return {"staff": sorted(staff), "image": image, "course_root": course_root, "claim": claim}


rlhf_apply_k8s(c)  # noqa: F821 (``c`` is the config object JupyterHub loads this file with)
