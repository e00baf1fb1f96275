"""The profile grammar against its readers: what it accepts, every consumer reads alike.

Property (DESIGN.md section 8): for any text, if the grammar accepts it, then
`bash --norc --noprofile -c 'set -a; . ./f.env'` in a scratch folder creates nothing
(no canary file) and the variables bash exports are exactly the parser's, name for
name and value for value; docker's env-file rules, systemd's EnvironmentFile rules and
NCCL's conf reader (reference readers in envfile_readers, written from their
documentation) give the parser's assignments too. bash is the real bash; many texts run
in one bash process so a few thousand examples stay fast.
"""

from __future__ import annotations

import os
import re
import shutil
import string
import subprocess
import tempfile

import pytest
from envfile_readers import Refused, docker_env_file, nccl_conf_file, systemd_env_file
from hypothesis import HealthCheck, event, given
from hypothesis import settings as hsettings
from hypothesis import strategies as st

from nccl_tune.errors import NcclTuneError
from nccl_tune.live import grammar

BASH = shutil.which("bash")
needs_bash = pytest.mark.skipif(BASH is None, reason="bash is not installed")

BATCH = 40  # texts per bash process
EXAMPLES = 75  # hypothesis examples: EXAMPLES * BATCH texts in all (3000)

# ---------------------------------------------------------------- strategies

SAFE = string.ascii_letters + string.digits + "_.,:^%/+-="  # the documented value characters
NAMES = st.one_of(
    st.text(alphabet=string.ascii_uppercase + string.digits + "_", min_size=1, max_size=20)
    .map(lambda tail: "NCCL_" + tail)
    .filter(lambda n: not grammar.loads_code(n)),
    st.sampled_from(
        [
            "NCCL_PROTO",
            "NCCL_ALGO",
            "TORCH_NCCL_BLOCKING_WAIT",
            "VLLM_ALLREDUCE_USE_SYMM_MEM",
            "VLLM_SKIP_P2P_CHECK",
            "SGLANG_SKIP_P2P_CHECK",
        ]
    ),
)
BAD_NAMES = st.sampled_from(
    [
        "LD_PRELOAD",
        "PATH",
        "BASH_ENV",
        "ENV",
        "IFS",
        "PS4",
        "SHELLOPTS",
        "nccl_proto",
        "NCCL_NET_PLUGIN",
        "NCCL_IBVERBS_LIB",
        "export",
        "X",
        "1NCCL",
        "NCCL-X",
        "NCCL_\u00c9",
        "\ufeffNCCL_PROTO",
        "",
    ]
)
# Printable comment text (what the grammar allows after '#'), trailing backslash removed.
PRINTABLE = st.characters(blacklist_categories=("Cc", "Cs", "Cf", "Co", "Cn", "Zl", "Zp", "Zs"))
COMMENT_TEXT = st.text(alphabet=PRINTABLE | st.sampled_from(" \t"), max_size=30).map(lambda t: t.rstrip("\\"))
# What bash, docker or systemd treat specially; commands only ever touch ./canary.
ADVERSARIAL = st.sampled_from(
    [
        "'",
        '"',
        "$(touch canary)",
        "`touch canary`",
        ";touch canary",
        "&touch canary",
        "|touch canary",
        ">canary",
        "<canary",
        " touch canary",
        "\ttouch canary",
        "\\",
        "\\\n",
        "\\\n#$(touch canary)",
        "\\\n#;touch canary",
        "\r",
        "\rtouch canary",
        "\x00",
        "\u2028",
        "\u00a0",
        "\ufeff",
        "\x85",
        "\x0b",
        "\x0c",
        "~",
        "~/",
        "${HOME}",
        "$HOME",
        "$((1+1))",
        "#",
        " #",
        "=",
        "\n",
        "\ntouch canary\n",
        "{a,b}",
        "*",
        "?",
        "[a]",
        "!",
        "e\u0301",
        "\u00e9",
        "export ",
        "'a'$(touch canary)'b'",
        "'a';touch canary;'b'",
        '"a";touch canary;"b"',
        "'a'`touch canary`'b'",
        "'a'\"$(touch canary)\"'b'",
        "$'\\x41'",
        "(",
        ")",
        "\\x41",
        "%",
    ]
)


