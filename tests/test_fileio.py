"""nccl_tune.fileio: the output checks, atomic writes, results locks and the input policy."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time

import pytest
from conftest import REPO_ROOT, subprocess_env
from unwritable import drop_overrides, unwritable_folder

from nccl_tune import fileio
from nccl_tune.errors import NcclTuneError
from nccl_tune.fileio import OutputKind

RECORD = json.dumps({"schema": 1, "cell": "baseline", "backend": "sim"})


def refusal(func, *args, **kwargs) -> str:
    with pytest.raises(NcclTuneError) as info:
        func(*args, **kwargs)
    text = str(info.value)
    assert "\n" not in text
    return text


# ---------------------------------------------------------------- check_output


def test_output_same_as_an_input_is_refused_by_path_link_and_inode(tmp_path):
    results = tmp_path / "r.jsonl"
    results.write_text(RECORD + "\n")
    os.symlink(results, tmp_path / "link.jsonl")
    os.link(results, tmp_path / "hard.jsonl")
    for out in (results, tmp_path / "link.jsonl", tmp_path / "hard.jsonl", tmp_path / "sub" / ".." / "r.jsonl"):
        (tmp_path / "sub").mkdir(exist_ok=True)
        text = refusal(fileio.check_output, out, kind=OutputKind.EXPORT, inputs=[str(results)], option="--out")
        assert text == f"--out {out}: is the same file as the input {results}; write to another file"


def test_output_under_proc_or_sys_is_refused(tmp_path):
    assert (
        refusal(fileio.check_output, "/sys/foo.jsonl", kind=OutputKind.RESULTS, option="--out")
        == "--out /sys/foo.jsonl: is under /sys, a kernel file system, not a place for output"
    )
    assert "is under /proc" in refusal(fileio.check_output, "/proc/self/x.env", kind="export")


def test_missing_folder_and_folder_targets_are_refused(tmp_path):
    assert refusal(fileio.check_output, tmp_path / "no" / "x.env", kind=OutputKind.EXPORT, option="--export") == (
        f"--export {tmp_path / 'no' / 'x.env'}: the folder {tmp_path / 'no'} does not exist"
    )
    assert refusal(fileio.check_output, tmp_path, kind=OutputKind.TEXT) == f"{tmp_path}: is a folder; give a file name"
    (tmp_path / "d.png").mkdir()
    assert "is a folder" in refusal(fileio.check_output, tmp_path / "d", kind=OutputKind.PLOT)


def test_devices_are_refused_except_dev_null_for_appends():
    assert "not a regular file" in refusal(fileio.check_output, "/dev/zero", kind=OutputKind.RESULTS)
    assert "not a regular file" in refusal(fileio.check_output, "/dev/null", kind=OutputKind.EXPORT)
    assert fileio.check_output("/dev/null", kind=OutputKind.RESULTS) == fileio.Path("/dev/null")


def test_results_only_appended_to_results(tmp_path):
    profile = tmp_path / "p.env"
    profile.write_text("NCCL_PROTO=LL\n")
    assert refusal(fileio.check_output, profile, kind=OutputKind.RESULTS, option="--out") == (
        f"--out {profile}: exists and is not a nccl-tune results file (no line of it is a nccl-tune "
        "record); results are appended only to results files: choose another file"
    )
    results = tmp_path / "r.jsonl"
    results.write_text("\n" + RECORD + "\nnot json\n")
    assert fileio.check_output(results, kind=OutputKind.RESULTS) == results
    empty = tmp_path / "e.jsonl"
    empty.write_text("")
    assert fileio.check_output(empty, kind=OutputKind.RESULTS) == empty
    # An export may replace any regular file (the command decides about --force).
    assert fileio.check_output(profile, kind=OutputKind.EXPORT) == profile


@pytest.mark.parametrize(
    "given, written",
    [
        ("a.png", "a.png"),
        ("a.PDF", "a.PDF"),
        ("a.svg", "a.svg"),
        ("a.txt", "a.txt.png"),
        ("adir", "adir.png"),
        ("a.jsonl", "a.jsonl.png"),
    ],
)
def test_plot_suffix_rule(tmp_path, given, written):
    assert fileio.check_output(tmp_path / given, kind=OutputKind.PLOT) == tmp_path / written


def test_plot_suffixes_are_the_ones_matplotlib_writes():
    matplotlib = pytest.importorskip("matplotlib")
    matplotlib.use("Agg")
    from matplotlib.figure import Figure

    supported = set(Figure().canvas.get_supported_filetypes())
    assert fileio.PLOT_SUFFIXES <= supported | {"webp"}  # webp needs pillow's WebP plugin
    assert {"png", "pdf", "svg"} <= fileio.PLOT_SUFFIXES


def test_unwritable_folder_is_refused_for_root_too(tmp_path):
    with unwritable_folder(tmp_path) as made:
        if made is None:
            return _refused_without_overrides(tmp_path / "ro")
        folder, how = made
        text = refusal(fileio.check_output, folder / "x.env", kind=OutputKind.EXPORT, option="--export")
        assert text.startswith(f"--export {folder / 'x.env'}: the folder {folder} is not writable"), how
        if how != "mode 0555":  # a read-only mount or an immutable folder: its files too
            assert "cannot be appended" in refusal(fileio.check_output, folder / "kept.txt", kind=OutputKind.TEXT)
    assert sorted(os.listdir(tmp_path / "ro")) == ["kept.txt"]


def _refused_without_overrides(folder):
    """Root, where neither a read-only bind mount nor chattr is allowed: the same check in
    a process without CAP_DAC_OVERRIDE, for which mode 0555 holds."""
    code = (
        "from nccl_tune import fileio\n"
        f"fileio.check_output({str(folder / 'x.env')!r}, kind='export', option='--export')"
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        env=subprocess_env(),
        cwd=REPO_ROOT,
        preexec_fn=drop_overrides,
    )
    assert f"--export {folder / 'x.env'}: the folder {folder} is not writable" in done.stderr


# ---------------------------------------------------------------- write_atomic


def test_write_atomic_replaces_keeps_mode_and_follows_links(tmp_path):
    target = tmp_path / "p.env"
    target.write_text("old\n")
    target.chmod(0o600)
    os.symlink(target, tmp_path / "link.env")
    fileio.write_atomic(tmp_path / "link.env", "new\n")
    assert target.read_text() == "new\n" and os.path.islink(tmp_path / "link.env")
    assert target.stat().st_mode & 0o777 == 0o600
    assert sorted(os.listdir(tmp_path)) == ["link.env", "p.env"]


FULL_DISK = textwrap.dedent("""
    import resource, signal, sys
    from nccl_tune import fileio, store
    from nccl_tune.errors import NcclTuneError
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)   # EFBIG instead of a signal, as ENOSPC would
    resource.setrlimit(resource.RLIMIT_FSIZE, (64, 64))
    try:
        if sys.argv[1] == "export":
            fileio.write_atomic(sys.argv[2], "x" * 1000)
        else:
            store.append_record(sys.argv[2], store.make_record(env={}, bytes=1, samples_us=[1.0] * 50))
    except NcclTuneError as exc:
        print(exc)
        sys.exit(exc.exit_code)
