"""The contract at the edges (DESIGN.md section 8), checked on every command by walking the
click tree from nccl_tune.cli's table: a command added to the table is covered with no
new test.

For every parameter whose type is a file, a number, a choice or an NCCL setting, the bad
values its type calls for are fed one at a time: missing files and folders for inputs; a
folder, a missing folder, /proc, an unwritable folder and the same file as an input for
outputs; nan, inf, 1e300, 10**30 and (below the declared minimum) -1 and 0 for numbers; a
misspelt choice; an unknown NCCL name and a bad NCCL value. Each must end with exit 2,
exactly one `Error:` line naming the parameter, no traceback, and every input file
byte-for-byte as it was. The parameter's type decides which classes apply, so the types
must say what they are: `test_every_parameter_says_what_it_is` refuses a bare click.Path,
int or float.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import click
import pytest

from nccl_tune import fileio, vocab
from nccl_tune.cli import COMMANDS, cli
from nccl_tune.errors import EXIT_CODES
from nccl_tune.live import envcheck
from nccl_tune.measure import grid

REPO = Path(__file__).resolve().parents[1]
NUMBER_TYPES = (click.types.IntParamType, click.types.FloatParamType)
# Numbers every physical option refuses, whatever its range.
ALWAYS_BAD_NUMBERS = ("nan", "inf", "1e300", str(10**30))
BAD_NCCL = ("NCCL_PROTOO=LL", "NCCL_PROTO=LLL")


def _leaves(command: click.Command, path: tuple[str, ...]):
    if isinstance(command, click.Group):
        for name in command.list_commands(click.Context(command)):
            yield from _leaves(command.get_command(click.Context(command), name), (*path, name))
    else:
        yield path, command


LEAVES = [leaf for name in COMMANDS for leaf in _leaves(cli.get_command(None, name), (name,))]


def _params(command: click.Command) -> list[click.Parameter]:
    return [
        p for p in command.params if not (isinstance(p, click.Option) and (p.is_flag or p.hidden)) and p.name != "help"
    ]


def _label(param: click.Parameter) -> str:
    if isinstance(param, click.Option):
        return max(param.opts, key=len)
    return param.metavar or param.name.upper()


def _words(param: click.Parameter, value: str) -> list[str]:
    return [_label(param), value] if isinstance(param, click.Option) else [value]


# ---------------------------------------------------------------- the bad classes


def _number_cases(kind) -> list[str]:
    bad = list(ALWAYS_BAD_NUMBERS)
    for value in ("-1", "0"):  # bad only below the declared minimum
        low = kind.min
        if low is not None and (float(value) < low or (kind.min_open and float(value) == low)):
            bad.append(value)
    return bad


def _misspelt(choices) -> str:
    word = str(choices[0])
    for candidate in (word + word[-1], word[:-1] + "q", "x" + word):
        if candidate not in choices:
            return candidate
    raise AssertionError(choices)


def _cases(command: click.Command) -> list[tuple[click.Parameter, str, str]]:
    """(param, class name, value template) for every bad class its type calls for; '{d}'
    in a template is the case's scratch folder."""
    out = []
    for param in _params(command):
        kind = param.type
        if isinstance(kind, vocab.InputFile):
            out += [(param, "missing", "{d}/absent.file"), (param, "a folder", "{d}")]
        elif isinstance(kind, vocab.OutputFile):
            out += [
                (param, "a folder", "{d}"),
                (param, "no such folder", "{d}/absent/out.file"),
                (param, "/proc", "/proc/nccl-tune-contract.out"),
                (param, "not writable", "{ro}/out.file"),
            ]
        elif isinstance(kind, (vocab.Finite, vocab.Count)):
            out += [(param, f"number {v}", v) for v in _number_cases(kind)]
        elif isinstance(kind, (vocab.ByteSizes, vocab.CountList)):
            out += [(param, f"list {v}", v) for v in ("nan", "inf", "-1", "0", "1e300", str(10**30))]
        elif isinstance(kind, click.Choice):
            out.append((param, "misspelt choice", _misspelt(list(kind.choices))))
        elif isinstance(kind, (envcheck.Assignments, grid.SetOption)):
            out += [(param, "nccl", v) for v in BAD_NCCL]
        elif isinstance(kind, envcheck.Name):
            out.append((param, "nccl name", "NCCL_PROTOO"))
    return out


CASES = [(path, command, param, what, value) for path, command in LEAVES for param, what, value in _cases(command)]


def _filler(param: click.Parameter, scratch: Path, name: str) -> str:
    """A valid value for a required parameter, from its type alone."""
    kind = param.type
    if isinstance(kind, vocab.InputFile):
        path = scratch / f"{name}.in"
        path.write_text("NCCL_PROTO=LL\n")
        return str(path)
    if isinstance(kind, vocab.OutputFile):
        return str(scratch / f"{name}.out")
    if isinstance(kind, vocab.Count):
        return str(min(max(kind.min or 0, 1), kind.max))
    if isinstance(kind, vocab.Finite):
        return str(((kind.min or 0) + kind.max) / 2)
    if isinstance(kind, click.Choice):
        return str(list(kind.choices)[0])
    return "true"


