"""Every console example in README.md and docs/ runs, and prints what its page shows.

The collector is tools/docs_examples.py (its docstring gives the page format); regenerate
the pages with `python tools/docs_examples.py --write` after a change to what a command
prints.
"""

from __future__ import annotations

import sys
from pathlib import Path


sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))
import docs_examples as dx  # noqa: E402

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
    page.write_text("text\n<!-- example: files=a.txt,b cwd=repo skip=needs eight GPUs -->\n"
                    "```console\n$ nccl-tune x \\\n  --y 1\nout 1\n$ echo hi\nhi\n```\n")
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
