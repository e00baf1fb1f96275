"""Every console example in README.md and docs/ runs, and prints what its page shows.

The collector is tools/docs_examples.py (its docstring gives the page format); regenerate
the pages with `python tools/docs_examples.py --write` after a change to what a command
prints.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))
import docs_examples as dx

PAGES = [p for p in dx.pages() if dx.parse_page(p)]


def _ids(pages):
    return [str(p.relative_to(dx.REPO)) for p in pages]


def _report(failures) -> str:
    return "\n".join(
        f"{b.name}: `$ {b.commands[n].text}` printed:\n  " + "\n  ".join(actual) for b, n, actual in failures
    )


# The pages: every block not marked slow, each page in one fresh folder (the blocks of a
# page depend on each other, as a reader's terminal session does).
@pytest.mark.parametrize("page", PAGES, ids=_ids(PAGES))
def test_page_examples_print_what_the_page_shows(page):
    failures = dx.run_page(page, include_slow=False, write=False)
    assert not failures, _report(failures)


SLOW_PAGES = [p for p in PAGES if any("slow" in b.options for b in dx.parse_page(p))]


@pytest.mark.slow
@pytest.mark.parametrize("page", SLOW_PAGES, ids=_ids(SLOW_PAGES))
def test_slow_page_examples_print_what_the_page_shows(page):
    failures = dx.run_page(page, include_slow=True, write=False)
    assert not failures, _report(failures)


def test_every_skipped_example_says_why():
    for page in dx.pages():
        for block in dx.parse_page(page):
            if "skip" in block.options:
                assert len(block.options["skip"]) > 10, f"{block.name}: skip needs a reason"


# The matcher, on hand-made cases.
def test_placeholder_matches_within_a_line_only():
    assert dx.line_matches("p50 … us", "p50 12.3 us")
    assert not dx.line_matches("p50 … us", "p50 12.3 ms")
    assert not dx.line_matches("exact", "exact but longer")
    assert dx.line_matches("trailing spaces   ", "trailing spaces")


def test_a_placeholder_line_matches_any_number_of_lines():
    assert dx.output_matches(["head", "…", "tail"], ["head", "tail"])
    assert dx.output_matches(["head", "…", "tail"], ["head", "a", "b", "tail"])
    assert not dx.output_matches(["head", "…", "tail"], ["head", "a", "b"])
    assert not dx.output_matches(["a"], ["a", "b"])


def test_regeneration_keeps_matching_placeholders_and_replaces_the_rest():
    expected = ["run …", "value 1", "gone"]
    actual = ["run 2026-12-01", "value 2"]
    assert dx.regenerate(expected, actual) == ["run …", "value 2"]
    assert dx.regenerate(["x …"], ["x 1"]) == ["x …"]


def test_parse_page_reads_commands_continuations_outputs_and_options(tmp_path):
    page = tmp_path / "p.md"
    page.write_text(
        "text\n<!-- example: files=a.txt,b cwd=repo skip=needs eight GPUs -->\n"
        "```console\n$ nccl-tune x \\\n  --y 1\nout 1\n$ echo hi\nhi\n```\n"
    )
    [block] = dx.parse_page(page)
    assert block.options == {"files": "a.txt,b", "cwd": "repo", "skip": "needs eight GPUs"}
    assert [c.text for c in block.commands] == ["nccl-tune x \\\n  --y 1", "echo hi"]
    assert [c.expected for c in block.commands] == [["out 1"], ["hi"]]
    assert (block.line, block.end) == (3, 9)


def test_machine_specific_parts_are_normalised_on_both_sides():
    here = "/root/.pyenv/versions/3.11.7/lib/python3.11/site-packages/nvidia/nccl/lib/libnccl.so.2"
    there = "/home/u/.venv/lib/python3.12/site-packages/nvidia/nccl/lib/libnccl.so.2"
    assert dx.line_matches(f"libnccl {here}", f"libnccl {there}")
    assert not dx.line_matches(f"libnccl {here}", f"libnccl {there}.1")
    assert dx.line_matches("when: exported 2026-11-29T10:32:28Z", "when: exported 2027-01-02T03:04:05Z")
    assert dx.line_matches("run 20261201T101648-887781", "run 20270101T000000-12")


def test_vary_numbers_checks_words_not_figures():
    assert dx.line_matches("p50 12.5 us over 100 iters", "p50 9.75 us over 200 iters", vary=True)
    assert not dx.line_matches("p50 12.5 us", "p50 12.5 ms", vary=True)
    assert not dx.line_matches("p50 12.5 us", "p50 13.5 us")


def test_elide_keeps_head_and_tail_of_a_long_output():
    actual = [f"line {i}" for i in range(10)]
    assert dx.regenerate([], actual, elide=(2, 1)) == ["line 0", "line 1", "…", "line 9"]
    assert dx.output_matches(["line 0", "line 1", "…", "line 9"], actual)
    assert dx.regenerate([], actual[:3], elide=(2, 1)) == actual[:3]  # too short to cut


def test_a_block_inside_a_list_item_is_read_and_written_back_indented(tmp_path):
    page = tmp_path / "p.md"
    page.write_text("- item:\n\n  ```console\n  $ echo one \\\n    two\n  one two\n  ```\n")
    [block] = dx.parse_page(page)
    assert block.indent == "  " and [c.text for c in block.commands] == ["echo one \\\n  two"]
    assert block.commands[0].expected == ["one two"]


def test_vary_numbers_takes_the_sign_with_the_number():
    # a measured saving is negative in one run and positive in the next
    assert dx.line_matches("saved -1.269 ms", "saved +0.805 ms", vary="numbers")
    assert not dx.line_matches("saved -1.269 ms", "saved +0.805 us", vary="numbers")


def test_vary_spacing_lets_columns_move_but_checks_every_word():
    page = ["  pid    ppid  role", "-----  ------  ------", "…  -       python3 x.py  ok"]
    here = ["    pid     ppid  role", "-------  -------  ------", "1234567  1234566  -  python3 x.py  ok"]
    assert dx.output_matches(page, here, vary="spacing")
    assert not dx.output_matches(page, here)  # without it, the widths must agree
    assert not dx.line_matches("exit 1", "exit 2", vary="spacing")  # figures stay exact
    assert not dx.line_matches("--topology pcie", "--topology nvlink", vary="spacing")
    assert dx.vary_modes("numbers") == (True, True) and dx.vary_modes("spacing") == (False, True)
    assert dx.vary_modes("") == (False, False)


def test_a_run_id_with_a_hex_tail_is_normalised():
    assert dx.line_matches(
        "# microbench.allreduce  run 20261201T101648-887781", "# microbench.allreduce  run 20261202T000102-aeed46"
    )


def test_write_shows_the_working_folder_as_home_and_the_checkout_and_host_as_placeholders():
    work = "/tmp/nccl-tune-docs-ab12cd/work"
    actual = [
        f"  {work}/.nccl.conf (user): absent",
        f"profile ({dx.REPO}/profiles/p.env)",
        "# where: world size 8, host box7, backend sim",
        "mybox7 box7.local",
    ]
    assert dx.regenerate([], actual, host="box7") == [
        "  ~/.nccl.conf (user): absent",
        "profile (…/profiles/p.env)",
        "# where: world size 8, host …, backend sim",
        "mybox7 ….local",
    ]
    assert dx.regenerate([], ["host x"], host="x") == ["host x"]  # too short to tell from words
    # what was written matches the next run on another machine, in another folder
    assert dx.output_matches(
        ["  ~/.nccl.conf (user): absent"], ["  /var/tmp/nccl-tune-docs-zz/work/.nccl.conf (user): absent"]
    )


def test_regeneration_keeps_placeholder_lines_where_the_page_put_them():
    table = ["heading", "row 1", "row 2"]
    # a trailing placeholder stands for the rest of the output
    assert dx.regenerate(["heading", "row 9", "…"], table + ["more", "and more"]) == ["heading", "row 1", "…"]
    # a placeholder before the tail: the tail is found again after the output grew
    assert dx.regenerate(["start", "…", "row 2"], ["start", "a", "b", "row 1", "row 2"]) == ["start", "…", "row 2"]
    # ... and when the tail itself changed, the page's last lines are the output's last
    assert dx.regenerate(["start", "…", "best 0.377", "results"], ["start", "a", "b", "best 0.747", "results"]) == [
        "start",
        "…",
        "best 0.747",
        "results",
    ]
    # lines between two placeholders are found where the output holds them all in a row
    assert dx.regenerate(["h", "…", "m1", "m2", "…", "t9"], ["h", "a", "m1", "b", "m1", "m2", "c", "t"]) == [
        "h",
        "…",
        "m1",
        "m2",
        "…",
        "t",
    ]


def _page(tmp_path, body: str) -> Path:
    page = tmp_path / "p.md"
    page.write_text(body)
    return page


def test_a_page_is_one_shell_session(tmp_path):
    page = _page(
        tmp_path,
        "```console\n$ export GREETING=hello\n```\n\n"
        '```console\n$ echo "$GREETING from the next block"\n'
        "hello from the next block\n```\n",
    )
    assert dx.run_page(page, include_slow=False, write=False) == []


def test_a_process_left_running_fails_the_page_and_is_killed(tmp_path, monkeypatch):
    monkeypatch.setattr(dx, "LEFTOVER_GRACE_S", 0.5)
    marker = f"docs-leftover-{os.getpid()}"
    page = _page(
        tmp_path,
        f"```console\n$ bash -c 'exec -a {marker} sleep 60' > /dev/null 2>&1 &\n$ echo started\nstarted\n```\n",
    )
    [(block, n, lines)] = dx.run_page(page, include_slow=False, write=False)
    assert n == 1 and lines[0] == "(the page left these processes running; they were killed)"
    assert len(lines) == 2 and marker in lines[1]
    assert not any(marker in cmd for cmd in dx.session_processes(_all_sessions()).values())


def _all_sessions() -> set[int]:
    """Every session id on this machine, from /proc."""
    found = set()
    for entry in Path("/proc").iterdir():
        try:
            stat = (entry / "stat").read_text()
            found.add(int(stat[stat.rindex(")") + 2 :].split()[3]))
        except (OSError, ValueError, IndexError):
            continue
    return found


def test_a_block_whose_files_outside_the_checkout_are_absent_is_skipped_with_the_reason(tmp_path):
    page = _page(
        tmp_path, "<!-- example: files=../no-such-shared/table.txt -->\n```console\n$ cat table.txt\nwhatever\n```\n"
    )
    skipped = []
    assert dx.run_page(page, include_slow=False, write=False, skipped=skipped) == []
    [(block, reason)] = skipped
    assert reason == "absent here: ../no-such-shared/table.txt"


def test_the_script_reports_block_times_and_differences(tmp_path):
    page = _page(tmp_path, "```console\n$ echo one\ntwo\n```\n")
    done = subprocess.run(
        [sys.executable, str(dx.REPO / "tools" / "docs_examples.py"), "--times", str(page)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 1
    lines = done.stdout.splitlines()
    assert lines[0].endswith(f"s  {page}:1") and lines[1:] == [
        f"{page}:1: `$ echo one` printed:",
        "  one",
        "1 example(s) differ",
    ]