def _args_for(path, command, overrides: dict[str, str], scratch: Path) -> list[str]:
    """The command with every required parameter filled from its type, `overrides` (param
    name -> value) first."""
    words = list(path)
    for param in _params(command):
        if param.name in overrides:
            words += _words(param, overrides[param.name])
        elif param.required:
            words += _words(param, _filler(param, scratch, param.name))
    return words


APART = []  # (path, command, output param, other param): an output the same file as another
for _path, _command in LEAVES:
    _outs = [p for p in _params(_command) if isinstance(p.type, vocab.OutputFile)]
    _others = [p for p in _params(_command) if isinstance(p.type, vocab.InputFile)] + _outs
    APART += [
        (_path, _command, out, other)
        for out in _outs
        for other in _others
        if other is not out and not (other in _outs and _outs.index(other) > _outs.index(out))
    ]


# ---------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def unwritable(tmp_path_factory):
    """A folder this process cannot write in, as root too (tests/unwritable.py: a read-only
    bind mount or an immutable folder; chmod does not stop root)."""
    from unwritable import unwritable_folder

    with unwritable_folder(tmp_path_factory.mktemp("ro")) as made:
        if made is None:
            pytest.skip("root, and no unwritable folder can be made here")
        yield made[0]


def _digests(folder: Path) -> dict[str, str]:
    return {str(p): hashlib.sha256(p.read_bytes()).hexdigest() for p in folder.rglob("*") if p.is_file()}


def _check_refused(result, param: click.Parameter) -> str:
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output, result.output
    assert isinstance(result.exception, SystemExit), repr(result.exception)
    errors = [line for line in result.output.splitlines() if line.startswith("Error:")]
    assert len(errors) == 1, result.output
    return errors[0]


# ---------------------------------------------------------------- the walk


def _case_id(case) -> str:
    path, _, param, what, value = case
    return f"{' '.join(path)} {_label(param)} {what}"


@pytest.mark.parametrize("case", CASES, ids=[_case_id(c) for c in CASES])
def test_a_bad_value_is_refused_on_one_line(case, cli_runner, tmp_path, request):
    path, command, param, what, template = case
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    (scratch / "kept.jsonl").write_text('{"schema": 1, "cell": "baseline"}\n')
    ro = request.getfixturevalue("unwritable") if "{ro}" in template else None
    value = template.format(d=scratch, ro=ro)
    before = _digests(scratch)
    result = cli_runner.invoke(cli, [*path, *_words(param, value)])
    line = _check_refused(result, param)
    assert _label(param) in line, (line, result.output)
    why = {
        "missing": getattr(param.type, "missing", None),
        "a folder": "is a folder",
        "no such folder": "does not exist",
        "/proc": "is under /proc",
        "not writable": "not writable",
        "nccl": value.split("=")[-1] if value.endswith("LLL") else "NCCL_PROTOO",
        "nccl name": "NCCL_PROTOO",
    }.get(what)
    assert why is None or why in line, (why, line)  # refused for the reason the class tests
    assert _digests(scratch) == before


@pytest.mark.parametrize("case", APART, ids=[f"{' '.join(p)} {_label(o)} = {_label(i)}" for p, _, o, i in APART])
def test_an_output_is_never_the_same_file_as_an_input(case, cli_runner, tmp_path):
    path, command, out_param, other = case
    # a plot keeps a suffix matplotlib writes (fileio's suffix rule): name the shared file so
    shared = tmp_path / (
        "shared.png"
        if vocab.OutputKind.PLOT in (out_param.type.kind, getattr(other.type, "kind", None))
        else "shared.file"
    )
    shared.write_text('{"schema": 1, "cell": "baseline"}\n')
    if isinstance(other.type, vocab.OutputFile):
        shared.unlink()  # two outputs: the file need not exist yet
    before = _digests(tmp_path)
    args = _args_for(path, command, {out_param.name: str(shared), other.name: str(shared)}, tmp_path)
    result = cli_runner.invoke(cli, args)
    line = _check_refused(result, out_param)
    assert "same file" in line and _label(out_param) in line, line
    after = _digests(tmp_path)
    assert {k: v for k, v in after.items() if k in before} == before  # inputs unchanged
    assert not (not before and shared.exists())


# Options that take effect only beside another: the companion, so that the walk reaches the
# option's file (what the command says without it is a usage error, not the file's).
COMPANIONS = {
    ("sweep", "--model"): ["--backend", "sim"],
    ("validate", "--results"): ["--profile", "{good}"],
    ("validate", "--model"): ["--profile", "{good}"],
    ("validate", "--schedule"): ["--engine", "vllm", "--server-args", "--model m"],
}
# What a file an input names may hold, and the reason its reader must give: every input is
# read by the input policy (nccl_tune.fileio) before anything runs, whatever its format.
CONTENTS = {"not UTF-8": b"\xff\xfe\x89PNG\x00 binary\n", "a named pipe no process writes to": None}
READ = [
    (path, command, param, what)
    for path, command in LEAVES
    for param in _params(command)
    if isinstance(param.type, vocab.InputFile)
    for what in CONTENTS
]


