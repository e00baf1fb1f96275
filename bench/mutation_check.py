"""Mutation check of the pure modules: how many deliberate one-site bugs do the tests catch?

    python bench/mutation_check.py                 # every target, up to 25 mutants each
    python bench/mutation_check.py --module stats --max 0   # every mutant of one module
    python bench/mutation_check.py --list          # the targets and their tests

For each target module it lists every mutation site (an AST walk: an arithmetic or
comparison operator swapped, `and`/`or` swapped, a `not` dropped, an integer constant
moved by one, a boolean constant flipped, a float constant scaled), takes a seeded sample,
and for each mutant copies the checkout to a scratch folder, writes the mutated module
there and runs that module's own fast tests with `-x`. A mutant is killed when the tests
fail (or time out), survived when they pass. It prints the kill rate per module and every
survivor with its line, so each can be killed by a new test or explained.

Why our own rather than mutmut: mutmut runs the whole suite per mutant by default and
rewrites the tree in place; on 2 cores a per-module test map and a scratch copy keep a
full run near half an hour, and the worktree is never touched. The figures it prints are
a bench result, not a test.
"""

from __future__ import annotations

import argparse
import ast
import copy
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

# module path -> the fast test files that own it
TARGETS: dict[str, list[str]] = {
    "nccl_tune/stats.py": [
        "tests/test_stats.py",
        "tests/test_intervals_and_decisions.py",
        "tests/test_schedule_validate.py",  # wilson_ci against published values
    ],
    "nccl_tune/model/costmodel.py": [
        "tests/test_costmodel.py",
        "tests/test_costmodel_by_hand.py",
        "tests/test_tuner.py",
    ],
    "nccl_tune/nccl/tuner.py": ["tests/test_tuner.py"],
    "nccl_tune/spec/planner.py": ["tests/test_spec_planner.py"],
    "nccl_tune/spec/cycle.py": ["tests/test_specdec.py", "tests/test_spec_planner.py"],
    "nccl_tune/decide/recommendation.py": [
        "tests/test_recommend.py",
        "tests/test_recommend_honest.py",
        "tests/test_intervals_and_decisions.py",
        "tests/test_recommend_rules.py",
    ],
    "nccl_tune/measure/importers.py": ["tests/test_importers.py"],
    "nccl_tune/errors.py": ["tests/test_exit_codes.py", "tests/test_cli_errors.py"],
    "nccl_tune/live/lint.py": ["tests/test_lint.py"],
    "nccl_tune/live/grammar.py": ["tests/test_profile.py", "tests/test_lint.py", "tests/test_profile_corpus.py"],
}