@st.composite
def valid_text(draw):
    """Text built only from the forms the grammar documents: it must be accepted."""
    lines = []
    for _ in range(draw(st.integers(0, 8))):
        kind = draw(st.sampled_from(["assign", "assign", "assign", "comment", "blank", "export"]))
        if kind == "comment":
            lines.append("#" + draw(COMMENT_TEXT))
        elif kind == "blank":
            lines.append(draw(st.sampled_from(["", " ", "\t", "  \t "])))
        else:
            prefix = "export " if kind == "export" else ""
            lines.append(f"{prefix}{draw(NAMES)}={draw(st.text(alphabet=SAFE, max_size=30))}")
    return "\n".join(lines) + draw(st.sampled_from(["", "\n"]))


@st.composite
def wild_text(draw):
    """Near-valid lines with adversarial pieces spliced in, and arbitrary text."""
    lines = []
    for _ in range(draw(st.integers(1, 6))):
        kind = draw(st.sampled_from(["assign", "assign", "comment", "raw", "valid"]))
        if kind == "raw":
            lines.append(draw(st.text(max_size=30)))
        elif kind == "valid":
            lines.append(f"{draw(NAMES)}={draw(st.text(alphabet=SAFE, max_size=10))}")
        elif kind == "comment":
            lines.append("#" + "".join(draw(st.lists(ADVERSARIAL | COMMENT_TEXT, max_size=3))))
        else:
            prefix = draw(st.sampled_from(["", "", "export ", " ", "\t", "export\t", "export  "]))
            name = draw(NAMES | BAD_NAMES)
            sep = draw(st.sampled_from(["=", "=", "=", " =", "= ", "=="]))
            value = "".join(draw(st.lists(ADVERSARIAL | st.text(alphabet=SAFE, max_size=8), max_size=4)))
            lines.append(f"{prefix}{name}{sep}{value}")
    return "\n".join(lines) + draw(st.sampled_from(["", "\n", "\r\n"]))


# ---------------------------------------------------------------- bash, in batches

_SCRIPT = r"""
out=$1; shift
i=0
for d in "$@"; do
  ( cd "$d" || exit 97
    set -a
    . ./f.env
    set +a
    declare -px > "$out/$i.after" ) </dev/null >/dev/null 2>&1
  i=$((i + 1))
done
declare -px > "$out/before"
"""
# `declare -px` is a builtin (no process per text); it prints `declare -x NAME="VALUE"`
# with '"', '$', '\' and '`' escaped (none of which the grammar lets through).
_DECLARE = re.compile(r'declare -x ([A-Za-z_][A-Za-z0-9_]*)(?:="((?:[^"\\$`]|\\.)*)")?\n')


def _read_declare(path: str) -> dict[str, str] | None:
    """The exported variables `declare -px` wrote to `path` (None: bash never got there)."""
    try:
        with open(path, encoding="utf-8", errors="surrogateescape") as handle:
            text = handle.read()
    except FileNotFoundError:
        return None
    out, pos = {}, 0
    for match in _DECLARE.finditer(text):
        if match.start() != pos:  # a form this reader does not know: keep it visible
            out[f"<unparsed at {pos}>"] = text[pos : match.start()]
        out[match.group(1)] = re.sub(r"\\(.)", r"\1", match.group(2) or "")
        pos = match.end()
    if pos != len(text):
        out[f"<unparsed at {pos}>"] = text[pos:]
    return out


_WORKSPACE: list[str] = []  # one scratch root per test module: folders are reused, since
# removing folders costs milliseconds each on some file systems and files cost nothing


@pytest.fixture(scope="module", autouse=True)
def _workspace():
    root = tempfile.mkdtemp(prefix="nccl-tune-grammar-")
    _WORKSPACE.append(root)
    yield
    _WORKSPACE.remove(root)
    shutil.rmtree(root, ignore_errors=True)


def _empty_folder(path: str) -> str:
    os.makedirs(path, exist_ok=True)
    for name in os.listdir(path):
        target = os.path.join(path, name)
        shutil.rmtree(target) if os.path.isdir(target) and not os.path.islink(target) else os.unlink(target)
    return path


