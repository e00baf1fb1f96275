"""Profiles: `.env` files of NCCL settings with a provenance header.

The format (DESIGN.md section 3) is the common subset of bash `set -a; . f.env`,
`docker run --env-file`, systemd `EnvironmentFile=` and `nccl-tune exec`:

    # nccl-tune profile
    # source: measured
    # gpus: 8x NVIDIA RTX PRO 6000 (PCIe)
    #
    # free notes go after a lone '#' line
    NCCL_PROTO=LL
    NCCL_ALGO=Ring

`KEY=VALUE` lines, `#` comments and blank lines; `export KEY=VALUE` is accepted on
read (the linter warns: docker and systemd do not take it). Reading never evaluates
anything: no expansion, no substitution. A value in matching quotes is read without
them (as bash and systemd do); the linter warns, since docker keeps quotes literally.
Lines that the three consumers would read differently are malformed: spaces around
`=` (bash would run KEY as a command), a value starting with a space, control
characters. Writing refuses values that need quoting and replaces the file atomically.

Provenance is the `# key: value` comment lines of the leading comment block, up to a
lone `#` line (after which free notes follow). Line numbers count `\\n` only, as
editors and the linter's findings do.

Shipped profiles live in the repository's `profiles/` folder (a source checkout or an
editable install finds it beside the package; a wheel installs it as data files under
`<prefix>/share/nccl-tune/profiles`): see `shipped_profiles_dir`.
"""

from __future__ import annotations

import os
import re
import sys
import sysconfig
from dataclasses import dataclass, field
from pathlib import Path

from nccl_tune import fileio
from nccl_tune.errors import NcclTuneError
from nccl_tune.nccl.settings import needs_quoting

KEY_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_EXPORT_RE = re.compile(r"^export\s+")
_PROVENANCE_RE = re.compile(r"^#\s?([A-Za-z][A-Za-z0-9 _-]*?)\s*:\s?(.*)$")
_PROVENANCE_KEY_RE = re.compile(r"^[A-Za-z][A-Za-z0-9 _-]*$")
_CONTROL_RE = re.compile(r"[\x00-\x08\x0a-\x1f\x7f]")
HEADER_TITLE = "nccl-tune profile"
NOTES_SEPARATOR = "#"


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
    exported: bool = False  # written as `export KEY=VALUE`


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
    exported = bool(_EXPORT_RE.match(text))
    body = _EXPORT_RE.sub("", text, count=1) if exported else text
    if "=" not in body:
        return Line(number, raw, "malformed", error="expected KEY=VALUE")
    key, value = body.split("=", 1)
    if not key:
        return Line(number, raw, "malformed", error="missing name before '='")
    if key != key.rstrip():
        return Line(number, raw, "malformed", key=key.strip() or None,
                    error="space before '=': bash would run the name as a command")
    if not KEY_RE.match(key):
        return Line(number, raw, "malformed", key=key, error=f"'{key}' is not a valid variable name")
    if value[:1].isspace():
        return Line(number, raw, "malformed", key=key,
                    error="space after '=': bash would set an empty value and run the rest")
    value = value.rstrip()
    if _CONTROL_RE.search(value):
        return Line(number, raw, "malformed", key=key, error="control character in the value")
    quoted = False
    if len(value) >= 2 and value[0] == value[-1] and value[0] in "\"'":
        value, quoted = value[1:-1], True
    elif value and value[0] in "\"'":
        return Line(number, raw, "malformed", key=key, error="unterminated quote")
    return Line(number, raw, "assign", key=key, value=value, quoted=quoted, exported=exported)


def split_lines(text: str) -> list[str]:
    """`text` cut at `\\n` only (a trailing `\\r` dropped), so numbers match an editor's."""
    pieces = text.split("\n")
    if pieces and pieces[-1] == "":
        pieces.pop()
    return [p[:-1] if p.endswith("\r") else p for p in pieces]


def parse_lines(text: str) -> list[Line]:
    """Every line of `text`, classified; for linting, which reports all problems."""
    return [parse_line(i, raw) for i, raw in enumerate(split_lines(text), start=1)]


def parse_provenance(lines: list[Line]) -> dict[str, str]:
    """The `# key: value` comments of the leading comment block (up to a lone `#`)."""
    out: dict[str, str] = {}
    for line in lines:
        if line.kind == "blank":
            continue
        if line.kind != "comment" or line.raw.strip() == NOTES_SEPARATOR:
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