""")


def test_write_atomic_on_a_full_disk_keeps_the_old_file_and_leaves_nothing(tmp_path):
    """A real write failure (the file-size limit: EFBIG, as a full disk gives ENOSPC)."""
    target = tmp_path / "p.env"
    target.write_text("NCCL_PROTO=LL\n")
    done = subprocess.run(
        [sys.executable, "-c", FULL_DISK, "export", str(target)],
        capture_output=True,
        text=True,
        env=subprocess_env(),
        cwd=REPO_ROOT,
    )
    assert done.returncode == 1, done.stderr  # ran, but the file asked for was not written
    assert done.stdout.startswith(f"{target}: cannot write: File too large")
    assert target.read_text() == "NCCL_PROTO=LL\n"
    assert sorted(os.listdir(tmp_path)) == ["p.env"]


def test_results_append_on_a_full_disk_leaves_no_empty_file_and_no_torn_line(tmp_path):
    new = tmp_path / "new.jsonl"
    done = subprocess.run(
        [sys.executable, "-c", FULL_DISK, "results", str(new)],
        capture_output=True,
        text=True,
        env=subprocess_env(),
        cwd=REPO_ROOT,
    )
    assert done.returncode == 1, done.stderr  # ran, but the file asked for was not written
    assert "cannot append: File too large" in done.stdout
    assert not new.exists()
    old = tmp_path / "old.jsonl"
    old.write_text(RECORD[:40] + "\n")  # 40 bytes: room for a torn line, not a record
    subprocess.run(
        [sys.executable, "-c", FULL_DISK, "results", str(old)], capture_output=True, env=subprocess_env(), cwd=REPO_ROOT
    )
    assert old.read_text() == RECORD[:40] + "\n"


# ---------------------------------------------------------------- results lock

HOLD = textwrap.dedent("""
    import sys, time
    from nccl_tune import fileio
    with fileio.ResultsLock(sys.argv[1]):
        print("held", flush=True)
        time.sleep(30)
