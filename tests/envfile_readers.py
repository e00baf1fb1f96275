"""Reference readers of the env-file rules other programs document, for the grammar tests.

Each is written here from the program's documentation (and, where the documentation is
silent, its source as read), independently of nccl_tune, so that a test can compare
what the profile grammar accepts with what each consumer would read. Each returns the
(name, value) assignments in file order, duplicates kept; a refusal raises `Refused`.

- docker: `docker run --env-file` (docs.docker.com, docker container run, "--env-file":
  one VAR=VAL a line, lines starting with '#' are comments; "no special quote
  handling"); the details from docker/cli opts/file.go parseKeyValueFile (@06f64c0):
  lines split at '\\n' with a trailing '\\r' dropped (Go's bufio.ScanLines), invalid
  UTF-8 refused, a UTF-8 BOM dropped from the first line, leading Unicode white space
  trimmed, empty and '#' lines skipped, the name is what precedes the first '=' (left
  blanks trimmed) and may hold no space or tab (refused), the value is passed through
  untouched; a line without '=' copies the variable from docker's own environment.
- systemd: `EnvironmentFile=` (systemd.exec(5): newline-separated assignments; empty
  lines, lines without '=', lines starting with ';' or '#' ignored; unquoted values
  follow shell backslash rules, leading and trailing whitespace dropped, quotes
  removed; a line ending in a backslash continues on the next one), with the details
  of src/basic/env-file.c parse_env_file_internal (@0002453): CR and LF both end a
  line, blanks before a name are skipped; invalid names are dropped when the unit's
  environment is built (strv_env_clean). Before v254 a comment ending in a backslash
  also swallowed the next line (`legacy_comments`).
- NCCL's conf reader: src/misc/param.cc setEnvFile (NCCL >= 2.30 form): fgets into a
  4096-byte buffer (so a longer line is read in 4095-byte pieces), one trailing '\\n'
  then one '\\r' removed, '#' lines and lines without '=' skipped, name and value cut
  at 1023 bytes, taken literally.
"""

from __future__ import annotations

import re


class Refused(Exception):
    """The program refuses the whole file."""


# Go's unicode.IsSpace: '\t', '\n', '\v', '\f', '\r', ' ', U+0085, U+00A0 and the other
# White_Space characters of Unicode's PropList.txt.
GO_SPACE = frozenset(
    "\t\n\v\f\r \x85\xa0\u1680\u2000\u2001\u2002\u2003\u2004\u2005\u2006"
    "\u2007\u2008\u2009\u200a\u2028\u2029\u202f\u205f\u3000"
)


def docker_env_file(text: str, host_env: dict[str, str] | None = None) -> list[tuple[str, str]]:
    """What `docker run --env-file` sets from `text`."""
    out = []
    pieces = text.split("\n")
    if pieces and pieces[-1] == "":
        pieces.pop()
    for index, raw in enumerate(pieces):
        line = raw.removesuffix("\r")
        if any("\ud800" <= c <= "\udfff" for c in line):  # not encodable as UTF-8
            raise Refused(f"invalid utf8 bytes at line {index + 1}")
        if index == 0 and line.startswith("\ufeff"):
            line = line[1:]
        line = line.lstrip("".join(GO_SPACE))
        if not line or line.startswith("#"):
            continue
        name, sep, value = line.partition("=")
        name = name.lstrip(" \t")
        if " " in name or "\t" in name:
            raise Refused(f"variable '{name}' contains whitespaces")
        if not name:
            raise Refused(f"no variable name on line '{line}'")
        if sep:
            out.append((name, value))
        elif host_env is not None and name in host_env:
            out.append((name, host_env[name]))
    return out


_BASH_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def systemd_env_file(text: str, legacy_comments: bool = False) -> list[tuple[str, str]]:
    """What a systemd unit's `EnvironmentFile=` puts in its environment from `text`."""
    newline, blank = "\n\r", " \t\n\r"
    pushes: list[tuple[str, str]] = []
    state, key, value = "pre_key", [], []
    trail_key = trail_value = None  # where trailing blanks of the key / value begin

    def push():
        name = "".join(key[:trail_key] if trail_key is not None else key)
        pushes.append((name, "".join(value)))

    for c in text:
        if state == "pre_key":
            if c in "#;":
                state = "comment"
            elif c not in blank:
                state, key, value, trail_key = "key", [c], [], None
        elif state == "key":
            if c in newline:
                state = "pre_key"
            elif c == "=":
                state, trail_value = "pre_value", None
            else:
                if c not in blank:
                    trail_key = None
                elif trail_key is None:
                    trail_key = len(key)
                key.append(c)
        elif state == "pre_value":
            if c in newline:
                push()
                state = "pre_key"
            elif c == "'":
                state = "single"
            elif c == '"':
                state = "double"
            elif c == "\\":
                state = "value_escape"
            elif c not in blank:
                state = "value"
                value.append(c)
        elif state == "value":
            if c in newline:
                if trail_value is not None:
                    del value[trail_value:]
                push()
                state = "pre_key"
            elif c == "\\":
                state, trail_value = "value_escape", None
            else:
                if c not in blank:
                    trail_value = None
                elif trail_value is None:
                    trail_value = len(value)
                value.append(c)
        elif state == "value_escape":
            state = "value"
            if c not in newline:
                value.append(c)
        elif state == "single":
            if c == "'":
                state = "pre_value"
            else:
                value.append(c)
        elif state == "double":
            if c == '"':
                state = "pre_value"
            elif c == "\\":
                state = "double_escape"
            else:
                value.append(c)
        elif state == "double_escape":
            state = "double"
            if c in '"\\`$':
                value.append(c)
            elif c != "\n":
                value.extend(("\\", c))
        elif state == "comment":
            if c == "\\":
                state = "comment_escape"
            elif c in newline:
                state = "pre_key"
        elif state == "comment_escape":
            state = "comment" if legacy_comments or c not in newline else "pre_key"
    if state in ("pre_value", "value", "value_escape", "single", "double", "double_escape"):
        if state == "value" and trail_value is not None:
            del value[trail_value:]
        push()
    # The unit's environment keeps valid names only (env_name_is_valid: bash's rule).
    return [(k, v) for k, v in pushes if _BASH_NAME.fullmatch(k)]


def nccl_conf_file(text: str) -> list[tuple[str, str]]:
    """The setenv calls NCCL's conf reader makes for `text` (in order, duplicates kept)."""
    data = text.encode("utf-8", "surrogatepass")
    out = []
    for raw in data.split(b"\n") if data else []:
        if raw == b"":
            continue
        # fgets(line, 4096): pieces of at most 4095 bytes; only the last keeps the '\n'.
        chunks = [raw[i : i + 4095] for i in range(0, len(raw), 4095)]
        for chunk in chunks:
            line = chunk[:-1] if chunk.endswith(b"\r") else chunk
            if line.startswith(b"#") or b"=" not in line:
                continue
            name, value = line.split(b"=", 1)
            out.append((name[:1023].decode("utf-8", "replace"), value[:1023].decode("utf-8", "replace")))
    return out