# Survivors that no test should kill, each with why (an equivalent mutant: no caller can
# tell the difference). Keyed by module, then by (the mutated line's text, stripped, and
# the mutation as printed), so the entry follows the line when code above it moves. A
# survivor listed here is reported as explained; every other survivor is a missing test.
EXPLAINED: dict[str, dict[tuple[str, str], str]] = {
    "nccl_tune/stats.py": {
        # (line text, mutation): why no caller can tell the difference
        **{
            (line, mutation): (
                "the default resample count or seed of a percentile bootstrap: another count or seed "
                "draws other resamples of the same distribution, so the interval moves by resampling "
                "noise only; no caller depends on particular resamples (the defaults make runs "
                "repeatable, and 2001 or seed 1 do too), and a test that pinned them would restate the code"
            )
            for line, mutation in (
                (
                    (
                        "values: Sequence[float], statistic=np.median, confidence: float = 0.95, n_boot: int = 2000, "
                        "seed: int | None = 0"
                    ),
                    "2000 -> 2001",
                ),
                (
                    (
                        "values: Sequence[float], statistic=np.median, confidence: float = 0.95, n_boot: int = 2000, "
                        "seed: int | None = 0"
                    ),
                    "0 -> 1",
                ),
                ("n_boot: int = 2000,", "2000 -> 2001"),  # bootstrap_diff_ci
                ("seed: int | None = 0,", "0 -> 1"),
                (
                    (
                        "a: Sequence[float], b: Sequence[float], confidence: float = 0.95, n_boot: int = 2000, "
                        "seed: int | None = 0"
                    ),
                    "2000 -> 2001",
                ),
                (
                    (
                        "a: Sequence[float], b: Sequence[float], confidence: float = 0.95, n_boot: int = 2000, "
                        "seed: int | None = 0"
                    ),
                    "0 -> 1",
                ),
            )
        }
    },
    "nccl_tune/model/costmodel.py": {
        # (line text, mutation): why no caller can tell the difference
        ("step_cost = 0.0", "0.0 -> 0.0"): "0.0 x 1.5 is 0.0: the mutant is the same program",
        ('max_ch = _int_env(env, "NCCL_MAX_NCHANNELS", _int_env(env, "NCCL_MAX_NRINGS", 64))', "64 -> 65"): (
            "the default cap only binds when the pool would pass it: pool = min(max(default_channels, "
            "MIN), max_ch), or MIN itself when MIN > max_ch; MIN = 65 gives 65 under either cap and "
            "MIN >= 66 gives MIN under both, so 64 and 65 differ only for a kind with default_channels "
            "> 64, and every kind (kinds.TOPOLOGIES, the only Topology objects) has 2, 4 or 16"
        ),
    },
    "nccl_tune/nccl/tuner.py": {
        # (line text, mutation): why no caller can tell the difference
        ("@dataclass(frozen=True)", "True -> False"): (
            "the line of Rule and of Point; frozen=False only lets a field be assigned and drops "
            "__hash__ (eq stays): no code assigns to a Rule's or a Point's field, hashes one or "
            "uses one as a set member or dict key (tuner_rows builds them, tile/render/parse read them)"
        )
    },
    "nccl_tune/spec/planner.py": {
        # (line text, mutation): why no caller can tell the difference
        ("other_ms: float = 0.0", "0.0 -> 0.0"): "0.0 x 1.5 = 0.0: the mutated program is the same program",
        (
            "return StepPlan(k, acc.tau(k), None, None, 0.0, c, 1000.0 * acc.tau(k) / c, extrapolated)",
            "0.0 -> 0.0",
        ): "0.0 x 1.5 = 0.0: the mutated program is the same program",
        (
            "def jitter(value, half, floor=0.0):",
            "0.0 -> 0.0",
        ): "0.0 x 1.5 = 0.0: the mutated program is the same program",
        (
            "comm = req.comm or (lambda n: 0.0)",
            "0.0 -> 0.0",
        ): "0.0 x 1.5 = 0.0: the mutated program is the same program",
        (
            "return StepPlan(0, 1.0, 0.0, ms, 0.0, ms, 1000.0 / ms, extrapolated), False",
            "0.0 -> 0.0",
        ): "0.0 x 1.5 = 0.0: the mutated program is the same program",
        (
            "return self.curve.at(tokens, self.batch) - (self.saving(tokens) if self.saving else 0.0)",
            "0.0 -> 0.0",
        ): "0.0 x 1.5 = 0.0: the mutated program is the same program",
        (
            "plain = StepPlan(0, 1.0, None, None, 0.0, decode, 1000.0 / decode) if decode else None",
            "0.0 -> 0.0",
        ): "0.0 x 1.5 = 0.0: the mutated program is the same program",
        (
            "replace(p, accept_len=min(max(jitter(p.accept_len, p.half), 1.0), p.k + 1.0), half=0.0)",
            "0.0 -> 0.0",
        ): "0.0 x 1.5 = 0.0: the mutated program is the same program",
        (
            'other = sum(r.get("other_ms") or 0.0 for r in spec.values()) / len(spec)',
            "0.0 -> 0.0",
        ): "0.0 x 1.5 = 0.0: the mutated program is the same program",
        (
            'verify = [(t, jitter(m, h.get("verify", {}).get(t, 0.0), 1e-6)) for t, m in req.verify_points]',
            "0.0 -> 0.0",
        ): "0.0 x 1.5 = 0.0: the mutated program is the same program",
        (
            'batch_times = [(b, jitter(m, h.get("decode_points", {}).get(b, 0.0), 1e-6)) for b, m in req.decode_points]',
            "0.0 -> 0.0",
        ): "0.0 x 1.5 = 0.0: the mutated program is the same program",
        (
            'decode_ms=jitter(req.decode_ms, h.get("decode_ms", 0.0), 1e-6),',
            "0.0 -> 0.0",
        ): "0.0 x 1.5 = 0.0: the mutated program is the same program",
        (
            'draft_ms=jitter(req.draft_ms, h.get("draft_ms", 0.0)),',
            "0.0 -> 0.0",
        ): "0.0 x 1.5 = 0.0: the mutated program is the same program",
        (
            'other_ms=jitter(req.other_ms, h.get("other_ms", 0.0)),',
            "0.0 -> 0.0",
        ): "0.0 x 1.5 = 0.0: the mutated program is the same program",
        (
            "if batch > 1:  # BATCH_NOTE: the draft step grows with the batch as the target's forward does",
            "Gt -> GtE",
        ): (
            "at batch 1 the draft step is scaled by curve.at(1, 1) / curve.at(1, 1) = 1 (at(1, 1) > 0: the saturation"
            " term is always set, t1 > 0): the same draft time to within one rounding of its last bit"
        ),
        ("extended = sv.measured_curve(list(curve.points), True, curve.sources)", "True -> False"): (
            "only extended.base reaches saturation.fit, and VerifyCurve.base interpolates and extrapolates linearly "
            "whatever linear_beyond says (the flag gates usable() and extrapolated() only): the same base either way"
        ),
        ("return value if value is None or not half else max(floor, value + rng.uniform(-half, half))", "Add -> Sub"): (
            "uniform(-half, half) is symmetric about 0, so value - U is uniform on the same interval as value + U: "
            "the draws have the same distribution, and the intervals are a statistic of it (which seeded draw falls "
            "where is no contract)"
        ),
        ("return None, True", "True -> False"): (
            "unreachable: _plain runs after _plan_batch kept some k >= 0 whose batch x (k + 1) tokens the "
            "curve can use; only an interp curve refuses a token count, and with plain decoding's time given "
            "its first point is 1 token (plain decoding's, or --verify-ms's flat value), so batch <= "
            "batch x (k + 1) lies within its points too and curve.usable(batch) is never False here"
        ),
    },
    "nccl_tune/spec/cycle.py": {
        # (line text, mutation): why no caller can tell the difference
        (
            "def cycle_ms(k: int, draft_step_ms: float, verify_ms: float, other_ms: float = 0.0) -> float:",
            "0.0 -> 0.0",
        ): "0.0 x 1.5 = 0.0: the mutated program is the same program",
        ("other_ms: float = 0.0,", "0.0 -> 0.0"): "0.0 x 1.5 = 0.0: the mutated program is the same program",
        ("0.0,", "0.0 -> 0.0"): "0.0 x 1.5 = 0.0: the mutated program is the same program",
    },
    "nccl_tune/decide/recommendation.py": {
        # (line text, mutation): why no caller can tell the difference
        (
            "self.baseline.records, row.records, nbytes, self.collectives, extrapolate, self.cell_confidence or 0.95",
            "0.95 -> 1.4249999999999998",
        ): "unreachable fallback: an Analysis holds records only when analyze_records built it, and that "
        "always sets cell_confidence = 1 - (1 - confidence) / family >= confidence >= 0.5 (recommend's "
        "--confidence is Finite(0.5, max=0.999)), so `or` never reaches 0.95; modelled rows take the other branch",
        ("confidence: float = 0.95  # the family-wise level asked for", "0.95 -> 1.4249999999999998"): "a default "
        "no reader sees: analyze_records passes its confidence, so only analyze_model's Analysis keeps it, and its "
        "one reader, family_words (tuner_rows), returns '' without it when family_size is 1 and cell_confidence "
        "None, as a modelled Analysis always has; to_dict does not write it",
        ("return str(values.most_common(1)[0][0]) if values else None", "1 -> 2"): "only the first is read: "
        "Counter.most_common(n) is heapq.nlargest(n, items, key=count), which equals sorted(..., reverse=True)[:n] "
        "(ties in insertion order), so the first of 2 is the 1 most common",
    },
    "nccl_tune/measure/importers.py": {
        # (line text, mutation): why no caller can tell the difference
    },
    "nccl_tune/errors.py": {
        # (line text, mutation): why no caller can tell the difference
    },
    "nccl_tune/live/lint.py": {
        # (line text, mutation): why no caller can tell the difference
        ("@functools.lru_cache(maxsize=1)", "1 -> 2"): "installed_names takes no arguments, so its cache only "
        "ever holds the one entry of the empty call: with room for 1 or 2 the first call's KnownNames is kept "
        "and returned to every later call, and cache_clear() empties either; no code reads cache_info()",
        ("guess = difflib.get_close_matches(key, sorted(pool), n=1, cutoff=0.75)", "1 -> 2"): "only guess[0] "
        "is read: get_close_matches returns heapq.nlargest(n, (score, name) pairs) best first, and nlargest is "
        "sorted(..., reverse=True)[:n], so the first of 2 is the 1 best: the same did-you-mean name",
    },
    "nccl_tune/live/grammar.py": {
        # (line text, mutation): why no caller can tell the difference
        ("cut = text if len(text) <= limit else text[:limit]", "LtE -> Lt"): "differs only at len(text) == "
        "limit, where the mutant cuts text[:limit], the whole string, and CPython returns the same str object "
        "for a full slice: `cut is text` still holds, so the same repr with no '...' suffix",
        ("if ord(ch) < 32 or ord(ch) == 127:", "Lt -> LtE"): "differs only for ord(ch) == 32, the blank, which "
        "_WHY holds: _char_problem returns its sentence on the line above before this test is reached",
    },
}

