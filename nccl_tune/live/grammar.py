"""The profile grammar: the one definition of what a `.env` profile may say, for every
reader and writer (lint, exec, check, profiles, recommend's exports, validate, the
sweep's cells, logs nccl, conf files).

A profile is sourced by launch scripts (`set -a; . f.env`), given to `docker run
--env-file` and systemd `EnvironmentFile=`, copied into NCCL conf files and applied by
`nccl-tune exec`. The grammar is the subset of text that all of them read the same way,
literally, and that runs nothing in bash. Anything outside it is refused with the line
and the reason; nothing is ever quoted, escaped or trimmed into shape.

Lines (split at `\\n` only; numbers count `\\n`, as editors do):

- blank: empty, or spaces and tabs only;
- comment: `#` in the first column, then printable text (`str.isprintable`, plus tab),
  not ending in a backslash (systemd before v254 joins the next line to such a comment,
  src/basic/env-file.c COMMENT_ESCAPE);
- assignment: `NAME=VALUE` from the first column, optionally `export NAME=VALUE`
  (read, never written; lint warns: docker refuses the file, systemd drops the line).

Names: `[A-Za-z_][A-Za-z0-9_]*`, at most MAX_NAME characters, and on the allow-list
`ALLOWED` (NCCL_* plus the few others this tool has reason to set, each with its
reason and source). Every other name (LD_PRELOAD, PATH, BASH_ENV, ...) is refused, and
so are the NCCL variables that load a shared library (`CODE_LOADING`): they take over a
process as LD_PRELOAD does. `--allow-unknown` (sweep) may admit an NCCL_* name the
installed libnccl does not know; nothing admits a name this grammar refuses.

Values: the characters of VALUE_CHARS only (letters, digits and `_ . , : ^ % / + - =`:
NCCL's lists, `^` exclusions, `=` exact matches, `:` ports and per-collective
prefixes, `%h`/`%p` in NCCL_DEBUG_FILE, paths), at most MAX_VALUE characters. None of
them means anything to bash in an assignment, docker keeps every byte after the first
`=`, systemd keeps an unquoted, unescaped value as written, and NCCL's conf reader
keeps everything after `=`. Refused, each with its reason: quotes, `$`, backticks,
`;`, `&`, `|`, `<`, `>`, `~`, blanks, `\\`, `#`, control characters (CR included: a
CRLF file is refused, since bash keeps the CR in the value), NUL, non-ASCII. `;`
also means that NCCL's per-collective lists with more than one section
(`^LL128;allreduce:LL`) cannot be a profile value: one section (`allreduce:LL`) can;
for more, NCCL's tuner-plugin CSV (`recommend --tuner-csv`) chooses per collective.

Caps, checked before any per-line work so that a huge input is refused in
milliseconds: MAX_FILE_BYTES, MAX_LINES, MAX_LINE_BYTES (NCCL >= 2.30 reads conf-file
lines with fgets into 4096 bytes, so a longer line would be read as two),
MAX_VARIABLES. Messages never echo more than a short prefix of a refused value.
"""

from __future__ import annotations

import re
import string
from dataclasses import dataclass

from nccl_tune.errors import NcclTuneError

MAX_FILE_BYTES = 256 * 1024
MAX_LINES = 4096
MAX_LINE_BYTES = 4094  # fgets(line, 4096): the line and its '\n' in one read
MAX_NAME = 128  # libnccl 2.32.3's longest name has 57 characters
MAX_VALUE = 1023  # NCCL's conf reader cuts values at 1023 (src/misc/param.cc setEnvFile)
MAX_VARIABLES = 256  # libnccl 2.32.3 reads 395 names; a profile sets a handful

VALUE_CHARS = frozenset(string.ascii_letters + string.digits + "_.,:^%/+-=")
NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_EXPORT_RE = re.compile(r"export[ \t]+")
_BLANKS = " \t"

BLANK, COMMENT, ASSIGN, BAD = "blank", "comment", "assign", "malformed"


@dataclass(frozen=True)
class Allowed:
    """One allow-list entry: an exact name, or a prefix written `PREFIX*`.

    `values`: a regular expression the whole value must match when the program reading
    the variable takes only a fixed set (a bad one crashes it or is silently ignored).
    """

    pattern: str
    reason: str
    source: str
    values: str | None = None

    def matches(self, name: str) -> bool:
        """True when `name` is this entry's name (or has its prefix, and more after it)."""
        if self.pattern.endswith("*"):
            prefix = self.pattern[:-1]
            return name.startswith(prefix) and len(name) > len(prefix)
        return name == self.pattern


