"""``nbgrader zip_collect`` on hostile LMS downloads: archives are extracted with limits
(:class:`rlhf_lab.instructor.operations.lms.SafeExtractor`) and only the LMS's own naming at the top of the
download decides whose a file is (:class:`~rlhf_lab.instructor.operations.lms.LmsFileNameCollector`).

Every archive is built here, in tmp, and collected by the real nbgrader command with the course's
configuration (``nbgrader_config.py``: both plugins and the roster)."""
from __future__ import annotations

import io
import os
import shutil
import stat
import tarfile
import zipfile
from pathlib import Path

import pytest

from course_support import REPO
from rlhf_lab.instructor.operations import lms
from rlhf_lab.instructor.classrun import pipeline

A = "a1_ppo_objective"
FIRST, SECOND = pipeline.notebooks(A, REPO, where="release")
MiB = 1024 * 1024
ROSTER = ("id,first_name,last_name,email,lms_user_id\n"
          "ada_correct,Ada,Okafor,ada@example.edu,40101\n"          # line 2
          "ben_unchanged,Ben,Moreau,ben@example.edu,40102\n"        # line 3
          "zed_attacker,Zed,Attacker,zed@example.edu,40130\n")      # line 4


@pytest.fixture(scope="module")
def course(tmp_path_factory):
    root = pipeline.copy_course(tmp_path_factory.mktemp("lms_limits") / "course", REPO,
                                include=("nbgrader_config.py", "release"))
    return root


def _nb(student: str, notebook: str) -> bytes:
    return (REPO / "examples" / "submissions" / student / A / f"{notebook}.ipynb").read_bytes()


def _zip(files: dict, method=zipfile.ZIP_DEFLATED) -> bytes:
    """A zip of ``{member name: bytes | zipfile.ZipInfo-and-bytes tuple}``, built in memory."""
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", method, compresslevel=9 if method == zipfile.ZIP_DEFLATED else None) as zf:
        for name, data in files.items():
            if isinstance(data, tuple):
                info, data = data
                zf.writestr(info, data)
            else:
                zf.writestr(name, data)
    return buf.getvalue()


def _bomb(layers: int = 2, fan: int = 16) -> bytes:
    """A 42.zip-style bomb: 1 MiB of zeros, then ``layers`` levels of ``fan`` copies of the level below."""
    layer = _zip({"zeros.bin": bytes(MiB)})
    for level in range(layers):
        layer = _zip({f"layer{level}_{i}.zip": layer for i in range(fan)})
    return layer


def _collect(root: Path, archives: dict, *args: str, roster: str = ROSTER):
    """Save ``archives`` ({file name: bytes}) as the LMS download and run ``nbgrader zip_collect``."""
    (root / "roster.csv").write_text(roster, encoding="utf-8")
    for name in ("downloaded", "submitted"):
        shutil.rmtree(root / name, ignore_errors=True)
    archive = root / "downloaded" / A / "archive"
    archive.mkdir(parents=True)
    for name, data in archives.items():
        (archive / name).write_bytes(data)
    return pipeline.run_nbgrader(["zip_collect", A, "--force", *args], root)


def _collected(root: Path) -> dict:
    """``{student: sorted notebook file names}`` in ``submitted/``."""
    sub = root / "submitted"
    if not sub.is_dir():
        return {}
    return {s.name: sorted(p.name for p in (s / A).iterdir() if p.suffix == ".ipynb") for s in sub.iterdir()}


def _extracted_bytes(root: Path) -> int:
    return sum(p.stat().st_size for p in (root / "downloaded" / A / "extracted").rglob("*") if p.is_file())


# --- limits -------------------------------------------------------------------------------------


def test_limits_have_sane_defaults():
    ex = lms.SafeExtractor()
    assert (ex.max_total_bytes, ex.max_files, ex.max_ratio, ex.ratio_min_bytes, ex.max_depth) == \
        (512 * MiB, 10_000, 100.0, MiB, 0)
    assert 0 < ex.max_file_bytes <= ex.max_total_bytes
    with pytest.raises(Exception, match="max_files must be >= 0"):
        lms.SafeExtractor(max_files=-1)


