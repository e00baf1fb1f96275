"""Run the console examples of README.md and docs/, compare or regenerate their output.

Why our own collector rather than sybil or pytest-markdown-docs: both run code blocks,
but neither regenerates a page's printed output from a real run, and we need both
directions with one parser: the test fails when a command prints something else than
its page shows, and `python tools/docs_examples.py --write` rewrites the pages from
real runs. It is about 450 lines and has no dependency.

The format, in a page:

    <!-- example: files=tests/fixtures/results/results-gloo.jsonl -->
    ```console
    $ nccl-tune recommend --layers 61 --results results-gloo.jsonl | head -1
    measured: results-gloo.jsonl (backend gloo, world size 2)
    ```

- A ```console block is a sequence of `$ COMMAND` lines (a trailing `\\` continues one),
  each followed by what it prints (stdout and stderr together, as a terminal shows).
- `…` in an expected line matches any run of characters in that line (timings, dates,
  paths); a line that is only `…` matches any number of lines. `--write` keeps an
  expected line that still matches, so the placeholders survive regeneration.
- What differs between machines or runs whatever the page says is normalised on both
  sides before comparing: site-packages and interpreter paths, the working folder,
  timestamps and run ids (MACHINE_PATTERNS).
- `--write` writes the working folder as `~` (it is the examples' HOME, and a temporary
  path means nothing to a reader), and the checkout's folder and this machine's host
  name as `…` (a shipped profile is printed with its absolute path, simulated records
  and reports name the host; a page written here must match in any checkout on CI's
  machine).
- The HTML comment before a block sets its options: `files=A,B` copies those paths of
  the checkout into the working folder first (a path outside the checkout, such as the
  workplace's published tables in `../shared/fixtures/real`, which the project may not
  copy in, skips the block where it is absent, as the tests that read them skip);
  `cwd=repo` runs in the checkout instead (for `python bench/...`); `vary=numbers` compares every number (signed or not) as "a
  number" (a measurement on this machine: the words, columns and line count are still
  checked); `vary=spacing` compares runs of blanks as one blank and runs of dashes as
  one `--` (a table whose column widths follow a placeholder's text, such as pids;
  `vary=numbers` implies it, since a measured figure's width moves the columns too);
  `elide=H,T` keeps the first H and last T lines of a long output with a `…` line
  between; `skip=REASON` does not run it (a real output from a machine CI does not
  have: the reason says which); `slow` marks a block the fast suite skips.
- Every page runs its blocks in order in one fresh working folder (holding links to the
  checkout's tests/, examples/, profiles/, bench/ and tools/), with `nccl-tune`
  (and `python`) on PATH running this checkout, NCCL_* cleared, HOME in the folder,
  TZ=UTC and COLUMNS=120, each command through `bash -c` (the examples are shell).
- A page is one shell session, as a reader's terminal: what a command exports (`$ export
  VLLM_CPU_KVCACHE_SPACE=1`) holds for the page's later commands (the variables are
  saved when each command ends and read before the next).
- No process may outlive its page: each command runs in a session of its own, and a
  process still running in one when the page ends (a server started with `&` and not
  stopped by a later command) fails the page and is killed. A background process must
  send its output to a file (`> server.log 2>&1 &`): the command's output ends only
  when every process holding it has exited.
- `--times` prints each block's wall time, to choose the blocks to mark `slow`.
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
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
        page = self.page.relative_to(REPO) if self.page.is_relative_to(REPO) else self.page
        return f"{page}:{self.line}"


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
            indent = lines[i][: len(lines[i]) - len(lines[i].lstrip())]  # a block in a list item
            block = Block(page=page, line=i + 1, end=i + 1, options=options, indent=indent)
            i += 1
            while i < len(lines) and lines[i].strip() != FENCE:
                line = lines[i][len(indent) :] if lines[i].startswith(indent) else lines[i]
                if line.startswith("$ "):
                    text = line[2:]
                    while text.endswith("\\") and i + 1 < len(lines):
                        i += 1
                        text = text + "\n" + lines[i][len(indent) :]  # `\\` + newline: one line
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
    (WORKDIR_RE := re.compile(r"[^\s'\"(]*/nccl-tune-docs-[^/\s]+/work"), "~"),  # also HOME
    (re.compile(r"[^\s'\"(]*/bin/python3(?:\.\d+)?\b"), "<python>"),
    (re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d+)?(?:Z|[+-]\d\d:?\d\d)?"), "<time>"),
    (re.compile(r"\b\d{8}T\d{6}-[0-9a-f]+\b"), "<run-id>"),  # a pid or a random hex tail
    (re.compile(r"\bETA \d+ s\b"), "ETA <s>"),  # a sweep's progress lines
]
# A measured delta changes sign from run to run, so the sign belongs to the number.
NUMBER_RE = re.compile(r"[+-]?\d+(?:\.\d+)?(?:e[+-]?\d+)?")
BLANKS_RE = re.compile(r"\s+")
DASHES_RE = re.compile(r"-{2,}")
VARY = ("numbers", "spacing")


def vary_modes(vary: str | bool) -> tuple[bool, bool]:
    """(numbers, spacing) for a block's `vary=` value (True: numbers, as `vary=numbers`)."""
    numbers = vary is True or vary == "numbers"
    return numbers, numbers or vary == "spacing"