def bash_reads(texts: list[str]) -> list[tuple[dict[str, str] | None, list[str]]]:
    """For each text sourced by bash in its own empty folder: (the variables it added or
    changed, None when bash stopped before the end; the files in the folder afterwards)."""
    root = _WORKSPACE[-1]
    out = _empty_folder(os.path.join(root, "out"))
    dirs = []
    for i, text in enumerate(texts):
        folder = _empty_folder(os.path.join(root, f"d{i}"))
        with open(os.path.join(folder, "f.env"), "w", encoding="utf-8", newline="") as handle:
            handle.write(text)
        dirs.append(folder)
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": root, "LC_ALL": "C"}
    subprocess.run(
        [BASH, "--norc", "--noprofile", "-c", _SCRIPT, "bash", out, *dirs],
        env=env,
        cwd=root,
        check=True,
        timeout=120,
        capture_output=True,
    )
    base = _read_declare(os.path.join(out, "before"))
    results = []
    for i, folder in enumerate(dirs):
        after = _read_declare(os.path.join(out, f"{i}.after"))
        added = (
            None
            if after is None
            else {k: v for k, v in after.items() if base.get(k) != v and k not in ("PWD", "OLDPWD")}
        )
        results.append((added, sorted(os.listdir(folder))))
    return results


def _accepted(text: str) -> list[tuple[str, str]] | None:
    try:
        return grammar.assignments(text)
    except NcclTuneError:
        return None


def _exported_lines(text: str) -> bool:
    return any(line.exported for line in grammar.parse_lines(text))


def check_readers(text: str, pairs: list[tuple[str, str]]) -> None:
    """docker, systemd (both comment rules) and NCCL's conf reader read `text` as `pairs`."""
    plain = [
        (k, v)
        for line, (k, v) in zip(
            [parsed for parsed in grammar.parse_lines(text) if parsed.kind == grammar.ASSIGN], pairs
        )
        if not line.exported
    ]
    if _exported_lines(text):
        # docker refuses the whole file; systemd drops the `export` lines (invalid names).
        with pytest.raises(Refused):
            docker_env_file(text)
    else:
        assert docker_env_file(text) == pairs
        assert nccl_conf_file(text) == pairs
    assert systemd_env_file(text) == plain
    assert systemd_env_file(text, legacy_comments=True) == plain


# ---------------------------------------------------------------- the property


@needs_bash
@hsettings(
    max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large]
)
@given(st.lists(st.one_of(valid_text(), wild_text()), min_size=BATCH, max_size=BATCH))
def test_what_the_grammar_accepts_every_reader_reads_alike_and_bash_runs_nothing(texts):
    accepted = [(text, pairs) for text in texts if (pairs := _accepted(text)) is not None]
    low = 10 * (len(accepted) // 10)
    event(f"accepted per batch of {BATCH}: {low}-{low + 9}")  # --hypothesis-show-statistics
    for text, pairs in accepted:
        check_readers(text, pairs)
    for (text, pairs), (added, files) in zip(accepted, bash_reads([t for t, _ in accepted])):
        assert files == ["f.env"], (text, files)  # nothing ran: no canary, no redirect target
        assert added == dict(pairs), text  # later assignments win, as in the parser


@hsettings(max_examples=300, deadline=None)
@given(valid_text())
def test_the_documented_forms_are_accepted(text):
    assert _accepted(text) is not None


@needs_bash
def test_the_oracle_sees_code_run():
    # The adversarial pieces really run a command under bash when the grammar is bypassed,
    # so the property above would catch a grammar that let one through.
    texts = [
        "X='a'$(touch canary)'b'\n",
        "X='a';touch canary;'b'\n",
        'X="a";touch canary;"b"\n',
        "X='a'`touch canary`'b'\n",
        "X='a'\"$(touch canary)\"'b'\n",
        "X=a\\\n#$(touch canary)\n",
        "X=a\\\n#;touch canary\n",
        "X=a >canary\n",
    ]
    for text in texts:
        assert _accepted(text) is None, text
    for text, (_, files) in zip(texts, bash_reads(texts)):
        assert "canary" in files, text


@needs_bash
def test_readers_disagree_where_the_grammar_refuses():
    # Each refused form is read differently by at least two consumers: why it is refused.
    cases = [
        "NCCL_PROTO='LL'\n",
        "NCCL_PROTO=LL \n",
        "NCCL_PROTO=L\\L\n",
        "NCCL_PROTO=LL\r\n",
        "# note \\\nNCCL_PROTO=LL\n",
        " NCCL_PROTO=LL\n",
        "NCCL_PROTO=LL\rNCCL_ALGO=Tree\n",
    ]
    for text, (bash, _) in zip(cases, bash_reads(cases)):
        assert _accepted(text) is None, text
        reads = [
            bash,
            dict(docker_env_file(text)),
            dict(systemd_env_file(text)),
            dict(systemd_env_file(text, legacy_comments=True)),
            dict(nccl_conf_file(text)),
        ]
        assert any(r != reads[0] for r in reads), text