def test_a_nested_zip_bomb_uploaded_to_canvas_is_left_as_a_file(course):
    bomb = _bomb()
    assert len(bomb) < 10_000  # a few KB that would expand to 256 MiB
    files = {
        f"okaforada_40101_900001_{FIRST}.ipynb": _nb("ada_correct", FIRST),
        f"okaforada_40101_900001_{SECOND}.ipynb": _nb("ada_correct", SECOND),
        f"moreauben_40102_900002_{FIRST}.ipynb": _nb("ben_unchanged", FIRST),
        "moreauben_40102_900002_bomb.zip": bomb,
    }
    run = _collect(course, {"submissions.zip": _zip(files)})
    assert run.ok, run.output[-3000:]
    assert _collected(course) == {"ada_correct": [f"{FIRST}.ipynb", f"{SECOND}.ipynb"],
                                  "ben_unchanged": [f"{FIRST}.ipynb"]}
    extracted = course / "downloaded" / A / "extracted" / "submissions"
    assert (extracted / "moreauben_40102_900002_bomb.zip").read_bytes() == bomb  # the upload, unexpanded
    assert _extracted_bytes(course) < MiB
    assert "Left 'moreauben_40102_900002_bomb.zip' in submissions.zip as it is" in run.output
    assert "is not expanded (SafeExtractor.max_depth = 0)" in run.output


def test_the_bomb_with_nesting_allowed_stops_at_the_total_size_limit(course):
    limit = 20 * MiB
    files = {f"okaforada_40101_900001_{FIRST}.ipynb": _nb("ada_correct", FIRST),
             "moreauben_40102_900002_bomb.zip": _bomb()}
    run = _collect(course, {"submissions.zip": _zip(files)},
                   "--SafeExtractor.max_depth=3", f"--SafeExtractor.max_total_bytes={limit}")
    assert not run.ok
    assert "submissions.zip" in run.output
    assert f"stopped at more than {limit} decompressed bytes (20 MiB, SafeExtractor.max_total_bytes)" in run.output
    assert _extracted_bytes(course) <= limit
    assert not (course / "downloaded" / A / "extracted" / "submissions").exists()  # the partial output is removed
    assert _collected(course) == {}


def test_a_highly_compressed_member_is_skipped_and_the_rest_collected(course):
    files = {
        f"okaforada_40101_900001_{FIRST}.ipynb": bytes(20 * MiB),  # 20 MiB of zeros, about 20 KB deflated
        f"okaforada_40101_900001_{SECOND}.ipynb": _nb("ada_correct", SECOND),
        f"moreauben_40102_900002_{FIRST}.ipynb": _nb("ben_unchanged", FIRST),
    }
    run = _collect(course, {"submissions.zip": _zip(files)})
    assert run.ok, run.output[-3000:]
    assert _collected(course) == {"ada_correct": [f"{SECOND}.ipynb"], "ben_unchanged": [f"{FIRST}.ipynb"]}
    assert f"Skipped 'okaforada_40101_900001_{FIRST}.ipynb' in submissions.zip: it decompresses to more than " \
           "100 times its compressed size" in run.output
    assert "(SafeExtractor.max_ratio)" in run.output
    assert _extracted_bytes(course) < 3 * MiB


def test_a_member_larger_than_the_per_file_limit_is_skipped(course):
    big = os.urandom(3 * MiB)  # incompressible, stored: only the size limit can stop it
    files = {f"okaforada_40101_900001_{FIRST}.ipynb": big,
             f"moreauben_40102_900002_{FIRST}.ipynb": _nb("ben_unchanged", FIRST)}
    run = _collect(course, {"submissions.zip": _zip(files, zipfile.ZIP_STORED)},
                   f"--SafeExtractor.max_file_bytes={2 * MiB}")
    assert run.ok, run.output[-3000:]
    assert _collected(course) == {"ben_unchanged": [f"{FIRST}.ipynb"]}
    assert f"it is larger than {2 * MiB} bytes (SafeExtractor.max_file_bytes)" in run.output