def normalise(line: str, vary: str | bool = False) -> str:
    """A line as compared: machine-specific parts replaced; numbers and spacing with `vary`."""
    numbers, spacing = vary_modes(vary)
    line = line.rstrip()
    for pattern, replacement in MACHINE_PATTERNS:
        line = pattern.sub(replacement, line)
    if numbers:
        line = NUMBER_RE.sub("#", line)
    if spacing:  # a table's columns move with the width of what varies in them
        line = DASHES_RE.sub("--", BLANKS_RE.sub(" ", line))
    return line


def line_matches(expected: str, actual: str, vary: str | bool = False) -> bool:
    """An expected line with `…` placeholders against one actual line."""
    expected, actual = normalise(expected, vary), normalise(actual, vary)
    if WILDCARD not in expected:
        return expected == actual
    pattern = ".*?".join(re.escape(part) for part in expected.split(WILDCARD))
    return re.fullmatch(pattern, actual) is not None


def output_matches(expected: list[str], actual: list[str], vary: str | bool = False) -> bool:
    """Expected lines (with `…` lines matching any number of lines) against the output."""

    def match(e: int, a: int) -> bool:
        if e == len(expected):
            return a == len(actual)
        if expected[e].strip() == WILDCARD:
            return any(match(e + 1, k) for k in range(a, len(actual) + 1))
        return a < len(actual) and line_matches(expected[e], actual[a], vary) and match(e + 1, a + 1)

    return match(0, 0)


def host_pattern(host: str | None = None) -> re.Pattern[str] | None:
    """This machine's host name as a word, or None when it is too short to be told from
    other words."""
    host = socket.gethostname() if host is None else host
    return re.compile(rf"(?<![\w.-]){re.escape(host)}(?![\w-])") if len(host) >= 2 else None


def merge(expected: list[str], actual: list[str], vary: str | bool = False) -> list[str]:
    """The page's lines where they match the output, line by line, else the output's.

    A `…` line stays, standing for the output up to the lines the page shows after it: a
    placeholder at the end stands for the rest, the lines after the last placeholder are
    the output's last lines, and the lines between two placeholders are found where the
    output holds them all in a row (else where their first one is). So a page that shows
    the head, the tail or a middle part of an output keeps that shape when regenerated.
    """
    lines: list[str] = []
    a = 0
    for i, e in enumerate(expected):
        if e.strip() == WILDCARD:
            lines.append(e)
            rest = expected[i + 1 :]
            segment = rest[: next((j for j, x in enumerate(rest) if x.strip() == WILDCARD), len(rest))]
            if not rest:
                return lines
            if len(segment) == len(rest):  # the last placeholder: what follows is the tail
                a = max(a, len(actual) - len(segment))
                continue

            def fits(k: int, lines_: list[str] = segment) -> bool:
                return k + len(lines_) <= len(actual) and all(
                    line_matches(x, actual[k + j], vary) for j, x in enumerate(lines_)
                )

            a = next(
                (k for k in range(a, len(actual)) if fits(k)),
                next((k for k in range(a, len(actual)) if fits(k, segment[:1])), a),
            )
        elif a < len(actual):
            lines.append(e if line_matches(e, actual[a], vary) else actual[a])
            a += 1
    return lines + actual[a:]