@pytest.mark.parametrize("case", READ, ids=[f"{' '.join(p)} {_label(i)} {w}" for p, _, i, w in READ])
def test_every_input_file_is_read_by_the_input_policy_before_anything_runs(case, cli_runner, tmp_path, monkeypatch):
    path, command, param, what = case
    monkeypatch.setattr(fileio, "PIPE_WAIT_S", 0.2)
    bad = tmp_path / "bad.in"
    if CONTENTS[what] is None:
        os.mkfifo(bad)
    else:
        bad.write_bytes(CONTENTS[what])
    good = tmp_path / "good.env"
    good.write_text("NCCL_PROTO=LL\n")
    companions = [w.format(good=good) for w in COMPANIONS.get((path[0], _label(param)), [])]
    args = _args_for(path, command, {param.name: str(bad)}, tmp_path) + companions
    result = cli_runner.invoke(cli, args)
    line = _check_refused(result, param)
    assert str(bad) in line, line
    assert CONTENTS[what] is not None or "no process writes to" in line, line


def test_every_parameter_says_what_it_is():
    """The walk decides from types: a bare path, int or float would escape it."""
    vague = []
    for path, command in LEAVES:
        for param in _params(command):
            kind = param.type
            name = f"{' '.join(path)} {_label(param)}"
            if isinstance(kind, click.Path):
                vague.append(f"{name}: click.Path (use vocab.InputFile or vocab.OutputFile)")
            elif isinstance(kind, NUMBER_TYPES) and not isinstance(kind, (vocab.Finite, vocab.Count)):
                vague.append(f"{name}: {kind!r} (use vocab.Finite or vocab.Count, with a bound)")
            elif isinstance(kind, (vocab.Finite, vocab.Count)) and kind.max is None:
                vague.append(f"{name}: no upper bound")
    assert not vague, "\n".join(vague)


def test_the_walk_covers_every_command_and_option():
    commands = {" ".join(path) for path, _ in LEAVES}
    assert {
        "sweep",
        "recommend",
        "model fit",
        "model predict",
        "logs nccl",
        "profiles convert",
        "validate",
        "bench",
        "exec",
        "check",
    } <= commands
    covered = {(path, _label(param)) for path, _, param, _, _ in CASES}
    # Every typed parameter of every command is fed at least one bad value.
    assert len(covered) >= 90, len(covered)
    assert len(APART) >= 15, len(APART)


# ---------------------------------------------------------------- exit codes and JSON


@pytest.mark.parametrize("page", ["README.md", "docs/reference.md"])
def test_the_pages_state_the_exit_code_table(page):
    text = (REPO / page).read_text()
    section = text[text.index("## Exit codes") :]
    section = section[: section.find("\n## ", 4)]
    rows = [line for line in section.splitlines() if line.startswith("| ") and line[2:3].isdigit()]
    assert sorted(int(row.split("|")[1]) for row in rows) == sorted(EXIT_CODES)


def test_interrupt_exits_130_not_aborted(cli_runner, monkeypatch, tmp_path):
    from nccl_tune.commands import bench

    def interrupted(argv):
        raise KeyboardInterrupt

    monkeypatch.setattr(bench, "stream", interrupted)
    result = cli_runner.invoke(cli, ["bench", "--sizes", "1K", "--nproc", "2"])
    assert result.exit_code == 130, result.output
    assert "Aborted!" not in result.output
    assert result.output.strip().splitlines()[-1] == "Error: interrupted"


def test_emit_json_is_strict(capsys):
    from nccl_tune.cli import emit_json

    emit_json({"a": [1.5, float("nan")], "b": {"c": float("inf")}})
    captured = capsys.readouterr()
    import json

    assert json.loads(captured.out, parse_constant=lambda c: pytest.fail(c)) == {"a": [1.5, None], "b": {"c": None}}
    assert captured.err.strip() == "warning: --json: non-finite number(s) written as null at $.a[1], $.b.c"


def test_bench_takes_its_options_in_any_order(cli_runner):
    result = cli_runner.invoke(cli, ["bench", "--sizes", "1K", "--nproc", "2", "--dry-run"])
    assert result.exit_code == 0, result.output
    assert result.output.strip().endswith("--nproc-per-node=2 --standalone -m microbench.allreduce --sizes 1K")


def test_microbench_refuses_abbreviations(cli_runner):
    result = cli_runner.invoke(cli, ["bench", "--iter", "10", "--dry-run"])
    assert result.exit_code == 2
    assert result.output.strip() == "Error: unrecognized arguments: --iter 10"