def test_too_many_members_stop_the_download_with_the_limit_named(course):
    files = {f"moreauben_40102_900002_note{i}.txt": b"x" for i in range(60)}
    files[f"okaforada_40101_900001_{FIRST}.ipynb"] = _nb("ada_correct", FIRST)
    run = _collect(course, {"submissions.zip": _zip(files)}, "--SafeExtractor.max_files=50")
    assert not run.ok
    assert "stopped at more than 50 archive members (SafeExtractor.max_files), in submissions.zip" in run.output
    assert _collected(course) == {}


def test_absolute_dotdot_and_symlink_members_are_skipped(course, tmp_path):
    outside = tmp_path / "outside"
    link = zipfile.ZipInfo(f"okaforada_40101_900001_{FIRST}.ipynb")
    link.create_system = 3
    link.external_attr = (stat.S_IFLNK | 0o777) << 16
    files = {
        "../escaped.ipynb": b"{}",
        f"{outside}/absolute.ipynb": b"{}",
        link.filename: (link, b"/etc/passwd"),
        f"okaforada_40101_900001_{SECOND}.ipynb": _nb("ada_correct", SECOND),
        f"moreauben_40102_900002_{FIRST}.ipynb": _nb("ben_unchanged", FIRST),
    }
    run = _collect(course, {"submissions.zip": _zip(files)})
    assert run.ok, run.output[-3000:]
    assert _collected(course) == {"ada_correct": [f"{SECOND}.ipynb"], "ben_unchanged": [f"{FIRST}.ipynb"]}
    assert not outside.exists() and not list((course / "downloaded").rglob("escaped.ipynb"))
    assert not (course / "downloaded" / A / "extracted" / "submissions" / link.filename).exists()
    assert "Skipped '../escaped.ipynb' in submissions.zip: it climbs out of the archive" in run.output
    assert f"Skipped '{outside}/absolute.ipynb' in submissions.zip: it is an absolute path" in run.output
    assert f"Skipped '{link.filename}' in submissions.zip: it is a symbolic link" in run.output