def regenerate(
    expected: list[str],
    actual: list[str],
    vary: str | bool = False,
    elide: tuple[int, int] | None = None,
    host: str | None = None,
) -> list[str]:
    """The lines to write: the page's own where they still match (placeholders kept),
    else the real output with this machine's host name as `…`, cut to its first and last
    lines with `elide`; the working folder as `~`, the checkout's as `…`."""
    if output_matches(expected, actual, vary):
        return expected
    actual = [WORKDIR_RE.sub("~", line).replace(str(REPO), WILDCARD) for line in actual]
    if (pattern := host_pattern(host)) is not None:
        actual = [pattern.sub(WILDCARD, line) for line in actual]
    lines = merge(expected, actual, vary)
    if elide and len(lines) > sum(elide) + 1:
        head, tail = elide
        lines = lines[:head] + [WILDCARD] + (lines[-tail:] if tail else [])
    return lines


def example_env(workdir: Path, bindir: Path) -> dict[str, str]:
    """The environment every example runs in: this checkout first, no NCCL_*."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("NCCL_", "TORCH_NCCL_"))}
    env.update(
        PATH=f"{bindir}{os.pathsep}{env.get('PATH', '')}",
        HOME=str(workdir),
        TZ="UTC",
        COLUMNS="120",
        PYTHONPATH=str(REPO),
    )
    return env


def make_bin(bindir: Path) -> None:
    """`nccl-tune` and `python` shims that run this interpreter on this checkout."""
    bindir.mkdir(parents=True, exist_ok=True)
    for name, args in (("nccl-tune", "-m nccl_tune"), ("python", "")):
        shim = bindir / name
        shim.write_text(f'#!/bin/sh\nexec "{sys.executable}" {args} "$@"\n')
        shim.chmod(0o755)


def shell_script(command: str, state: Path) -> str:
    """A command as bash runs it: the page's exported variables read first, and saved
    again when it ends (whatever way it ends), for the page's next command."""
    return (
        f"_docs_state={shlex.quote(str(state))}\n"
        '[ -f "$_docs_state" ] && . "$_docs_state"\n'
        'trap \'export -p | grep -Ev "^declare -x (PWD|OLDPWD|SHLVL|_)=" > "$_docs_state"\' EXIT\n'
        f"{command}\n"
    )


def session_processes(sessions: set[int]) -> dict[int, str]:
    """The live processes (pid -> command line) of these session ids, from /proc."""
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            fields = stat[stat.rindex(")") + 2 :].split()  # after "pid (comm) "
            if fields[0] == "Z" or int(fields[3]) not in sessions:
                continue
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except (OSError, ValueError, IndexError):
            continue  # gone meanwhile, or not ours to read
        found[int(entry.name)] = cmdline.strip()
    return found


LEFTOVER_GRACE_S = 10.0  # how long a page's last `kill` has to take effect


def stop_leftovers(sessions: set[int], grace_s: float | None = None) -> list[str]:
    """Wait up to `grace_s` for the processes of these sessions to end (a `kill` in the
    page's last command takes a moment), then kill the rest; one line for each."""
    deadline = time.monotonic() + (LEFTOVER_GRACE_S if grace_s is None else grace_s)
    while (left := session_processes(sessions)) and time.monotonic() < deadline:
        time.sleep(0.2)
    for pid in left:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    return [f"pid {pid}: {cmdline}" for pid, cmdline in sorted(left.items())]