_VLLM_ENVS = "vllm/envs.py (vLLM 0.32.0)"
_SGLANG = "SGLang main @0003215"
_SGLANG_0523 = "SGLang 0.5.23"
_BOOL01 = r"[01]"

# The names a profile may set besides NCCL_*: what the engines read to choose their
# allreduce path (so a profile can send decode allreduces through NCCL, which is what
# its NCCL settings tune) and torch's NCCL process-group settings. Not here, on purpose:
# CUDA_DEVICE_MAX_CONNECTIONS (neither torch 2.13 nor vLLM 0.32 reads it and this tool
# never sets it), library paths such as VLLM_NCCL_SO_PATH / SGLANG_NCCL_SO_PATH (they
# load code), and every other engine switch (not an allreduce path).
ALLOWED: tuple[Allowed, ...] = (
    Allowed(
        "NCCL_*",
        "NCCL's own settings: what this tool measures, exports and checks",
        "NCCL documentation, Environment Variables; lint checks each name against the installed libnccl",
    ),
    Allowed(
        "TORCH_NCCL_*",
        "torch's ProcessGroupNCCL settings around every collective (timing "
        "events, trace buffer, blocking wait); the microbench records them beside NCCL_*",
        "torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp (torch 2.13)",
    ),
    Allowed(
        "VLLM_ALLREDUCE_USE_*",
        "vLLM's allreduce paths tried before NCCL (torch symmetric "
        "memory, FlashInfer, FlashInfer PCIe IPC); read as bool(int(value))",
        f"{_VLLM_ENVS}: VLLM_ALLREDUCE_USE_SYMM_MEM, _FLASHINFER, _FLASHINFER_PCIE_IPC; "
        "vllm/distributed/device_communicators/cuda_communicator.py",
        _BOOL01,
    ),
    Allowed(
        "VLLM_USE_NCCL_SYMM_MEM",
        "vLLM's NCCL symmetric-memory allreduce (registered buffers); read as bool(int(value))",
        f"{_VLLM_ENVS}; vllm/distributed/device_communicators/pynccl_allocator.py",
        _BOOL01,
    ),
    Allowed(
        "VLLM_FLASHINFER_ALLREDUCE_BACKEND",
        "which FlashInfer fused allreduce vLLM runs",
        f"{_VLLM_ENVS} (choices auto, trtllm, mnnvl)",
        r"auto|trtllm|mnnvl",
    ),
    Allowed(
        "VLLM_DISABLE_PYNCCL",
        "torch.distributed instead of vLLM's pynccl for NCCL "
        "collectives (true/1 disables; anything else is silently false)",
        f"{_VLLM_ENVS}; vllm/distributed/device_communicators/pynccl.py",
        r"(?i:true|false)|[01]",
    ),
    Allowed(
        "VLLM_SKIP_P2P_CHECK",
        "'1' trusts the driver's P2P report, which decides whether "
        "vLLM's custom allreduce (not NCCL) is used on PCIe pairs",
        f"{_VLLM_ENVS}; vllm/distributed/device_communicators/custom_all_reduce.py _can_p2p",
        _BOOL01,
    ),
    Allowed(
        "SGLANG_SKIP_P2P_CHECK",
        "'1' trusts the driver's P2P report, which decides whether SGLang's custom allreduce (not NCCL) is used",
        f"{_SGLANG} python/sglang/srt/distributed/device_communicators/"
        "custom_all_reduce_utils.py _can_p2p (os.getenv(...) == '1')",
        _BOOL01,
    ),
    Allowed(
        "SGLANG_OPT_USE_CUSTOM_ALL_REDUCE_V2",
        "SGLang's custom allreduce v2 (a JIT kernel) instead of v1",
        f"{_SGLANG} python/sglang/srt/environ.py (EnvBool)",
        r"(?i:true|false|yes|no|y|n)|[01]",
    ),
    Allowed(
        "SGLANG_CUSTOM_ALL_REDUCE_V2_MAX_SIZE_KB",
        "the workspace of SGLang's custom allreduce v2, which bounds the sizes it takes away from NCCL",
        f"{_SGLANG} python/sglang/srt/environ.py (EnvInt)",
        r"[0-9]+",
    ),
    Allowed(
        "SGLANG_ENABLE_PCIE_IPC_ALLREDUCE",
        "SGLang's FlashInfer PCIe-IPC allreduce (opt-in, off by default) for PCIe-only GPUs: on, "
        "bf16 decode allreduces at TP 2/4/8 leave NCCL",
        f"{_SGLANG_0523} python/sglang/srt/environ.py (EnvBool(False)); "
        "srt/distributed/device_communicators/pcie_ipc_ar.py eligible_group",
        r"(?i:true|false|yes|no|y|n)|[01]",
    ),
    Allowed(
        "SGLANG_PCIE_IPC_MAX_NUMEL",
        "the elements bound of SGLang's PCIe-IPC allreduce (0: the decode width), which bounds the sizes it "
        "takes away from NCCL",
        f"{_SGLANG_0523} python/sglang/srt/environ.py (EnvInt(0)); "
        "srt/distributed/device_communicators/pcie_ipc_ar.py _ensure_workspace",
        r"[0-9]+",
    ),
)