_SWAPS = {
    ast.Add: ast.Sub,
    ast.Sub: ast.Add,
    ast.Mult: ast.Div,
    ast.Div: ast.Mult,
    ast.FloorDiv: ast.Mult,
    ast.Lt: ast.LtE,
    ast.LtE: ast.Lt,
    ast.Gt: ast.GtE,
    ast.GtE: ast.Gt,
    ast.Eq: ast.NotEq,
    ast.NotEq: ast.Eq,
    ast.And: ast.Or,
    ast.Or: ast.And,
    ast.Is: ast.IsNot,
    ast.IsNot: ast.Is,
    ast.In: ast.NotIn,
    ast.NotIn: ast.In,
}


@dataclass(frozen=True)
class Site:
    """One place a mutant can be made: the node's index in walk order and what changes."""

    index: int
    line: int
    what: str


def _docstring_ids(tree: ast.AST) -> set[int]:
    """ids of the string constants that are docstrings (never mutated)."""
    ids = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            body = getattr(node, "body", [])
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                ids.add(id(body[0].value))
    return ids


def _mutation(node: ast.AST) -> str | None:
    """What mutating this node would do, or None when it is not a site."""
    if isinstance(node, (ast.BinOp, ast.BoolOp)) and type(node.op) in _SWAPS:
        return f"{type(node.op).__name__} -> {_SWAPS[type(node.op)].__name__}"
    if isinstance(node, ast.Compare) and type(node.ops[0]) in _SWAPS:
        return f"{type(node.ops[0]).__name__} -> {_SWAPS[type(node.ops[0])].__name__}"
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
        return "not x -> x"
    if isinstance(node, ast.Constant) and type(node.value) is bool:
        return f"{node.value} -> {not node.value}"
    if isinstance(node, ast.Constant) and type(node.value) is int:
        return f"{node.value} -> {node.value + 1}"
    if isinstance(node, ast.Constant) and type(node.value) is float:
        return f"{node.value} -> {node.value * 1.5}"
    return None