""")


def test_a_second_writer_is_refused_while_one_holds_the_results(tmp_path):
    results = tmp_path / "r.jsonl"
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD, str(results)],
        stdout=subprocess.PIPE,
        text=True,
        env=subprocess_env(),
        cwd=REPO_ROOT,
    )
    try:
        assert holder.stdout.readline() == "held\n"
        text = refusal(fileio.append_line, results, RECORD)
        assert text == (
            f"{results}: another process (pid {holder.pid}) is writing results to this "
            "file; wait for it to finish or choose another file"
        )
        assert refusal(fileio.check_not_busy, results, option="--out") == f"--out {text}"
        assert fileio.check_output(results, kind=OutputKind.RESULTS) == results  # static checks only
    finally:
        holder.kill()
        holder.wait()
    fileio.append_line(results, RECORD)  # free again once the holder is gone
    assert results.read_text() == RECORD + "\n"


def test_appends_in_one_process_go_through_its_held_lock(tmp_path):
    results = tmp_path / "r.jsonl"
    with fileio.ResultsLock(results, option="--out") as lock:
        assert fileio.held(results) is lock
        fileio.append_line(results, RECORD)
        fileio.append_line(results, RECORD)
        assert "already writing" in refusal(fileio.ResultsLock(results, option="--out").acquire)
    assert fileio.held(results) is None
    assert results.read_text() == (RECORD + "\n") * 2


def test_dev_null_takes_results_from_two_writers_at_once():
    """What check_output accepts, the results writer writes: /dev/null discards appends
    (no lock: there is nothing to protect, so two runs may share it; no fsync, which a
    character device refuses with EINVAL)."""
    assert fileio.check_output("/dev/null", kind=OutputKind.RESULTS, option="--out") == fileio.Path("/dev/null")
    with fileio.ResultsLock("/dev/null", option="--out"), fileio.ResultsLock("/dev/null", option="--out"):
        fileio.append_line("/dev/null", RECORD)
        fileio.append_lines("/dev/null", [RECORD, RECORD])
    fileio.append_line("/dev/null", RECORD)
    assert os.path.exists("/dev/null") and not os.path.isfile("/dev/null")


def test_a_lock_that_wrote_nothing_leaves_no_file(tmp_path):
    with fileio.ResultsLock(tmp_path / "r.jsonl"):
        pass
    assert os.listdir(tmp_path) == []


def test_a_torn_last_line_gets_a_newline_before_the_next_record(tmp_path):
    results = tmp_path / "r.jsonl"
    results.write_text(RECORD + "\n" + RECORD[:10])
    fileio.append_line(results, RECORD)
    assert results.read_text().split("\n") == [RECORD, RECORD[:10], RECORD, ""]


# ---------------------------------------------------------------- inputs


def test_read_text_refuses_non_utf8_naming_line_and_column(tmp_path):
    bad = tmp_path / "g.toml"
    bad.write_bytes(b'a = 1\nb = "x\xff"\n')
    assert (
        refusal(fileio.read_text, bad, what="grid file")
        == f"{bad}:2: not UTF-8 text (byte 0xff at column 7); a grid file is UTF-8"
    )


def test_read_text_caps_size_and_lines(tmp_path):
    big = tmp_path / "big.txt"
    big.write_bytes(b"a" * 2000)
    assert (
        refusal(fileio.read_text, big, what="topology paste", max_bytes=1000)
        == f"{big}: 2000 bytes: more than the 1000 bytes a topology paste may have"
    )
    long = tmp_path / "long.txt"
    long.write_text("ok\n" + "x" * 50 + "\n")
    assert (
        refusal(fileio.read_text, long, what="conf file", max_line=40)
        == f"{long}:2: a line of 50 characters: more than the 40 a conf file line may have"
    )


def test_read_text_names_a_folder_and_a_missing_file(tmp_path):
    assert refusal(fileio.read_text, tmp_path, what="profile") == f"{tmp_path}: is a folder, not a profile"
    assert (
        refusal(fileio.read_text, tmp_path / "x", what="profile")
        == f"{tmp_path / 'x'}: cannot read the profile: No such file or directory"
    )


def test_a_named_pipe_is_read_once_written_and_refused_without_a_writer(tmp_path, monkeypatch):
    """A pipe from `<(command)` (its writer already there) reads like a file; a named pipe
    that no process opens for writing is one error naming it after PIPE_WAIT_S, not a hang."""
    monkeypatch.setattr(fileio, "PIPE_WAIT_S", 0.3)
    fifo = tmp_path / "p.env"
    os.mkfifo(fifo)
    start = time.monotonic()
    assert refusal(fileio.read_text, fifo, what="profile") == (
        f"{fifo}: a named pipe that no process writes to (waited 0.3 s for a writer)"
    )
    assert time.monotonic() - start < 3
    writer = subprocess.Popen(["sh", "-c", 'echo NCCL_PROTO=LL > "$1"', "sh", str(fifo)])
    try:
        monkeypatch.setattr(fileio, "PIPE_WAIT_S", 30.0)
        assert fileio.read_text(fifo, what="profile") == "NCCL_PROTO=LL\n"
    finally:
        writer.wait(timeout=30)
    read_end, write_end = os.pipe()
    os.write(write_end, RECORD.encode() + b"\n")
    os.close(write_end)
    try:
        assert list(fileio.iter_lines(f"/dev/fd/{read_end}", what="results file")) == [(1, RECORD)]
    finally:
        os.close(read_end)


@pytest.mark.parametrize(
    "text, depth",
    [
        ("1", 0),
        ("[]", 1),
        ('{"a": [1, {"b": []}]}', 4),
        ('["[[[[", "\\"[["]', 1),
        ('{"k\\\\": "]]]"}', 1),
        ("[" * 10 + "]" * 10, 10),
    ],
)
def test_json_depth_ignores_brackets_in_strings(text, depth):
    assert fileio.json_depth(text) == depth


def test_load_json_refuses_deep_nesting_fast_without_recursion(tmp_path):
    deep = tmp_path / "m.json"
    deep.write_text("[" * 100_000)
    start = time.monotonic()
    assert (
        refusal(fileio.load_json, deep, what="model file")
        == f"{deep}: nested 100000 levels deep: a model file nests at most 32"
    )
    assert time.monotonic() - start < 5  # a hang detector, not a benchmark


@pytest.mark.parametrize(
    "text, message",
    [
        ('{"a": NaN}', "not valid JSON for a plan: NaN is not JSON"),
        ('{"a": -Infinity}', "not valid JSON for a plan: -Infinity is not JSON"),
        ('{"a": 1e400}', "the number inf is out of range; a plan holds finite numbers"),
        ('{"a": 1,}', None),
    ],
)
def test_load_json_refuses_non_finite_numbers_and_bad_syntax(tmp_path, text, message):
    path = tmp_path / "p.json"
    path.write_text(text)
    got = refusal(fileio.load_json, path, what="plan")
    if message:
        assert got == f"{path}: {message}"
    else:
        assert got.startswith(f"{path}:1: not JSON (") and got.endswith("a plan is JSON")


def test_iter_lines_cuts_long_lines_in_linear_time(tmp_path):
    path = tmp_path / "log"
    path.write_bytes(b"first\n" + b"\xc3\xa9" * 3_000_000 + b"\nlast\n")
    seen = []
    start = time.monotonic()
    lines = list(fileio.iter_lines(path, what="log", max_line=1001, on_long=lambda n, size: seen.append((n, size))))
    assert time.monotonic() - start < 5
    assert seen == [(2, 6_000_000)]
    assert [n for n, _ in lines] == [1, 2, 3]
    assert lines[1][1] == "\u00e9" * 500  # cut at a character boundary
    assert "a line of 6000000 bytes" in refusal(lambda: list(fileio.iter_lines(path, what="log", max_line=1001)))


def test_iter_lines_strict_and_tolerant(tmp_path):
    path = tmp_path / "log"
    path.write_bytes(b"ok\nbad \xff\n")
    assert (
        refusal(lambda: list(fileio.iter_lines(path, what="NCCL log")))
        == f"{path}:2: not UTF-8 text (byte 0xff at column 5); an NCCL log is UTF-8"
    )
    assert list(fileio.iter_lines(path, what="NCCL log", strict=False)) == [(1, "ok"), (2, "bad \ufffd")]