# NCCL variables that make NCCL dlopen a library: a profile setting one runs that
# library's code in every rank, as LD_PRELOAD would. Every NCCL_*_PLUGIN (net, tuner,
# profiler, env, gin, rma in libnccl 2.32.3) is one, and NCCL_IBVERBS_LIB.
CODE_LOADING = frozenset({"NCCL_IBVERBS_LIB"})


def loads_code(name: str) -> bool:
    """True for an NCCL variable that names a library NCCL loads."""
    return name in CODE_LOADING or (name.startswith("NCCL_") and name.endswith("_PLUGIN"))


@dataclass(frozen=True)
class Line:
    """One line of a profile, classified; `errors` says why a malformed line is refused."""

    number: int  # 1-based
    raw: str
    kind: str  # BLANK | COMMENT | ASSIGN | BAD
    key: str | None = None
    value: str | None = None
    exported: bool = False  # written as `export NAME=VALUE`
    errors: tuple[str, ...] = ()

    @property
    def error(self) -> str | None:
        """The first reason the line is refused (None when it is not)."""
        return self.errors[0] if self.errors else None


def shown(text: str, limit: int = 40) -> str:
    """`text` quoted for a message, control characters escaped, cut at `limit`."""
    cut = text if len(text) <= limit else text[:limit]
    body = repr(cut)
    return body if cut is text else body + f"... ({len(text)} characters)"


def allowed_entry(name: str) -> Allowed | None:
    """The allow-list entry covering `name`, or None."""
    return next((entry for entry in ALLOWED if entry.matches(name)), None)


def name_problem(name: str) -> str | None:
    """Why a profile may not set `name` (None when it may)."""
    if not name:
        return "missing name before '='"
    if len(name) > MAX_NAME:
        return f"a name of {len(name)} characters (at most {MAX_NAME})"
    if name.startswith("\ufeff"):
        return (
            "a byte-order mark (U+FEFF) before the name: bash would read it as part of "
            "the name; save the file without BOM"
        )
    if not NAME_RE.fullmatch(name):
        return f"{shown(name)} is not a variable name (ASCII letters, digits and '_', not starting with a digit)"
    if loads_code(name):
        return (
            f"{name} makes NCCL load a shared library into every process, as LD_PRELOAD "
            "does: a profile may not set it (set it yourself in the environment that "
            "runs the server or `nccl-tune exec`, without --clean)"
        )
    if allowed_entry(name) is None:
        hint = (
            f"; NCCL reads names case-sensitively: did you mean {name.upper()}?" if allowed_entry(name.upper()) else ""
        )
        return (
            f"{name} is not an NCCL variable nor on the profile allow-list (NCCL_*, "
            "TORCH_NCCL_* and vLLM's and SGLang's allreduce switches: "
            f"nccl_tune.live.grammar.ALLOWED){hint}"
        )
    return None