PROFILE_MAX_BYTES = 1024 * 1024  # a profile is a few dozen lines
PROFILE_MAX_LINE = 4096  # characters per line: an NCCL value or a provenance note is far shorter


def read_text(path: str) -> str:
    """A profile's text by the input policy (nccl_tune.fileio.read_text: strict UTF-8, a
    size cap), or NcclTuneError naming the file (and line)."""
    return fileio.read_text(path, what="profile", max_bytes=PROFILE_MAX_BYTES, max_line=PROFILE_MAX_LINE)


def load_profile(path: str) -> Profile:
    """Read a profile file; NcclTuneError when it is unreadable or malformed."""
    return parse_profile(read_text(path), path=path)


def render_profile(env: dict[str, str], provenance: dict[str, str] | None = None,
                   notes: list[str] | None = None) -> str:
    """The text of a profile: title, provenance, free notes, then KEY=VALUE lines.

    Provenance keys and values are written stripped (that is how they read back).
    Raises NcclTuneError for a name that is not a variable name, a value that would
    need quoting, or provenance/note text that would break the comment block.
    """
    out = [f"# {HEADER_TITLE}"]
    for key, value in (provenance or {}).items():
        key, value = str(key).strip(), str(value).strip()
        if not _PROVENANCE_KEY_RE.match(key) or _CONTROL_RE.search(value):
            raise NcclTuneError(f"provenance entry '{key}' cannot be written as a comment")
        out.append(f"# {key}: {value}".rstrip())
    if notes:
        out.append(NOTES_SEPARATOR)
        for note in notes:
            for part in note.split("\n"):
                if _CONTROL_RE.search(part.rstrip("\r")):
                    raise NcclTuneError("a note holds a control character")
                out.append(f"# {part.rstrip()}".rstrip())
    out.append("")
    for key, value in env.items():
        if not KEY_RE.match(key):
            raise NcclTuneError(f"'{key}' is not a valid variable name")
        if needs_quoting(value):
            raise NcclTuneError(f"{key}={value!r}: the value would need quoting, which a "
                                ".env file cannot carry safely across bash, docker and systemd")
        out.append(f"{key}={value}")
    return "\n".join(out) + "\n"


def write_profile(path: str, env: dict[str, str], provenance: dict[str, str] | None = None,
                  notes: list[str] | None = None) -> None:
    """Render and write a profile atomically (see `render_profile` for what it refuses)."""
    fileio.write_atomic(path, render_profile(env, provenance, notes))


def nccl_env(environ: dict[str, str] | os._Environ) -> dict[str, str]:
    """The NCCL_* variables of an environment, sorted by name."""
    return {k: environ[k] for k in sorted(environ) if k.startswith("NCCL_")}


# ---------------------------------------------------------------- shipped profiles

def shipped_profiles_dir() -> Path | None:
    """The folder of shipped profiles, or None when this installation has none.

    Order: $NCCL_TUNE_PROFILES (a folder), the `profiles/` folder beside the package
    (source checkout, editable install), then `<prefix>/share/nccl-tune/profiles`
    (where a wheel's data files land).
    """
    candidates = []
    if os.environ.get("NCCL_TUNE_PROFILES"):
        candidates.append(Path(os.environ["NCCL_TUNE_PROFILES"]))
    candidates.append(Path(__file__).resolve().parents[2] / "profiles")
    for prefix in {sysconfig.get_path("data"), sys.prefix}:
        if prefix:
            candidates.append(Path(prefix) / "share" / "nccl-tune" / "profiles")
    for folder in candidates:
        if folder.is_dir():
            return folder
    return None


def list_shipped() -> list[Path]:
    """The shipped `.env` files, sorted by name (empty when there are none)."""
    folder = shipped_profiles_dir()
    return sorted(folder.glob("*.env")) if folder else []


def resolve_profile(name_or_path: str) -> Path:
    """A profile path from a file path or a shipped profile's name (with or without .env).

    An existing file wins over a shipped name. NcclTuneError, naming the shipped
    profiles, when neither exists.
    """
    candidate = Path(name_or_path)
    if candidate.is_file():
        return candidate
    wanted = name_or_path[:-4] if name_or_path.endswith(".env") else name_or_path
    for path in list_shipped():
        if path.stem == wanted:
            return path
    names = ", ".join(p.stem for p in list_shipped()) or "none found"
    raise NcclTuneError(f"no such file or shipped profile (shipped: {names})", path=name_or_path)