def _tar_gz(members: list) -> bytes:
    """A .tar.gz of ``[(TarInfo, bytes or None)]``."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tf:
        for info, data in members:
            if data is not None:
                info.size = len(data)
            tf.addfile(info, io.BytesIO(data) if data is not None else None)
    return buf.getvalue()


def _tarinfo(name: str, kind=tarfile.REGTYPE, linkname: str = "") -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type, info.linkname, info.mode = kind, linkname, 0o644
    return info


def test_tar_downloads_refuse_links_devices_fifos_and_escapes(course):
    ada = f"okaforada_40101_900001_{FIRST}.ipynb"
    members = [
        (_tarinfo(ada), _nb("ada_correct", FIRST)),
        (_tarinfo(f"moreauben_40102_900002_{FIRST}.ipynb", tarfile.SYMTYPE, "/etc/passwd"), None),
        (_tarinfo(f"moreauben_40102_900002_{SECOND}.ipynb", tarfile.LNKTYPE, ada), None),
        (_tarinfo(f"zedattacker_40130_900003_{FIRST}.ipynb", tarfile.FIFOTYPE), None),
        (_tarinfo(f"zedattacker_40130_900003_{SECOND}.ipynb", tarfile.CHRTYPE), None),
        (_tarinfo(f"../../zedattacker_40130_900003_{FIRST}.ipynb"), b"{}"),
    ]
    run = _collect(course, {"submissions.tar.gz": _tar_gz(members)})
    assert run.ok, run.output[-3000:]
    assert _collected(course) == {"ada_correct": [f"{FIRST}.ipynb"]}
    out = run.output
    assert f"Skipped 'moreauben_40102_900002_{FIRST}.ipynb' in submissions.tar.gz: it is a symbolic link" in out
    assert f"Skipped 'moreauben_40102_900002_{SECOND}.ipynb' in submissions.tar.gz: it is a hard link" in out
    assert f"Skipped 'zedattacker_40130_900003_{FIRST}.ipynb' in submissions.tar.gz: it is not a regular file" in out
    assert f"Skipped 'zedattacker_40130_900003_{SECOND}.ipynb' in submissions.tar.gz: it is not a regular file" in out
    assert "climbs out of the archive" in out
    extracted = course / "downloaded" / A / "extracted" / "submissions"
    assert sorted(p.name for p in extracted.iterdir()) == [ada]


def test_a_tar_bomb_stops_at_the_compression_ratio(course):
    members = [(_tarinfo(f"okaforada_40101_900001_{FIRST}.ipynb"), bytes(30 * MiB))]
    archive = _tar_gz(members)
    run = _collect(course, {"submissions.tar.gz": archive})
    assert not run.ok
    assert f"decompresses to more than 100 times its size of {len(archive)} bytes (SafeExtractor.max_ratio), " \
           "in submissions.tar.gz" in run.output
    assert _extracted_bytes(course) == 0 and _collected(course) == {}


# --- identity from the top of the download only ----------------------------------------------------


def _canvas_with_a_classmate_named_upload() -> bytes:
    """Ada's Canvas submission plus her upload ``their.zip`` holding a file named like Ben's notebook,
    and a member whose folder is named like Ada's prefix with Ben's file name inside."""
    inner = _zip({f"moreauben_40102_900002_{SECOND}.ipynb": _nb("ada_correct", SECOND)})
    return _zip({
        f"okaforada_40101_900001_{FIRST}.ipynb": _nb("ada_correct", FIRST),
        "okaforada_40101_900001_their.zip": inner,
        f"okaforada_40101_900001_dir/moreauben_40102_900002_{SECOND}.ipynb": _nb("ada_correct", SECOND),
        f"moreauben_40102_900002_{FIRST}.ipynb": _nb("ben_unchanged", FIRST),
    })


@pytest.mark.parametrize("args", [(), ("--SafeExtractor.max_depth=1",),
                                  ("--ZipCollectApp.extractor_plugin=nbgrader.plugins.ExtractorPlugin",)],
                         ids=["default", "nesting-allowed", "stock-extractor"])
def test_a_file_inside_a_canvas_upload_is_never_a_classmates_notebook(course, args):
    run = _collect(course, {"submissions.zip": _canvas_with_a_classmate_named_upload()}, *args)
    assert run.ok, run.output[-3000:]
    assert _collected(course) == {"ada_correct": [f"{FIRST}.ipynb"], "ben_unchanged": [f"{FIRST}.ipynb"]}
    assert (course / "submitted" / "ben_unchanged" / A / f"{FIRST}.ipynb").read_bytes() == _nb("ben_unchanged", FIRST)
    out = run.output
    assert (f"Skipped submissions/okaforada_40101_900001_dir/moreauben_40102_900002_{SECOND}.ipynb: its name "
            "follows neither Canvas's nor Moodle's download naming (the LMS's name must be the first") in out
    expanded = (course / "downloaded" / A / "extracted" / "submissions" / "okaforada_40101_900001_their"
                / f"moreauben_40102_900002_{SECOND}.ipynb")
    if args:  # the upload was expanded: its file is there, and still nobody's
        assert expanded.exists()
        assert f"Skipped submissions/okaforada_40101_900001_their/moreauben_40102_900002_{SECOND}.ipynb" in out
    else:
        assert not expanded.exists()
        assert "Left 'okaforada_40101_900001_their.zip' in submissions.zip as it is" in out


def test_a_moodle_folder_named_like_a_classmate_inside_a_submission_is_not_theirs(course):
    files = {
        f"Zed Attacker_5530_assignsubmission_file_/{SECOND}.ipynb": _nb("ada_correct", SECOND),
        f"Zed Attacker_5530_assignsubmission_file_/Ben Moreau_5502_assignsubmission_file_/{FIRST}.ipynb":
            _nb("ada_correct", FIRST),
        f"Ada Okafor_5501_assignsubmission_file_/{FIRST}.ipynb": _nb("ada_correct", FIRST),
    }
    run = _collect(course, {"moodle.zip": _zip(files)})
    assert run.ok, run.output[-3000:]
    assert _collected(course) == {"ada_correct": [f"{FIRST}.ipynb"], "zed_attacker": [f"{SECOND}.ipynb"]}
    assert ("Skipped moodle/Zed Attacker_5530_assignsubmission_file_/Ben Moreau_5502_assignsubmission_file_/"
            f"{FIRST}.ipynb: its name follows neither") in run.output


# --- identities that collide are not guessed ----------------------------------------------------------


def test_a_moodle_display_name_equal_to_a_classmates_collects_neither(course):
    files = {
        f"Ben Moreau_5502_assignsubmission_file_/{FIRST}.ipynb": _nb("ben_unchanged", FIRST),
        f"Ben Moreau_5530_assignsubmission_file_/{FIRST}.ipynb": _nb("ada_correct", FIRST),  # Zed, renamed
        f"Ada Okafor_5501_assignsubmission_file_/{FIRST}.ipynb": _nb("ada_correct", FIRST),
    }
    run = _collect(course, {"moodle.zip": _zip(files)})
    assert run.ok, run.output[-3000:]
    assert _collected(course) == {"ada_correct": [f"{FIRST}.ipynb"]}
    assert ("ERROR] Not collected: 2 Moodle users of this download map to roster student 'ben_unchanged': "
            "'Ben Moreau_5502_assignsubmission_file_', 'Ben Moreau_5530_assignsubmission_file_'") in run.output
    assert "check the participant ids 5502, 5530 in Moodle" in run.output
    assert (f"Skipped moodle/Ben Moreau_5530_assignsubmission_file_/{FIRST}.ipynb: two Moodle users of this "
            "download map to roster student 'ben_unchanged' (see the error above)") in run.output


def test_two_roster_rows_with_one_moodle_name_collect_neither(course):
    roster = ROSTER + ("sam_a,Sam,Lee,sam.a@example.edu,40140\n"       # line 5
                       "sam_b,Sam,LEE,sam.b@example.edu,40141\n")      # line 6
    files = {
        f"Sam Lee_5540_assignsubmission_file_/{FIRST}.ipynb": _nb("ada_correct", FIRST),
        f"Ada Okafor_5501_assignsubmission_file_/{FIRST}.ipynb": _nb("ada_correct", FIRST),
        f"Ben Moreau_5502_assignsubmission_file_{SECOND}.ipynb": _nb("ben_unchanged", SECOND),
    }
    run = _collect(course, {"moodle.zip": _zip(files)}, roster=roster)
    assert run.ok, run.output[-3000:]
    assert _collected(course) == {"ada_correct": [f"{FIRST}.ipynb"], "ben_unchanged": [f"{SECOND}.ipynb"]}
    assert ("ERROR] Not collected: two roster students have the name 'Sam Lee': line 5 (id 'sam_a') and "
            "line 6 (id 'sam_b'); no file is collected for either") in run.output


def test_two_roster_rows_with_one_canvas_id_collect_neither(course):
    roster = ROSTER + ("cam_a,Cam,Ito,cam.a@example.edu,40150\n"       # line 5
                       "cam_b,Cem,Ito,cam.b@example.edu,40150\n")      # line 6
    files = {
        f"itocam_40150_900005_{FIRST}.ipynb": _nb("ada_correct", FIRST),
        f"okaforada_40101_900001_{FIRST}.ipynb": _nb("ada_correct", FIRST),
    }
    run = _collect(course, {"submissions.zip": _zip(files)}, roster=roster)
    assert run.ok, run.output[-3000:]
    assert _collected(course) == {"ada_correct": [f"{FIRST}.ipynb"]}
    assert ("ERROR] Not collected: two roster students have Canvas user id 40150: line 5 (id 'cam_a') and "
            "line 6 (id 'cam_b')") in run.output
    assert f"Skipped submissions/itocam_40150_900005_{FIRST}.ipynb: two roster students have" in run.output
