"""Run the console examples of README.md and docs/, compare or regenerate their output.

Why our own collector rather than sybil or pytest-markdown-docs: both run code blocks,
but neither regenerates a page's printed output from a real run, and we need both
directions with one parser: the test fails when a command prints something else than
its page shows, and `python tools/docs_examples.py --write` rewrites the pages from
real runs. It is about 200 lines and has no dependency.

The format, in a page:

    <!-- example: files=examples/data/sweep-grid.toml -->
    ```console
    $ nccl-tune sweep --backend sim --grid sweep-grid.toml --out r.jsonl
    # sweep run …
    ```

- A ```console block is a sequence of `$ COMMAND` lines (a trailing `\\` continues one),
  each followed by what it prints (stdout and stderr together, as a terminal shows).
- `…` in an expected line matches any run of characters in that line (timings, dates,
  paths); a line that is only `…` matches any number of lines. `--write` keeps an
  expected line that still matches, so the placeholders survive regeneration.
- What differs between machines or runs whatever the page says is normalised on both
  sides before comparing: site-packages and interpreter paths, the working folder,
  timestamps and run ids (MACHINE_PATTERNS).
- The HTML comment before a block sets its options: `files=A,B` copies those paths of
  the checkout into the working folder first; `cwd=repo` runs in the checkout instead
  (for `python bench/...`); `vary=numbers` compares every number as "a number" (a
  measurement on this machine: the words, columns and line count are still checked);
  `elide=H,T` keeps the first H and last T lines of a long output with a `…` line
  between; `skip=REASON` does not run it (a real output from a machine CI does not
  have: the reason says which); `slow` marks a block the fast suite skips.
- Every page runs its blocks in order in one fresh working folder (holding links to the
  checkout's tests/, examples/, profiles/, bench/ and tools/), with `nccl-tune`
  (and `python`) on PATH running this checkout, NCCL_* cleared, HOME in the folder,
  TZ=UTC and COLUMNS=120, each command through `bash -c` (the examples are shell).
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
WILDCARD = "…"
OPTIONS_RE = re.compile(r"^<!--\s*example:\s*(.*?)\s*-->\s*$")
FENCE = "```"
COMMAND_TIMEOUT_S = 600
LINKED = ("tests", "examples", "profiles", "bench", "tools")  # checkout folders the examples read


@dataclass
class Command:
    """One `$` line of a block and the output the page shows for it."""

    text: str
    expected: list[str]


@dataclass
class Block:
    """One ```console block: where it is, its options and its commands."""

    page: Path
    line: int  # 1-based line of the opening fence
    end: int  # 1-based line of the closing fence
    options: dict[str, str] = field(default_factory=dict)
    indent: str = ""  # the fence's indentation, taken off every line and put back on write
    commands: list[Command] = field(default_factory=list)

    @property
    def name(self) -> str:
        """`page:line`, as a test id."""
        return f"{self.page.relative_to(REPO)}:{self.line}"


def pages() -> list[Path]:
    """README.md and every page under docs/, in a stable order."""
    return [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]


def parse_options(text: str) -> dict[str, str]:
    """`files=a,b cwd=repo slow skip=needs 8 GPUs` -> a dict (skip takes the rest)."""
    options: dict[str, str] = {}
    rest = text
    if "skip=" in rest:
        rest, reason = rest.split("skip=", 1)
        options["skip"] = reason.strip()
    for word in rest.split():
        key, _, value = word.partition("=")
        options[key] = value
    return options


def parse_page(page: Path) -> list[Block]:
    """The console blocks of one markdown page."""
    lines = page.read_text(encoding="utf-8").split("\n")
    blocks: list[Block] = []
    i = 0
    while i < len(lines):
        if lines[i].strip() == FENCE + "console":
            options = {}
            if i > 0 and (m := OPTIONS_RE.match(lines[i - 1].strip())):
                options = parse_options(m.group(1))
            indent = lines[i][:len(lines[i]) - len(lines[i].lstrip())]  # a block in a list item
            block = Block(page=page, line=i + 1, end=i + 1, options=options, indent=indent)
            i += 1
            while i < len(lines) and lines[i].strip() != FENCE:
                line = lines[i][len(indent):] if lines[i].startswith(indent) else lines[i]
                if line.startswith("$ "):
                    text = line[2:]
                    while text.endswith("\\") and i + 1 < len(lines):
                        i += 1
                        text = text + "\n" + lines[i][len(indent):]  # `\\` + newline: one line
                    block.commands.append(Command(text=text, expected=[]))
                elif block.commands:
                    block.commands[-1].expected.append(line)
                i += 1
            block.end = i + 1
            blocks.append(block)
        i += 1
    return blocks


# What differs between two machines (or two runs) of the same command: normalised on both
# sides, so a page can show this machine's real output.
MACHINE_PATTERNS = [
    (re.compile(r"[^\s'\"(]*/site-packages/"), "<site-packages>/"),
    (re.compile(r"/tmp/nccl-tune-docs-[^/\s]+/work"), "<work>"),
    (re.compile(r"[^\s'\"(]*/bin/python3(?:\.\d+)?\b"), "<python>"),
    (re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d+)?(?:Z|[+-]\d\d:?\d\d)?"), "<time>"),
    (re.compile(r"\b\d{8}T\d{6}-\d+\b"), "<run-id>"),
    (re.compile(r"\bETA \d+ s\b"), "ETA <s>"),  # a sweep's progress lines
]
NUMBER_RE = re.compile(r"\d+(?:\.\d+)?(?:e[+-]?\d+)?")


def normalise(line: str, vary_numbers: bool = False) -> str:
    """A line as compared: machine-specific parts replaced, numbers too with `vary`."""
    line = line.rstrip()
    for pattern, replacement in MACHINE_PATTERNS:
        line = pattern.sub(replacement, line)
    return NUMBER_RE.sub("#", line) if vary_numbers else line


def line_matches(expected: str, actual: str, vary: bool = False) -> bool:
    """An expected line with `…` placeholders against one actual line."""
    expected, actual = normalise(expected, vary), normalise(actual, vary)
    if WILDCARD not in expected:
        return expected == actual
    pattern = ".*?".join(re.escape(part) for part in expected.split(WILDCARD))
    return re.fullmatch(pattern, actual) is not None


def output_matches(expected: list[str], actual: list[str], vary: bool = False) -> bool:
    """Expected lines (with `…` lines matching any number of lines) against the output."""
    def match(e: int, a: int) -> bool:
        if e == len(expected):
            return a == len(actual)
        if expected[e].strip() == WILDCARD:
            return any(match(e + 1, k) for k in range(a, len(actual) + 1))
        return (a < len(actual) and line_matches(expected[e], actual[a], vary)
                and match(e + 1, a + 1))
    return match(0, 0)


def regenerate(expected: list[str], actual: list[str], vary: bool = False,
               elide: tuple[int, int] | None = None) -> list[str]:
    """The lines to write: the page's own where they still match (placeholders kept),
    else the real output, cut to its first and last lines with `elide`."""
    if output_matches(expected, actual, vary):
        return expected
    lines = [e if i < len(expected) and line_matches(e, a, vary) else a
             for i, (e, a) in enumerate(zip(expected + [""] * len(actual), actual))]
    if elide and len(lines) > sum(elide) + 1:
        head, tail = elide
        lines = lines[:head] + [WILDCARD] + (lines[-tail:] if tail else [])
    return lines


def example_env(workdir: Path, bindir: Path) -> dict[str, str]:
    """The environment every example runs in: this checkout first, no NCCL_*."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("NCCL_", "TORCH_NCCL_"))}
    env.update(PATH=f"{bindir}{os.pathsep}{env.get('PATH', '')}", HOME=str(workdir), TZ="UTC",
               COLUMNS="120", PYTHONPATH=str(REPO))
    return env


def make_bin(bindir: Path) -> None:
    """`nccl-tune` and `python` shims that run this interpreter on this checkout."""
    bindir.mkdir(parents=True, exist_ok=True)
    for name, args in (("nccl-tune", "-m nccl_tune"), ("python", "")):
        shim = bindir / name
        shim.write_text(f'#!/bin/sh\nexec "{sys.executable}" {args} "$@"\n')
        shim.chmod(0o755)


def run_block(block: Block, workdir: Path, bindir: Path) -> list[list[str]]:
    """Run every command of a block; the output lines of each."""
    for rel in filter(None, block.options.get("files", "").split(",")):
        src = REPO / rel
        dst = workdir / src.name
        (shutil.copytree if src.is_dir() else shutil.copy)(src, dst)
    cwd = REPO if block.options.get("cwd") == "repo" else workdir
    outputs = []
    for command in block.commands:
        proc = subprocess.run(["bash", "--norc", "--noprofile", "-c", command.text], cwd=cwd,
                              env=example_env(workdir, bindir), stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True, timeout=COMMAND_TIMEOUT_S)
        text = proc.stdout[:-1] if proc.stdout.endswith("\n") else proc.stdout
        outputs.append(text.split("\n") if text else [])
    return outputs


def run_page(page: Path, *, include_slow: bool, write: bool) -> list[tuple[Block, int, list[str]]]:
    """Run a page's blocks in one fresh folder; the (block, command, actual) that differ.

    With `write`, the page is rewritten from the real outputs (placeholders kept).
    """
    failures = []
    lines = page.read_text(encoding="utf-8").split("\n")
    with tempfile.TemporaryDirectory(prefix="nccl-tune-docs-") as tmp:
        workdir, bindir = Path(tmp) / "work", Path(tmp) / "bin"
        workdir.mkdir()
        for name in LINKED:  # `tests/fixtures/...`, `python bench/x.py` read as in a checkout
            (workdir / name).symlink_to(REPO / name)
        make_bin(bindir)
        replacements = []
        for block in parse_page(page):
            if not block.commands or "skip" in block.options or (
                    "slow" in block.options and not include_slow):
                continue
            outputs = run_block(block, workdir, bindir)
            vary = block.options.get("vary") == "numbers"
            elide = (tuple(int(n) for n in block.options["elide"].split(","))
                     if "elide" in block.options else None)
            new_body = []
            for n, (command, actual) in enumerate(zip(block.commands, outputs)):
                if not output_matches(command.expected, actual, vary):
                    failures.append((block, n, actual))
                first, *more = command.text.split("\n")
                new_body += ["$ " + first, *more,
                             *regenerate(command.expected, actual, vary, elide)]
            replacements.append((block.line, block.end,
                                 [block.indent + line if line else line for line in new_body]))
    if write and failures:
        for start, end, body in reversed(replacements):
            lines[start:end - 1] = body
        page.write_text("\n".join(lines), encoding="utf-8")
    return failures


def main(argv: list[str] | None = None) -> int:
    """`python tools/docs_examples.py [--write] [--slow] [PAGE...]`: check or regenerate."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0], allow_abbrev=False)
    parser.add_argument("pages", nargs="*", type=Path)
    parser.add_argument("--write", action="store_true", help="rewrite pages from real runs")
    parser.add_argument("--slow", action="store_true", help="run the blocks marked slow too")
    args = parser.parse_args(argv)
    bad = 0
    for page in [p.resolve() for p in args.pages] or pages():
        for block, n, actual in run_page(page, include_slow=args.slow, write=args.write):
            bad += 1
            print(f"{block.name}: `$ {block.commands[n].text}` printed:\n  " + "\n  ".join(actual))
    print(f"{bad} example(s) differ" + (" (pages rewritten)" if args.write and bad else ""))
    return 1 if bad and not args.write else 0


if __name__ == "__main__":
    sys.exit(main())
