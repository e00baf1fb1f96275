"""Count the seams between modules: the figures issue 32 asks for, before and after.

    python3 tools/seam_metrics.py            # a table
    python3 tools/seam_metrics.py --json     # the same figures as JSON

Static counts over the source (ast, nothing imported or run):

- calls with 8 or more positional arguments (a swapped argument is silent there);
- public functions whose return annotation is a dict (``dict``, ``dict[...]``,
  ``Dict``), i.e. untyped data handed across a module boundary;
- Enum classes and ``Literal[...]`` annotations: closed sets that have a type;
- places each closed set is spelled: a tuple, list, set, dict or ``click.Choice`` literal
  holding two or more of its words, or a comparison of a value with one of them (an
  ``if engine == "vllm"`` is a place a new member must be added), per concept;
- source files outside the tests that name an engine in a string literal (an upper bound
  on the files a new engine touches);
- test functions that assert on a fragment of text: ``assert "words" in output`` (a
  string literal or f-string tested for membership in something other than a literal
  collection), as a share of all test functions.

The fast set's wall time and the mutation check are measured by their own commands
(``python3 -m pytest -m "not slow"``; ``python3 bench/mutation_check.py``).
"""

from __future__ import annotations

import argparse
import ast
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SOURCE_DIRS = ("nccl_tune", "integration", "microbench")
TESTS = "tests"

# The closed sets issue 32 names, by the words that spell them.
CONCEPTS: dict[str, frozenset[str]] = {
    "engine": frozenset({"sglang", "vllm", "builtin"}),
    "status": frozenset({"ok", "failed", "timeout", "wrong"}),
    "backend": frozenset({"nccl", "gloo", "sim", "nccl-tests"}),
    "mode": frozenset({"graph", "eager"}),
    "provenance": frozenset({"measured", "simulated", "modelled", "imported"}),
    "severity": frozenset({"error", "warning", "info"}),
}
ENGINE_WORDS = frozenset({"sglang", "vllm"})
NO_DIFFERENCE = "no significant difference"


def _python_files(*dirs: str) -> list[Path]:
    files: list[Path] = []
    for name in dirs:
        files.extend(sorted((ROOT / name).rglob("*.py")))
    return [f for f in files if "fixtures" not in f.parts and ".venv" not in str(f)]


def _strings(node: ast.AST) -> list[str]:
    """The string constants directly inside a literal collection."""
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        items = node.elts
    elif isinstance(node, ast.Dict):
        items = [k for k in node.keys if k is not None]
    else:
        return []
    return [e.value for e in items if isinstance(e, ast.Constant) and isinstance(e.value, str)]


def _is_dict_annotation(node: ast.AST | None) -> bool:
    if node is None:
        return False
    if isinstance(node, ast.Constant) and isinstance(node.value, str):  # "dict[str, int]" under __future__
        return node.value.split("[")[0].strip() in ("dict", "Dict")
    if isinstance(node, ast.Subscript):
        node = node.value
    return isinstance(node, ast.Name) and node.id in ("dict", "Dict")


def _is_literal(node: ast.AST) -> bool:
    return isinstance(node, ast.Subscript) and (
        (isinstance(node.value, ast.Name) and node.value.id == "Literal")
        or (isinstance(node.value, ast.Attribute) and node.value.attr == "Literal")
    )


def _is_enum_class(node: ast.ClassDef) -> bool:
    for base in node.bases:
        name = base.id if isinstance(base, ast.Name) else getattr(base, "attr", "")
        if name in ("Enum", "StrEnum", "IntEnum", "Flag", "IntFlag"):
            return True
    return False