def run_command(text: str, cwd: Path, env: dict[str, str], state: Path, sessions: set[int]) -> list[str]:
    """Run one command in a session of its own (recorded in `sessions`); its output lines."""
    proc = subprocess.Popen(
        ["bash", "--norc", "--noprofile", "-c", shell_script(text, state)],
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    sessions.add(proc.pid)
    try:
        out, _ = proc.communicate(timeout=COMMAND_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        out += f"\n(killed after {COMMAND_TIMEOUT_S} s)"
    text = out[:-1] if out.endswith("\n") else out
    return text.split("\n") if text else []


def absent_files(block: Block) -> list[str]:
    """The block's `files=` outside the checkout that are not here (the block is skipped)."""
    return [
        rel
        for rel in filter(None, block.options.get("files", "").split(","))
        if not (REPO / rel).resolve().is_relative_to(REPO) and not (REPO / rel).exists()
    ]


def run_block(
    block: Block, workdir: Path, bindir: Path, state: Path | None = None, sessions: set[int] | None = None
) -> list[list[str]]:
    """Run every command of a block; the output lines of each."""
    for rel in filter(None, block.options.get("files", "").split(",")):
        src = REPO / rel
        dst = workdir / src.name
        (shutil.copytree if src.is_dir() else shutil.copy)(src, dst)
    cwd = REPO if block.options.get("cwd") == "repo" else workdir
    state = workdir.parent / "state.sh" if state is None else state
    sessions = set() if sessions is None else sessions
    env = example_env(workdir, bindir)
    return [run_command(command.text, cwd, env, state, sessions) for command in block.commands]


def run_page(
    page: Path,
    *,
    include_slow: bool,
    write: bool,
    times: list[tuple[Block, float]] | None = None,
    skipped: list[tuple[Block, str]] | None = None,
) -> list[tuple[Block, int, list[str]]]:
    """Run a page's blocks in one fresh folder; the (block, command, actual) that differ.

    With `write`, the page is rewritten from the real outputs (placeholders kept). A
    process left running when the page ends is a failure of its last block, listed in
    place of an output. `times` receives each block's wall time, `skipped` each block
    not run for an absent file outside the checkout, with the reason.
    """
    failures = []
    lines = page.read_text(encoding="utf-8").split("\n")
    sessions: set[int] = set()
    with tempfile.TemporaryDirectory(prefix="nccl-tune-docs-") as tmp:
        workdir, bindir = Path(tmp) / "work", Path(tmp) / "bin"
        workdir.mkdir()
        for name in LINKED:  # `tests/fixtures/...`, `python bench/x.py` read as in a checkout
            (workdir / name).symlink_to(REPO / name)
        make_bin(bindir)
        replacements = []
        last = None
        try:
            for block in parse_page(page):
                if not block.commands or "skip" in block.options or ("slow" in block.options and not include_slow):
                    continue
                if absent := absent_files(block):
                    if skipped is not None:
                        skipped.append((block, f"absent here: {', '.join(absent)}"))
                    continue
                start = time.monotonic()
                outputs = run_block(block, workdir, bindir, Path(tmp) / "state.sh", sessions)
                if times is not None:
                    times.append((block, time.monotonic() - start))
                last = block
                vary = block.options.get("vary", "")
                elide = tuple(int(n) for n in block.options["elide"].split(",")) if "elide" in block.options else None
                new_body = []
                for n, (command, actual) in enumerate(zip(block.commands, outputs)):
                    if not output_matches(command.expected, actual, vary):
                        failures.append((block, n, actual))
                    first, *more = command.text.split("\n")
                    new_body += ["$ " + first, *more, *regenerate(command.expected, actual, vary, elide)]
                replacements.append(
                    (block.line, block.end, [block.indent + line if line else line for line in new_body])
                )
        finally:
            left = stop_leftovers(sessions)
        if left and last is not None:
            failures.append(
                (last, len(last.commands) - 1, ["(the page left these processes running; they were killed)", *left])
            )
    if write and failures:
        for start, end, body in reversed(replacements):
            lines[start : end - 1] = body
        page.write_text("\n".join(lines), encoding="utf-8")
    return failures


def main(argv: list[str] | None = None) -> int:
    """`python tools/docs_examples.py [--write] [--slow] [PAGE...]`: check or regenerate."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0], allow_abbrev=False)
    parser.add_argument("pages", nargs="*", type=Path)
    parser.add_argument("--write", action="store_true", help="rewrite pages from real runs")
    parser.add_argument("--slow", action="store_true", help="run the blocks marked slow too")
    parser.add_argument("--times", action="store_true", help="print each block's wall time")
    args = parser.parse_args(argv)
    bad = 0
    for page in [p.resolve() for p in args.pages] or pages():
        times: list[tuple[Block, float]] = []
        skipped: list[tuple[Block, str]] = []
        failures = run_page(page, include_slow=args.slow, write=args.write, times=times, skipped=skipped)
        for block, reason in skipped:
            print(f"{block.name}: not run ({reason})")
        if args.times:
            for block, seconds in times:
                print(f"{seconds:7.1f} s  {block.name}" + ("  (slow)" if "slow" in block.options else ""))
        for block, n, actual in failures:
            bad += 1
            print(f"{block.name}: `$ {block.commands[n].text}` printed:\n  " + "\n  ".join(actual))
    print(f"{bad} example(s) differ" + (" (pages rewritten)" if args.write and bad else ""))
    return 1 if bad and not args.write else 0


if __name__ == "__main__":
    sys.exit(main())