# Why a character is refused in a value, by what bash (or another reader) would do.
_RUNS = "bash would run a command"
_WHY = {
    "$": "'$' starts a variable or command substitution in bash",
    "`": "a backtick is command substitution: " + _RUNS,
    ";": (
        "';' ends the assignment in bash and runs the rest as a command; an NCCL "
        "per-collective list with several sections cannot be a profile value: keep one "
        "section (NCCL_PROTO=allreduce:LL) or use a tuner-plugin CSV "
        "(recommend --tuner-csv), which chooses per collective and size"
    ),
    "&": "'&' ends the assignment in bash and runs the rest as a command",
    "|": "'|' ends the assignment in bash and pipes into a command",
    "<": "'<' redirects input in bash",
    ">": "'>' redirects output in bash (creating files)",
    "'": (
        "a quote: bash and systemd remove quotes, docker keeps them, and quotes can hide "
        "'$(...)' or ';' between them; write the value without quotes"
    ),
    '"': (
        "a quote: bash and systemd remove quotes, docker keeps them, and quotes can hide "
        "'$(...)' or ';' between them; write the value without quotes"
    ),
    "\\": ("a backslash: bash and systemd drop it (and join the next line when it ends one), docker keeps it"),
    "#": "'#' starts a comment after a blank and is refused in values so no reader disagrees",
    "~": "bash expands '~' to a home folder in an assignment",
    " ": (
        "a blank: bash ends the assignment there and runs the rest as a command; docker "
        "keeps it, systemd trims it (an inline '# comment' belongs on its own line)"
    ),
    "\t": ("a tab: bash ends the assignment there and runs the rest as a command; docker keeps it, systemd trims it"),
    "\r": (
        "a carriage return (a Windows line ending?): bash keeps it in the value, systemd "
        "ends the line there; save the file with LF line endings"
    ),
    "\x00": "a NUL byte: no reader keeps it",
}


def _char_problem(ch: str) -> str:
    if ch in _WHY:
        return _WHY[ch]
    if ord(ch) < 32 or ord(ch) == 127:
        return f"a control character (U+{ord(ch):04X}): readers split, drop or keep it differently"
    if ord(ch) > 127:
        return f"a non-ASCII character (U+{ord(ch):04X})"
    return f"{ch!r} is outside the profile's characters (letters, digits, _ . , : ^ % / + - =)"


def value_problem(value: str) -> str | None:
    """Why `value` cannot be a profile value (None when it can); never echoes a long one."""
    if len(value) > MAX_VALUE:
        return f"a value of {len(value)} characters (at most {MAX_VALUE}, the longest NCCL reads from a conf file)"
    for ch in value:
        if ch not in VALUE_CHARS:
            return f"value {shown(value)} holds {_char_problem(ch)}"
    return None


def comment_problem(text: str) -> str | None:
    """Why `text` cannot be a comment line (None when it can); `text` starts with '#'."""
    for ch in text:
        if ch != "\t" and not ch.isprintable():
            what = _WHY.get(ch) or f"a non-printable character (U+{ord(ch):04X})"
            return f"comment holds {what}"
    if text.endswith("\\"):
        return "a comment ending in a backslash: systemd before v254 reads the next line as part of the comment"
    return None


def _line_bytes(raw: str) -> int:
    return len(raw.encode("utf-8", "surrogatepass"))


_TOO_LONG = "NCCL reads conf-file lines 4095 bytes at a time, so a longer one would be read as two"
_LEADING_BLANK = (
    "a blank at the start of the line: NCCL's conf reader would keep it in the "
    "name; start names and comments in the first column"
)


def parse_line(number: int, raw: str) -> Line:
    """Classify one line (without its '\\n'); never raises."""
    if len(raw) > MAX_LINE_BYTES or _line_bytes(raw) > MAX_LINE_BYTES:
        why = f"a line of {_line_bytes(raw)} bytes (at most {MAX_LINE_BYTES}: {_TOO_LONG})"
        return Line(number, raw, BAD, errors=(why,))
    if raw.strip(_BLANKS) == "":
        return Line(number, raw, BLANK)
    if raw.startswith("#"):
        problem = comment_problem(raw)
        return Line(number, raw, BAD, errors=(problem,)) if problem else Line(number, raw, COMMENT)
    if raw[0] in _BLANKS:
        return Line(number, raw, BAD, errors=(_LEADING_BLANK,))
    match = _EXPORT_RE.match(raw)
    body = raw[match.end() :] if match else raw
    if "=" not in body:
        return Line(number, raw, BAD, errors=("expected NAME=VALUE (or a '#' comment)",))
    name, value = body.split("=", 1)
    if name != name.rstrip(_BLANKS):
        return Line(
            number,
            raw,
            BAD,
            key=name.strip(_BLANKS) or None,
            errors=("a blank before '=': bash would run the name as a command",),
        )
    errors = []
    problem = name_problem(name)
    if problem:
        errors.append(problem)
    if value[:1] in (" ", "\t"):
        errors.append("a blank after '=': bash would set an empty value and run the rest as a command")
    else:
        problem = value_problem(value)
        if problem:
            errors.append(problem)
    if errors:
        return Line(number, raw, BAD, key=name, errors=tuple(errors), exported=bool(match))
    return Line(number, raw, ASSIGN, key=name, value=value, exported=bool(match))


