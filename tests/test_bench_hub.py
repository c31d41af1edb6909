"""The pure parts of ``bench/bench_hub.py`` (issue 21, Load): percentiles, summaries, the markdown of
``bench/results/hub.md`` and the 300-student extrapolation, on fixed numbers worked out by hand;
and its command line without root (``--help`` works, a run says it needs root). Nothing here starts
a hub or creates an account."""
from __future__ import annotations

import argparse
import importlib.util
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("bench_hub", REPO / "bench" / "bench_hub.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_percentile_is_linear_between_closest_ranks(bench):
    # sorted 10 20 30 40 50: rank 0.9 * 4 = 3.6 -> 40 + 0.6 * (50 - 40) = 46
    assert bench.percentile([50, 10, 40, 20, 30], 90) == pytest.approx(46.0)
    assert bench.percentile([3, 1, 2], 50) == 2  # the middle one
    assert bench.percentile([1, 2, 3, 4], 50) == pytest.approx(2.5)  # rank 1.5
    assert bench.percentile([7], 90) == 7
    assert bench.percentile([1, 2, 3, 4], 100) == 4 and bench.percentile([1, 2, 3, 4], 0) == 1
    with pytest.raises(ValueError):
        bench.percentile([], 50)


def test_summary_skips_failed_students(bench):
    # None = that student's step failed; the others: 1 2 3 4 -> median 2.5, p90 rank 2.7 -> 3.7
    got = bench.summary([4.0, None, 1.0, 2.0, 3.0])
    assert got["n"] == 4 and got["max"] == 4.0 and got["total"] == 10.0
    assert got["median"] == pytest.approx(2.5) and got["p90"] == pytest.approx(3.7)
    assert bench.summary([None, None]) is None and bench.summary([]) is None


def test_table_row_and_the_section_of_one_size(bench):
    assert bench.table_row("spawn", bench.summary([1, 2, 3, 4]), "s", 5) == "| spawn | 2.50 s | 3.70 s | 4.00 s | 4/5 |"
    assert bench.table_row("PSS", bench.summary([100.4, 149.6]), "MiB", 2) == "| PSS | 125 MiB | 145 MiB | 150 MiB | 2/2 |"
    assert bench.table_row("fetch", None, "s", 3) == "| fetch | – | – | – | 0/3 |"
    r = {"n": 2, "cores": 2, "load_before": "1.00 / 2.00 / 3.00", "load_after": "4.00 / 2.50 / 3.00",
         "spawn": [2.0, 4.0], "pss": [100.0, 140.0], "rss": [150.0, 170.0], "pss_after": [101.0, 141.0],
         "fetch": [0.1, 0.3], "submit": [0.2, None], "stop": [0.5, 0.7], "hub_pss": 200.0, "spawn_wall": 4.1,
         "errors": ["RuntimeError: submit of x: HTTP 500"]}
    text = "\n".join(bench.size_section(r))
    assert "### N = 2" in text and "before: 1.00 / 2.00 / 3.00, after: 4.00 / 2.50 / 3.00; 2 cores" in text
    # spawn 2 and 4: median 3, p90 rank 0.9 -> 2 + 0.9 * 2 = 3.8
    assert "| spawn request -> server ready | 3.00 s | 3.80 s | 4.00 s | 2/2 |" in text
    assert "| submit (Assignment List API) | 0.20 s | 0.20 s | 0.20 s | 1/2 |" in text
    assert "All 2 idle servers together: PSS 240 MiB, RSS 320 MiB; the hub and its proxy: PSS 200 MiB" in text
    assert "- RuntimeError: submit of x: HTTP 500" in text


def test_extrapolation_to_300_students(bench):
    # 150 MiB x 300 + 300 MiB hub = 45300 MiB of 24000: 1.8875; (24000 - 300) // 150 = 158 servers fit;
    # 20 spawns in 10 s = 2 per second -> 300 in 150 s; 300 students / 2 cores = 150
    x = bench.extrapolation(150.0, 300.0, 24000.0, 2, 10.0, 20)
    assert x["memory_mib"] == 45300 and x["fraction_of_ram"] == pytest.approx(1.8875)
    assert x["fit_in_ram"] == 158 and x["students_per_core"] == 150
    assert x["spawns_per_s"] == pytest.approx(2.0) and x["all_spawned_s"] == pytest.approx(150.0)
    lines = "\n".join(bench.extrapolation_lines(x, 20))
    assert "44.2 GiB, 189 % of this machine's 23.4 GiB RAM; about 158 such servers" in lines
    assert "2.00 servers per second" in lines and "up to 150 s" in lines
    assert "spawns_per_s" not in bench.extrapolation(150.0, 300.0, 24000.0, 2, None, 0)
    # RSS 200 MiB x 300 + 300 = 60300 MiB = 58.9 GiB
    rss = bench.extrapolation(150.0, 300.0, 24000.0, 2, None, 0, rss_per_server_mib=200.0)
    assert rss["memory_rss_mib"] == 60300 and "(RSS) instead: 58.9 GiB" in "\n".join(bench.extrapolation_lines(rss, 20))


def test_report_marks_the_extrapolation_and_the_shared_machine(bench):
    r = {"n": 20, "cores": 2, "load_before": "1.50 / 1.00 / 1.00", "load_after": "5.00 / 2.00 / 1.00",
         "spawn": [10.0] * 20, "pss": [150.0] * 20, "rss": [160.0] * 20, "pss_after": [151.0] * 20,
         "fetch": [0.5] * 20, "submit": [0.5] * 20, "stop": [1.0] * 20, "hub_pss": 300.0, "spawn_wall": 10.0,
         "errors": []}
    meta = {"when": "2026-12-04 05:30 UTC", "host": "vm", "cores": 2, "ram_mib": 24000.0, "python": "3.11.7",
            "poll": 0.5, "settle": 5.0}
    text = bench.report([r], meta)
    assert "--sizes 20" in text and "**This machine is shared**" in text
    assert "## What this implies for a class of 300 on one VM (extrapolation)" in text
    assert "*Extrapolated from N <= 20 on this machine, not measured with 300.*" in text
    assert "about 158 such servers" in text and "culler" in text
    assert "Failures" not in text
    assert "Relative to" not in text  # one N: no baseline to divide by


def _size(bench, n, spawn, submit, load="0.20 / 0.10 / 0.05"):
    return {"n": n, "cores": 2, "load_before": load, "load_after": "1.00 / 0.50 / 0.20",
            "spawn": [spawn] * n, "pss": [150.0] * n, "rss": [160.0] * n, "pss_after": [151.0] * n,
            "fetch": [0.1] * n, "submit": [submit] * n, "stop": [1.0] * n, "hub_pss": 300.0,
            "spawn_wall": spawn, "errors": []}


def test_report_divides_each_n_by_the_smallest_n_of_the_same_run(bench):
    meta = {"when": "w", "host": "vm", "cores": 2, "ram_mib": 24000.0, "python": "3.11.7", "poll": 0.5,
            "settle": 5.0}
    text = bench.report([_size(bench, 1, 7.0, 0.04), _size(bench, 5, 14.0, 0.1), _size(bench, 20, 49.0, 0.4)], meta)
    assert "## Relative to N = 1 of the same run" in text
    assert "| 1 | 1.00x | 1.00x | 1.00x | 1.00x |" in text
    assert "| 5 | 2.00x | 1.00x | 2.50x | 1.00x |" in text
    assert "| 20 | 7.00x | 1.00x | 10.00x | 1.00x |" in text
    assert "otherwise quiet" in text and "This machine is shared" not in text
    # a busy start (1-minute load 1.5 on 2 cores) is said, whichever N it was
    busy = bench.report([_size(bench, 1, 7.0, 0.04), _size(bench, 5, 14.0, 0.1, load="1.50 / 1.0 / 1.0")], meta)
    assert "**This machine is shared**" in busy and "otherwise quiet" not in busy


def test_sizes_argument(bench):
    assert bench.parse_sizes("1,5,20") == [1, 5, 20] and bench.parse_sizes("5, 1,5") == [5, 1]
    for bad in ("0", "x", ",", "-1"):
        with pytest.raises(argparse.ArgumentTypeError):
            bench.parse_sizes(bad)


def test_help_works_and_a_run_without_root_says_it_needs_root(bench, monkeypatch, capsys):
    with pytest.raises(SystemExit) as done:
        bench.main(["--help"])
    assert done.value.code == 0 and "--sizes" in capsys.readouterr().out
    monkeypatch.setattr(bench.os, "geteuid", lambda: 65534)
    monkeypatch.setattr(bench.pwd, "getpwuid", lambda uid: type("E", (), {"pw_name": "nobody"})())
    assert bench.main(["--sizes", "1"]) == 2
    err = capsys.readouterr().err
    assert "needs root" in err and "you are nobody" in err and "Traceback" not in err
