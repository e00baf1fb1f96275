"""Profiles: `.env` files of NCCL settings with a provenance header.

The format (DESIGN.md section 3) is the common subset of bash `set -a; . f.env`,
`docker run --env-file`, systemd `EnvironmentFile=` and `nccl-tune exec`:

    # nccl-tune profile
    # source: measured
    # gpus: 8x NVIDIA RTX PRO 6000 (PCIe)
    NCCL_PROTO=LL
    NCCL_ALGO=Ring

`KEY=VALUE` lines, `#` comments and blank lines; `export KEY=VALUE` is accepted on
read. Reading never evaluates anything: no expansion, no substitution. A value in
matching quotes is read without them (as bash and systemd do); the linter warns,
since docker keeps quotes literally. Writing refuses values that need quoting and
replaces the file atomically.

Provenance is the leading block of `# key: value` comment lines.
"""

from __future__ import annotations

import os
import re
import tempfile
from dataclasses import dataclass, field

from nccl_tune.errors import NcclTuneError
from nccl_tune.settings import needs_quoting

KEY_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_ASSIGN_RE = re.compile(r"^(?:export\s+)?([^=\s]*)\s*=(.*)$")
_PROVENANCE_RE = re.compile(r"^#\s?([A-Za-z][A-Za-z0-9 _-]*):\s?(.*)$")
HEADER_TITLE = "nccl-tune profile"


@dataclass(frozen=True)
class Line:
    """One line of a profile file as read, classified but not judged beyond syntax."""

    number: int  # 1-based
    raw: str
    kind: str  # "blank" | "comment" | "assign" | "malformed"
    key: str | None = None
    value: str | None = None
    quoted: bool = False  # the value was written in matching quotes
    error: str | None = None  # why a malformed line is malformed


@dataclass
class Profile:
    """An ordered NCCL environment plus where it came from."""

    env: dict[str, str]
    provenance: dict[str, str] = field(default_factory=dict)
    path: str | None = None
    lines: dict[str, int] = field(default_factory=dict)  # key -> line of its last assignment

    @property
    def name(self) -> str:
        """The file name without `.env`, or '<memory>' for a profile not read from disk."""
        if self.path is None:
            return "<memory>"
        base = os.path.basename(self.path)
        return base[:-4] if base.endswith(".env") else base


def parse_line(number: int, raw: str) -> Line:
    """Classify one line of a `.env` file (never raises)."""
    text = raw.strip()
    if not text:
        return Line(number, raw, "blank")
    if text.startswith("#"):
        return Line(number, raw, "comment")
    match = _ASSIGN_RE.match(text)
    if match is None:
        return Line(number, raw, "malformed", error="expected KEY=VALUE")
    key, value = match.group(1), match.group(2).strip()
    if not KEY_RE.match(key):
        return Line(number, raw, "malformed", key=key or None,
                    error=f"'{key}' is not a valid variable name" if key else "missing name before '='")
    quoted = False
    if len(value) >= 2 and value[0] == value[-1] and value[0] in "\"'":
        value, quoted = value[1:-1], True
    elif value[:1] in "\"'":
        return Line(number, raw, "malformed", key=key, error="unterminated quote")
    return Line(number, raw, "assign", key=key, value=value, quoted=quoted)


def parse_lines(text: str) -> list[Line]:
    """Every line of `text`, classified; for linting, which reports all problems."""
    return [parse_line(i, raw) for i, raw in enumerate(text.splitlines(), start=1)]


def parse_provenance(lines: list[Line]) -> dict[str, str]:
    """The `# key: value` comments of the leading comment block."""
    out: dict[str, str] = {}
    for line in lines:
        if line.kind == "blank":
            continue
        if line.kind != "comment":
            break
        match = _PROVENANCE_RE.match(line.raw.strip())
        if match:
            out[match.group(1).strip()] = match.group(2).strip()
    return out


def parse_profile(text: str, path: str | None = None) -> Profile:
    """Read profile text; raises NcclTuneError naming the first malformed line."""
    lines = parse_lines(text)
    env: dict[str, str] = {}
    where: dict[str, int] = {}
    for line in lines:
        if line.kind == "malformed":
            raise NcclTuneError(f"malformed line: {line.error}", path=path or "<text>",
                                line=line.number)
        if line.kind == "assign":
            env.pop(line.key, None)  # a later assignment wins and moves to the end
            env[line.key] = line.value
            where[line.key] = line.number
    return Profile(env=env, provenance=parse_provenance(lines), path=path, lines=where)


def read_text(path: str) -> str:
    """A file's text, or NcclTuneError naming it when it cannot be read."""
    try:
        with open(path, encoding="utf-8") as handle:
            return handle.read()
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise NcclTuneError(f"cannot read: {reason}", path=path) from None


def load_profile(path: str) -> Profile:
    """Read a profile file; NcclTuneError when it is unreadable or malformed."""
    return parse_profile(read_text(path), path=path)


def render_profile(env: dict[str, str], provenance: dict[str, str] | None = None,
                   notes: list[str] | None = None) -> str:
    """The text of a profile: title, provenance, free notes, then KEY=VALUE lines.

    Raises NcclTuneError for a name that is not a variable name, a value that would
    need quoting, or provenance text that would break the comment block.
    """
    out = [f"# {HEADER_TITLE}"]
    for key, value in (provenance or {}).items():
        if not re.fullmatch(r"[A-Za-z][A-Za-z0-9 _-]*", key) or "\n" in str(value):
            raise NcclTuneError(f"provenance entry '{key}' cannot be written as a comment")
        out.append(f"# {key}: {value}".rstrip())
    for note in notes or []:
        for part in note.splitlines() or [""]:
            out.append(f"# {part}".rstrip())
    out.append("")
    for key, value in env.items():
        if not KEY_RE.match(key):
            raise NcclTuneError(f"'{key}' is not a valid variable name")
        if needs_quoting(value):
            raise NcclTuneError(f"{key}={value!r}: the value would need quoting, which a "
                                ".env file cannot carry safely across bash, docker and systemd")
        out.append(f"{key}={value}")
    return "\n".join(out) + "\n"


def write_atomic(path: str, text: str) -> None:
    """Write `text` to `path` through a temporary file in the same folder and a rename."""
    folder = os.path.dirname(os.path.abspath(path))
    try:
        fd, tmp = tempfile.mkstemp(prefix=".nccl-tune-", dir=folder)
    except OSError as exc:
        raise NcclTuneError(f"cannot write: {exc.strerror}", path=path) from None
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def write_profile(path: str, env: dict[str, str], provenance: dict[str, str] | None = None,
                  notes: list[str] | None = None) -> None:
    """Render and write a profile atomically (see `render_profile` for what it refuses)."""
    write_atomic(path, render_profile(env, provenance, notes))


def nccl_env(environ: dict[str, str] | os._Environ) -> dict[str, str]:
    """The NCCL_* variables of an environment, sorted by name."""
    return {k: environ[k] for k in sorted(environ) if k.startswith("NCCL_")}