def sites(source: str) -> list[Site]:
    """Every mutation site of a module, in a stable order."""
    tree = ast.parse(source)
    skip = _docstring_ids(tree)
    found = []
    for index, node in enumerate(ast.walk(tree)):
        if id(node) in skip:
            continue
        what = _mutation(node)
        if what:
            found.append(Site(index, getattr(node, "lineno", 0), what))
    return found


def mutate(source: str, site: Site) -> str:
    """The module's source with one site mutated (re-rendered by ast.unparse)."""
    tree = ast.parse(source)
    node = list(ast.walk(tree))[site.index]
    if isinstance(node, (ast.BinOp, ast.BoolOp)):
        node.op = _SWAPS[type(node.op)]()
    elif isinstance(node, ast.Compare):
        node.ops = [_SWAPS[type(node.ops[0])](), *node.ops[1:]]
    elif isinstance(node, ast.UnaryOp):
        replacement = copy.deepcopy(node.operand)
        for parent in ast.walk(tree):
            for name, value in ast.iter_fields(parent):
                if value is node:
                    setattr(parent, name, replacement)
                elif isinstance(value, list) and any(v is node for v in value):
                    setattr(parent, name, [replacement if v is node else v for v in value])
    elif isinstance(node.value, bool):
        node.value = not node.value
    elif isinstance(node.value, int):
        node.value += 1
    else:
        node.value *= 1.5
    return ast.unparse(tree)