def split_lines(text: str) -> list[str]:
    """`text` cut at `\\n` only (nothing else is a line end here; a CR stays in its line)."""
    pieces = text.split("\n")
    if pieces and pieces[-1] == "":
        pieces.pop()
    return pieces


def check_size(text: str, path: str | None = None) -> None:
    """NcclTuneError when `text` is over the file or line-count caps (cheap: run first)."""
    where = path or "<text>"
    if len(text) > MAX_FILE_BYTES or _line_bytes(text) > MAX_FILE_BYTES:
        raise NcclTuneError(f"larger than {MAX_FILE_BYTES // 1024} KiB: not a profile", path=where)
    count = text.count("\n") + (0 if text.endswith("\n") or not text else 1)
    if count > MAX_LINES:
        raise NcclTuneError(f"{count} lines (a profile has at most {MAX_LINES})", path=where)


def parse_lines(text: str, path: str | None = None) -> list[Line]:
    """Every line of `text`, classified (for lint, which reports every problem).

    NcclTuneError when the text is over the file or line caps; the variable cap is a
    line error (the first assignment past MAX_VARIABLES).
    """
    check_size(text, path)
    out, assigned = [], 0
    for number, raw in enumerate(split_lines(text), start=1):
        line = parse_line(number, raw)
        if line.kind == ASSIGN:
            assigned += 1
            if assigned > MAX_VARIABLES:
                line = Line(
                    number, raw, BAD, key=line.key, errors=(f"more than {MAX_VARIABLES} variables: not a profile",)
                )
        out.append(line)
    return out


def first_error(lines: list[Line], path: str | None = None) -> NcclTuneError | None:
    """The error for the first malformed line (path and line set), or None."""
    for line in lines:
        if line.kind == BAD:
            return NcclTuneError(f"malformed line: {line.error}", path=path or "<text>", line=line.number)
    return None


def assignments(text: str, path: str | None = None) -> list[tuple[str, str]]:
    """The (name, value) assignments of `text` in file order, duplicates kept;
    NcclTuneError naming the first line the grammar refuses."""
    lines = parse_lines(text, path)
    error = first_error(lines, path)
    if error:
        raise error
    return [(line.key, line.value) for line in lines if line.kind == ASSIGN]


def env_problems(env: dict[str, str]) -> list[tuple[str, str]]:
    """(name, why) for every variable of `env` a profile could not carry."""
    out = []
    if len(env) > MAX_VARIABLES:
        out.append(("", f"{len(env)} variables (a profile has at most {MAX_VARIABLES})"))
    for name, value in env.items():
        problem = name_problem(str(name)) if isinstance(name, str) else "a name that is not text"
        if problem is None:
            problem = value_problem(value) if isinstance(value, str) else "a value that is not text"
        if problem:
            out.append((str(name), problem))
    return out


def check_env(env: dict[str, str], source: str) -> None:
    """NcclTuneError naming `source` and the first variable of `env` the grammar refuses.

    For environments that did not come from a profile file: sweep cells, results records
    about to be exported, `--env` options, the variables `exec` is about to apply.
    """
    problems = env_problems(env)
    if problems:
        name, why = problems[0]
        more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
        named = name and not why.startswith(f"{name} ")
        raise NcclTuneError(f"{source}: {name + ': ' if named else ''}{why}{more}")


def value_pattern_problem(name: str, value: str) -> str | None:
    """Why an allow-listed non-NCCL variable's reader would not take `value` (or None)."""
    entry = allowed_entry(name)
    if entry is None or entry.values is None or re.fullmatch(entry.values, value):
        return None
    return f"{shown(value)} is not a value its reader takes ({entry.values}; {entry.source})"


def render_assignment(name: str, value: str) -> str:
    """`NAME=VALUE`, or NcclTuneError when the grammar refuses either (never escaped)."""
    problem = name_problem(name) or value_problem(value)
    if problem:
        raise NcclTuneError(f"cannot write {name if NAME_RE.fullmatch(name) else shown(name)}: {problem}")
    return f"{name}={value}"


def render_comment(text: str) -> str:
    """`# text` (or `#` for empty text), or NcclTuneError when it would not read back as one
    comment line in every reader."""
    line = f"# {text}".rstrip(" ") if text else "#"
    problem = comment_problem(line)
    if problem is None and _line_bytes(line) > MAX_LINE_BYTES:
        problem = f"a comment line of {_line_bytes(line)} bytes (at most {MAX_LINE_BYTES})"
    if problem:
        raise NcclTuneError(f"cannot write the comment {shown(text)}: {problem}")
    return line
