"""The course's Dask workers run without the statistical profiler (rlhf_lab/instructor/classrun/executors.py).

Dask's worker profiler samples the frames of the running task every 10 ms; on Python 3.11 that
sampling fails now and then with a traceback (``AttributeError: 'dict' object has no attribute
'f_code'``) that lands in the middle of a class run's output. Nobody reads the profiles (the
cluster has no dashboard), so the course's LocalCluster switches the profiler off in every worker
process, not only in the process that starts the cluster.
"""
from __future__ import annotations

import pytest

from rlhf_lab.instructor.classrun import executors


def _worker_state(dask_worker):
    import dask

    return {"enabled": dask.config.get("distributed.worker.profile.enabled"),
            "callbacks": sorted(name for name in dask_worker.periodic_callbacks if name.startswith("profile"))}


@pytest.mark.slow
def test_the_course_cluster_workers_have_no_profiler():
    import dask
    from distributed import Client

    assert dask.config.get("distributed.worker.profile.enabled") is True  # Dask's default, here untouched
    with executors.make_local_cluster(1) as cluster, Client(cluster) as client:
        states = client.run(_worker_state)
    assert len(states) == 1
    for state in states.values():
        assert state == {"enabled": False, "callbacks": []}, state
    # the setting did not leak into this process's configuration
    assert dask.config.get("distributed.worker.profile.enabled") is True