def run_tests(workdir: Path, tests: list[str], timeout_s: float) -> bool:
    """Whether the tests pass in the scratch copy (a timeout counts as a failure)."""
    env = {**os.environ, "PYTHONPATH": str(workdir)}
    env = {k: v for k, v in env.items() if not k.startswith("NCCL_")}
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "pytest", "-x", "-q", "-m", "not slow", "-p", "no:cacheprovider", *tests],
            cwd=workdir,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            timeout=timeout_s,
        )
    except subprocess.TimeoutExpired:
        return False
    return proc.returncode == 0


def check_module(
    module: str, tests: list[str], max_mutants: int, seed: int, timeout_s: float
) -> tuple[int, int, list[Site]]:
    """(sites, mutants run, survivors) for one module."""
    source = (REPO / module).read_text()
    all_sites = sites(source)
    chosen = all_sites if max_mutants <= 0 else random.Random(seed).sample(all_sites, min(max_mutants, len(all_sites)))
    survivors = []
    with tempfile.TemporaryDirectory(prefix="nccl-tune-mut-") as tmp:
        work = Path(tmp) / "repo"
        shutil.copytree(
            REPO, work, ignore=shutil.ignore_patterns(".git", "__pycache__", "*.egg-info", ".venv*", "site")
        )
        shared = REPO.parent / "shared"  # the real public fixtures beside the checkout
        if shared.is_dir():  # (tests read ../shared/fixtures/real and skip without it)
            (Path(tmp) / "shared").symlink_to(shared.resolve())
        if not run_tests(work, tests, timeout_s):
            raise SystemExit(f"{module}: its tests fail without a mutant: fix them first")
        for site in sorted(chosen, key=lambda s: s.index):
            (work / module).write_text(mutate(source, site))
            if run_tests(work, tests, timeout_s):
                survivors.append(site)
        (work / module).write_text(source)
    return len(all_sites), len(chosen), survivors


def explanation(module: str, source: str, site: Site) -> str | None:
    """Why a surviving mutant is left alive (EXPLAINED), or None: a test is missing."""
    lines = source.splitlines()
    text = lines[site.line - 1].strip() if 0 < site.line <= len(lines) else ""
    return EXPLAINED.get(module, {}).get((text, site.what))


def main(argv: list[str] | None = None) -> int:
    """Run the check and print a table: module, sites, mutants, killed, kill rate, and the
    survivors, explained (EXPLAINED) or not."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0], allow_abbrev=False)
    parser.add_argument("--module", action="append", help="a target's short name (stats, lint, ...)")
    parser.add_argument("--max", type=int, default=25, help="mutants per module (0: all)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds per test run")
    parser.add_argument("--list", action="store_true")
    args = parser.parse_args(argv)
    targets = {m: t for m, t in TARGETS.items() if not args.module or Path(m).stem in args.module}
    if args.list:
        for module, tests in targets.items():
            print(f"{module}: {len(sites((REPO / module).read_text()))} sites; tests {' '.join(tests)}")
        return 0
    total_run = total_killed = total_explained = 0
    start = time.monotonic()
    print(f"{'module':40} {'sites':>6} {'mutants':>8} {'killed':>7} {'rate':>6} {'explained':>9}")
    for module, tests in targets.items():
        n_sites, n_run, survivors = check_module(module, tests, args.max, args.seed, args.timeout)
        source = (REPO / module).read_text()
        why = {site: explanation(module, source, site) for site in survivors}
        killed, explained = n_run - len(survivors), sum(1 for w in why.values() if w)
        total_run, total_killed, total_explained = total_run + n_run, total_killed + killed, total_explained + explained
        rate = killed / max(n_run, 1)
        print(f"{module:40} {n_sites:6d} {n_run:8d} {killed:7d} {rate:6.0%} {explained:9d}")
        for site in survivors:
            text = source.splitlines()[site.line - 1].strip()
            reason = f" -- explained: {why[site]}" if why[site] else ""
            print(f"    survived: line {site.line}: {site.what}: {text[:90]}{reason}")
    unexplained = total_run - total_killed - total_explained
    print(
        f"{'all':40} {'':6} {total_run:8d} {total_killed:7d} "
        f"{total_killed / max(total_run, 1):6.0%} {total_explained:9d}  ({time.monotonic() - start:.0f} s)"
    )
    print(f"killed or explained: {total_run - unexplained}/{total_run}; unexplained survivors: {unexplained}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