def source_counts() -> dict:
    """The static figures over nccl_tune/, integration/ and microbench/."""
    wide_calls: list[str] = []
    dict_returns: list[str] = []
    enums: list[str] = []
    literals = 0
    spelled: dict[str, list[str]] = {c: [] for c in CONCEPTS}
    engine_files: set[str] = set()
    no_difference: list[str] = []
    for path in _python_files(*SOURCE_DIRS):
        rel = str(path.relative_to(ROOT))
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            where = f"{rel}:{getattr(node, 'lineno', 0)}"
            if isinstance(node, ast.Call):
                positional = [a for a in node.args if not isinstance(a, ast.Starred)]
                if len(positional) >= 8:
                    wide_calls.append(where)
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                if not node.name.startswith("_") and _is_dict_annotation(node.returns):
                    dict_returns.append(f"{where} {node.name}")
            elif isinstance(node, ast.ClassDef) and _is_enum_class(node):
                enums.append(f"{where} {node.name}")
            elif _is_literal(node):
                literals += 1
            elif isinstance(node, ast.Compare):
                words = [
                    c.value
                    for c in [node.left, *node.comparators]
                    if isinstance(c, ast.Constant) and isinstance(c.value, str)
                ]
                for concept, members in CONCEPTS.items():
                    if any(w in members for w in words):
                        spelled[concept].append(where)
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                if node.value in ENGINE_WORDS:
                    engine_files.add(rel)
                if NO_DIFFERENCE in node.value.lower():
                    no_difference.append(where)
            words = set(_strings(node))
            for concept, members in CONCEPTS.items():
                if len(words & members) >= 2:
                    spelled[concept].append(where)
    return {
        "calls_with_8_or_more_positional_args": len(wide_calls),
        "public_functions_returning_dict": len(dict_returns),
        "enum_classes": len(enums),
        "literal_annotations": literals,
        "places_each_concept_is_spelled": {c: len(v) for c, v in spelled.items()},
        "places_no_significant_difference_is_written": len(no_difference),
        "source_files_naming_an_engine": len(engine_files),
        "detail": {
            "wide_calls": wide_calls,
            "dict_returns": dict_returns,
            "enums": enums,
            "engine_files": sorted(engine_files),
        },
    }


def _prose_assert(node: ast.Assert) -> bool:
    test = node.test
    if not isinstance(test, ast.Compare) or not any(isinstance(op, (ast.In, ast.NotIn)) for op in test.ops):
        return False
    left, right = test.left, test.comparators[0]
    text = isinstance(left, ast.JoinedStr) or (isinstance(left, ast.Constant) and isinstance(left.value, str))
    return text and not isinstance(right, (ast.Tuple, ast.List, ast.Set, ast.Dict))


def test_counts() -> dict:
    """How many test functions assert on prose fragments, of all test functions."""
    total = prose = 0
    for path in _python_files(TESTS):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name.startswith("test"):
                total += 1
                if any(isinstance(n, ast.Assert) and _prose_assert(n) for n in ast.walk(node)):
                    prose += 1
    return {"test_functions": total, "asserting_on_prose": prose, "share": round(prose / total, 3) if total else 0.0}


def main(argv: list[str] | None = None) -> int:
    """Print the figures (a table, or JSON with --json)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="JSON instead of a table")
    parser.add_argument("--detail", action="store_true", help="with --json: every site")
    args = parser.parse_args(argv)
    figures = {"source": source_counts(), "tests": test_counts()}
    if not args.detail:
        figures["source"].pop("detail")
    if args.json:
        print(json.dumps(figures, indent=2))
        return 0
    src, tests = figures["source"], figures["tests"]
    rows = [
        ("calls with >= 8 positional arguments", src["calls_with_8_or_more_positional_args"]),
        ("public functions returning dict", src["public_functions_returning_dict"]),
        ("Enum classes", src["enum_classes"]),
        ("Literal annotations", src["literal_annotations"]),
        *[(f"places '{c}' is spelled", n) for c, n in src["places_each_concept_is_spelled"].items()],
        ("places 'no significant difference' is written", src["places_no_significant_difference_is_written"]),
        ("source files naming an engine", src["source_files_naming_an_engine"]),
        (
            "test functions asserting on prose",
            f"{tests['asserting_on_prose']} of {tests['test_functions']} ({tests['share']:.1%})",
        ),
    ]
    width = max(len(r[0]) for r in rows)
    for label, value in rows:
        print(f"{label:<{width}}  {value}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
