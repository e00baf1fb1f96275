"""The option vocabulary: one click type for each kind of value a command takes, shared by
every command, so that a value is refused the same way (one `Error:` line naming the
option, exit 2) wherever it is given, before anything runs.

- numbers: `Finite` (a float that is never NaN or infinity) and `Count` (an integer);
  both carry an upper bound, because every number the tool takes is physical (layers,
  ranks, tokens, bytes, seconds) and a value past the bound is a typo, not a machine;
- byte sizes and counts given as comma lists: `ByteSizes`, `CountList`;
- files: `InputFile` (must exist, not a folder) and `OutputFile` (checked by the output
  policy, nccl_tune.fileio); the CLI group refuses an output that is the same file as any
  input (`check_apart`, called for every command);
- where a record comes from: `Provenance`, derived from a record in one function
  (`provenance_of`), from which trust words, "effective" columns and export headers
  follow.

The types say what they are (input or output file, bounded number), so the test that
walks the command tree (tests/test_cli_contract.py) knows which bad values to feed each
option without a list per command. NCCL variable names and values are the `live`
layer's part of the vocabulary (nccl_tune.live.envcheck): they need the catalogue and
the installed libnccl. Root module: imports only nccl_tune.fileio and nccl_tune.errors.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Callable
from enum import Enum
from typing import Any

import click

from nccl_tune import fileio
from nccl_tune.errors import NcclTuneError

# ---------------------------------------------------------------- physical bounds
# Each bound is far above any real value and far below what breaks arithmetic.

# Layers: the deepest published LLMs have about 126 (Llama 3.1 405B); 1024 is 8x that.
MAX_LAYERS = 1024
# Ranks (TP size, world, processes per node, nodes): one NVLink domain is at most 72 GPUs
# (GB200 NVL72) and NCCL's tests run to a few thousand ranks; 4096 covers them all.
MAX_RANKS = 4096
# Tokens per forward (batch, decode tokens): 2^20 is more than any server's KV cache holds
# in one decode step.
MAX_TOKENS = 1 << 20
# Hidden size: the widest published models are about 18k-25k (PaLM 540B 18432); 2^18 is 10x.
MAX_HIDDEN = 1 << 18
# Bytes of one message: 256 GiB is more than one GPU's memory (B200: 192 GB); the tool's
# target is 1 KB - 1 MB.
MAX_BYTES = 1 << 38
# Iterations, warm-ups and runs: 10^7 of even a 10 us collective is 100 s per size.
MAX_ITERS = 10_000_000
# Seconds of a timeout or a gap: a week; a longer wait is a hang, not a timeout.
MAX_SECONDS = 7 * 24 * 3600.0
# Milliseconds of one step (decode, draft, verify): an hour per step is no server.
MAX_MS = 3_600_000.0
# Decode throughput per sequence: the fastest published figures are a few thousand tok/s.
MAX_TOK_S = 1e6
# Collectives per layer or per forward outside the layers: a layer has 2, MoE a few more.
MAX_COLLECTIVES = 1024
# Routed experts of a MoE model: the largest have 256 (DeepSeek-V3); 2^16 is 256x.
MAX_EXPERTS = 1 << 16
# A process id: Linux's PID_MAX_LIMIT (2^22, include/linux/threads.h).
MAX_PID = 1 << 22
# A random seed: numpy's legacy seed range (32 bits).
MAX_SEED = (1 << 32) - 1
# A measurement budget (cells x sizes x rounds at full iterations).
MAX_BUDGET = 1e9

_SIZE_RE = re.compile(r"^(\d{1,20})\s*([kKmMgG]?)[bB]?$")
_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30}


# ---------------------------------------------------------------- numbers


class Finite(click.FloatRange):
    """A float that is finite (NaN and infinity refused) and lies in [min, max].

    `max` is required: every number the tool takes is physical (see the bounds above).
    """

    name = "number"

    def __init__(self, min: float | None = None, *, max: float, min_open: bool = False, max_open: bool = False):
        super().__init__(min=min, max=max, min_open=min_open, max_open=max_open)

    def convert(self, value: Any, param, ctx) -> float:
        number = click.FLOAT.convert(value, param, ctx)
        if not math.isfinite(number):
            self.fail(f"{value!r} is not a finite number.", param, ctx)
        return super().convert(number, param, ctx)


class Count(click.IntRange):
    """An integer in [min, max]; `max` is required (a physical bound)."""

    name = "integer"

    def __init__(self, min: int | None = None, *, max: int):
        super().__init__(min=min, max=max)


def parse_size(text: str, option: str = "--sizes") -> int:
    """'14336' -> 14336, '64K' -> 65536, '1M' -> 1048576 (K = 1024, as nccl-tests), in
    [1, MAX_BYTES]; NcclTuneError naming `option` otherwise."""
    match = _SIZE_RE.match(text.strip())
    if not match:
        raise NcclTuneError(f"{option}: '{text}' is not a size (bytes, or a number with K, M or G)")
    value = int(match.group(1)) * _UNITS[match.group(2).lower()]
    if value <= 0:
        raise NcclTuneError(f"{option}: '{text}' must be at least 1 byte")
    check_bytes(value, option)
    return value


def check_bytes(value: int, what: str = "size") -> int:
    """`value` when it is a message size the tool can mean, else NcclTuneError."""
    if value > MAX_BYTES:
        raise NcclTuneError(f"{what}: {value} bytes is more than one GPU holds (at most {MAX_BYTES} = 256 GiB)")
    return value


def _items(text: str, option: str, noun: str) -> list[str]:
    items = [s.strip() for s in text.split(",")]
    if not text.strip() or any(not s for s in items):
        raise NcclTuneError(f"{option}: expected a comma list of {noun}, got '{text}'")
    return items


def parse_sizes(text: str, option: str = "--sizes") -> list[int]:
    """'1K,14336,64K' -> sizes in bytes (each as `parse_size`)."""
    return [parse_size(item, option) for item in _items(text, option, "sizes (8K,16K,...)")]


def parse_counts(text: str, option: str, maximum: int, noun: str = "positive integers") -> list[int]:
    """'1,2,4' -> integers in [1, maximum]; NcclTuneError naming `option` otherwise."""
    out = []
    for item in _items(text, option, noun):
        if not item.isdigit() or not item.strip("0"):
            raise NcclTuneError(f"{option}: '{item[:30]}' is not a positive integer")
        if len(item) > 20 or int(item) > maximum:  # the length first: int() of 5000 digits raises
            raise NcclTuneError(f"{option}: {item[:30]}{'...' if len(item) > 30 else ''} is more than {maximum}")
        out.append(int(item))
    return out


class _Checked(click.ParamType):
    """A string option checked by a parser that raises NcclTuneError; the value stays the
    text given (the command parses it as before), so swapping the type changes no body."""

    def parse(self, text: str, option: str):  # pragma: no cover - abstract
        raise NotImplementedError

    def convert(self, value: Any, param, ctx) -> str:
        option = _option_name(param)
        try:
            self.parse(str(value), option)
        except NcclTuneError as exc:
            self.fail(str(exc).removeprefix(f"{option}: "), param, ctx)
        return value


class ByteSizes(_Checked):
    """A comma list of message sizes (bytes, or K/M/G; K = 1024), each in [1, MAX_BYTES]."""

    name = "sizes"

    def parse(self, text: str, option: str) -> list[int]:
        return parse_sizes(text, option)


class CountList(_Checked):
    """A comma list of positive integers, each at most `maximum` (tokens, steps)."""

    name = "counts"

    def __init__(self, maximum: int):
        self.maximum = maximum

    def parse(self, text: str, option: str) -> list[int]:
        return parse_counts(text, option, self.maximum)


# ---------------------------------------------------------------- files


def _option_name(param) -> str:
    if param is None:
        return "value"
    if isinstance(param, click.Option) and param.opts:
        return max(param.opts, key=len)
    return (param.human_readable_name or param.name or "value").upper()


class InputFile(click.ParamType):
    """A file the command reads: it must exist, be readable and not be a folder.

    `names`: a predicate for values that name something other than a path (a shipped
    profile, a built-in grid); such a value passes when no file of that name exists, and
    `missing` says what was looked for when neither exists.
    """

    name = "file"

    def __init__(self, names: Callable[[str], bool] | None = None, missing: str = "no such file"):
        self.names = names
        self.missing = missing

    def convert(self, value: Any, param, ctx) -> str:
        path = os.path.expanduser(str(value))
        if os.path.isdir(path):
            self.fail(f"{value}: is a folder, not a file.", param, ctx)
        if not os.path.exists(path):
            if self.names is not None and self.names(str(value)):
                return value
            self.fail(f"{value}: {self.missing}.", param, ctx)
        if not os.access(path, os.R_OK):
            self.fail(f"{value}: cannot read (permission denied).", param, ctx)
        return value


OutputKind = fileio.OutputKind  # RESULTS (appended), EXPORT (replaced atomically), PLOT, TEXT


class OutputFile(click.ParamType):
    """A file the command writes, of one `OutputKind`: checked by the output policy
    (nccl_tune.fileio.check_output: not a folder, not under /proc or /sys, a folder that
    exists and this process can write, a results file that is results and that no other
    process is writing) when the option is parsed, before anything runs. The value is the
    path really written (a plot gets fileio's suffix rule)."""

    name = "file"

    def __init__(self, kind: OutputKind = OutputKind.TEXT):
        self.kind = OutputKind(kind)

    def convert(self, value: Any, param, ctx) -> str:
        option = _option_name(param)
        try:
            return str(fileio.check_output(value, kind=self.kind, option=option))
        except NcclTuneError as exc:
            self.fail(str(exc).removeprefix(f"{option} "), param, ctx)


def _files(ctx: click.Context, kind: type) -> list[tuple[click.Parameter, str]]:
    """(parameter, path) of every value of `ctx`'s parameters whose type is `kind`."""
    found = []
    for param in ctx.command.params:
        if not isinstance(param.type, kind):
            continue
        value = ctx.params.get(param.name)
        values = value if isinstance(value, (tuple, list)) else [value]
        found += [(param, str(v)) for v in values if v not in (None, "")]
    return found


def check_apart(ctx: click.Context) -> None:
    """NcclTuneError (exit 2) for an output that is the same file as any input of the
    command (resolved path, or device and inode: links are caught), or as another output
    (fileio.check_outputs): called by the CLI group for every command after its options
    are parsed and before it runs."""
    inputs = [path for _, path in _files(ctx, InputFile) if os.path.exists(os.path.expanduser(path))]
    outputs = [(_option_name(param), path, param.type.kind) for param, path in _files(ctx, OutputFile)]
    if outputs:
        fileio.check_outputs(outputs, inputs=inputs)


# ---------------------------------------------------------------- provenance


class Provenance(str, Enum):
    """Where a figure comes from: the one field every output's trust words follow."""

    NCCL = "measured with NCCL"
    GLOO = "measured on gloo"
    SIMULATED = "simulated"
    MODELLED = "modelled"
    IMPORTED = "imported"

    @property
    def observes_nccl(self) -> bool:
        """True when NCCL ran, so its log can confirm (or contradict) the settings."""
        return self in (Provenance.NCCL, Provenance.IMPORTED)

    @property
    def measured(self) -> bool:
        """True when something ran on hardware (NCCL, gloo or nccl-tests)."""
        return self in (Provenance.NCCL, Provenance.GLOO, Provenance.IMPORTED)

    def trust(self, confirmed: bool | None) -> str:
        """The trust word of a cell: confirmed / contradicted / declared where NCCL ran
        (its log showed the settings, showed others, or was not seen), else the
        provenance itself: nothing simulated, modelled or on gloo is 'declared'."""
        if not self.observes_nccl:
            return self.value
        return "confirmed" if confirmed is True else "contradicted" if confirmed is False else "declared"


def provenance_of(record: dict) -> Provenance:
    """The provenance of one results record, from its `backend` (and `source`): the one
    place this is decided."""
    backend = record.get("backend")
    if backend == "sim" or record.get("source") == "simulated":
        return Provenance.SIMULATED
    if backend == "gloo":
        return Provenance.GLOO
    if backend == "nccl":
        return Provenance.NCCL
    if record.get("source") == "modelled":
        return Provenance.MODELLED
    return Provenance.IMPORTED  # nccl-tests output, or any tool this one did not run
