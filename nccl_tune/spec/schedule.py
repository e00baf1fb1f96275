"""vLLM's per-batch-size speculative schedule: the planner's best k per batch size as
`num_speculative_tokens_per_batch_size`, checked by vLLM's own rules.

vLLM (0.32: vllm/config/speculative.py, `SpeculativeConfig.num_speculative_tokens_per_batch_size`;
rules in vllm/v1/spec_decode/dynamic/utils.py, `validate_and_normalize_dynamic_sd_schedule`)
takes a list of inclusive `[range_start, range_end, k]` entries: each a 3-item sequence,
start and end positive, start <= end, k >= 0 (0: no drafts at those batch sizes), sorted
by start and non-overlapping, the first starting at 1. Its scheduler expands the list
into a lookup per batch size up to max_num_seqs: a gap carries the previous k forward,
the tail after the last range carries the last k, and every k is clamped to
`num_speculative_tokens` (which must be > 0), so that is written as the largest k.

Between two planned batch sizes B1 < B2 the schedule keeps B1's k up to B2 - 1 (a step
function from the planned points, stated); the last planned batch size's k carries on.
Equal neighbours are merged into one range.
"""

from __future__ import annotations

import importlib.util
import json
import os
from collections.abc import Callable, Sequence

from nccl_tune import fileio
from nccl_tune.errors import NcclTuneError

VLLM_RULES = "vllm/v1/spec_decode/dynamic/utils.py"
KEY = "num_speculative_tokens_per_batch_size"


def ranges(best: Sequence[tuple[int, int]]) -> list[list[int]]:
    """(batch size, best k) pairs -> merged inclusive [start, end, k] ranges, the first
    starting at 1 (the smallest planned batch size's k covers the sizes below it)."""
    pairs = sorted((int(b), int(k)) for b, k in best)
    if not pairs or any(b < 1 or k < 0 for b, k in pairs) or len({b for b, _ in pairs}) != len(pairs):
        raise ValueError("a schedule needs distinct batch sizes >= 1 with step counts >= 0")
    out: list[list[int]] = []
    for i, (batch, k) in enumerate(pairs):
        start = 1 if i == 0 else batch
        end = pairs[i + 1][0] - 1 if i + 1 < len(pairs) else batch
        if out and out[-1][2] == k:
            out[-1][1] = end  # equal neighbours: one range
        else:
            out.append([start, end, k])
    return out


def check(schedule: object) -> list[tuple[int, int, int]]:
    """The project's copy of vLLM's rules (see the module doc); ValueError naming the rule."""
    if not isinstance(schedule, list) or not schedule:
        raise ValueError(f"{KEY} must be a non-empty list of [start, end, k] entries")
    parsed = []
    for entry in schedule:
        if not isinstance(entry, (list, tuple)) or len(entry) != 3:
            raise ValueError(f"each {KEY} entry must be [start, end, k], got {entry!r}")
        if not all(isinstance(v, int) and not isinstance(v, bool) for v in entry):
            raise ValueError(f"{KEY} entries are integers, got {entry!r}")
        start, end, k = entry
        if start <= 0 or end <= 0:
            raise ValueError(f"batch-size range ({start}, {end}) must be positive")
        if start > end:
            raise ValueError(f"batch-size range start must be <= end in {entry!r}")
        if k < 0:
            raise ValueError(f"step counts must be >= 0, got {entry!r}")
        parsed.append((start, end, k))
    parsed.sort()
    previous = 0
    for start, end, _ in parsed:
        if start <= previous:
            raise ValueError("batch-size ranges must not overlap")
        previous = end
    if parsed[0][0] != 1:
        raise ValueError("the first batch-size range must start at 1")
    return parsed


def vllm_rules():
    """(the installed vLLM's rules module or None, what was used): its file executed on its
    own. Importing `vllm` takes seconds to minutes (torch, the engine); the rules file
    imports nothing, so loading it alone is of bounded cost."""
    try:
        spec = importlib.util.find_spec("vllm")
    except (ImportError, ValueError):
        spec = None
    if spec is None or not spec.submodule_search_locations:
        return None, "the project's copy of vLLM's rules (vLLM is not installed)"
    path = os.path.join(list(spec.submodule_search_locations)[0], *VLLM_RULES.split("/")[1:])
    try:
        loader_spec = importlib.util.spec_from_file_location("_nccl_tune_vllm_sd_rules", path)
        module = importlib.util.module_from_spec(loader_spec)
        loader_spec.loader.exec_module(module)
        module.validate_and_normalize_dynamic_sd_schedule  # noqa: B018 - present, or fall back
    except (OSError, ImportError, AttributeError, SyntaxError) as exc:
        return None, (f"the project's copy of vLLM's rules ({path} could not be loaded alone: {type(exc).__name__})")
    return module, f"vLLM's validate_and_normalize_dynamic_sd_schedule ({path})"


def vllm_validator() -> tuple[Callable | None, str]:
    """vLLM's own validation function (or None) and what was used (see vllm_rules)."""
    module, how = vllm_rules()
    return (module.validate_and_normalize_dynamic_sd_schedule if module else None), how


def validate(schedule: list) -> tuple[list[tuple[int, int, int]], str]:
    """The schedule checked by the project's rules (integers only: stricter than vLLM's,
    which converts with int()) and by vLLM's own function where it loads, which must read
    it the same way; ValueError with the rule broken. Returns (ranges, what checked it)."""
    fn, how = vllm_validator()
    ours = check(schedule)
    if fn is not None:
        try:
            theirs = [tuple(e) for e in fn(json.loads(json.dumps(schedule)))]
        except ValueError as exc:
            raise ValueError(f"vLLM refuses the schedule: {exc}") from None
        if theirs != ours:
            raise ValueError(f"vLLM reads the schedule as {theirs}, the project as {ours}")
    return ours, how


def read_base(text: str) -> dict:
    """--speculative-config-base: a JSON object, or a file holding one, read by the input
    policy (nccl_tune.fileio: UTF-8, size, depth, finite numbers). NcclTuneError naming
    the file (or the option, for JSON given inline)."""
    option = "--speculative-config-base"
    what = "speculative config"
    inline = text.lstrip().startswith("{")
    where = option if inline else text
    base = fileio.parse_json(text, path=option, what=what) if inline else fileio.load_json(text, what=what)
    if not isinstance(base, dict):
        raise NcclTuneError("expected a JSON object (the speculative config)", path=where)
    if not (base.get("method") or base.get("model")):
        raise NcclTuneError(
            "give the speculative method and draft model (e.g. "
            '{"method": "eagle3", "model": "DRAFT"}); the schedule only sets the k\'s',
            path=where,
        )
    return base


def config(base: dict, schedule: list[list[int]]) -> dict:
    """The speculative config: the user's fields, num_speculative_tokens = the largest k,
    and the schedule. ValueError when every k is 0 (no speculation at any batch size:
    vLLM needs num_speculative_tokens > 0; run without --speculative-config)."""
    largest = max(k for _, _, k in schedule)
    if largest == 0:
        raise ValueError(
            "do not speculate at any planned batch size: no speculative config to "
            "write (run vLLM without --speculative-config)"
        )
    out = {key: value for key, value in base.items() if key not in (KEY, "num_speculative_tokens")}
    out["num_speculative_tokens"] = largest
    out[KEY] = [list(entry) for entry in schedule]
    return out


def from_batches(batches) -> tuple[list[list[int]], list[str]]:
    """The schedule from the planner's per-batch plans (nccl_tune.spec.planner.BatchPlan):
    each planned batch size's best k, merged; notes on what it rests on."""
    notes = []
    unpriced = [b.batch for b in batches if b.plain is None]
    if unpriced:
        notes.append(
            "plain decoding was not priced at batch "
            + ", ".join(map(str, unpriced))
            + ": k = 0 was not considered there (--decode-ms D1,D2@B1,B2 prices it)"
        )
    extrapolated = [b.batch for b in batches if b.best.extrapolated]
    if extrapolated:
        notes.append(
            "the best k at batch " + ", ".join(map(str, extrapolated)) + " rests on "
            "EXTRAPOLATED verify times; measure it with validate --concurrency"
        )
    notes.append(
        "between planned batch sizes the smaller one's k holds; beyond the largest, "
        "its k (vLLM carries the last range on)"
    )
    return ranges([(b.batch, b.best.k) for b in batches]), notes


def export(path: str, base: dict, batches) -> dict:
    """Write the speculative config for vLLM (atomically) from the per-batch plans, checked
    first; {"written": False, "reason": ...} when there is nothing to speculate with."""
    from nccl_tune.fileio import write_atomic

    schedule, notes = from_batches(batches)
    checked, how = validate(schedule)
    info = {"path": path, "schedule": schedule, "checked_by": how, "notes": notes}
    try:
        cfg = config(base, [list(e) for e in checked])
    except ValueError as exc:
        return {**info, "written": False, "reason": str(exc), "config": None}
    text = json.dumps(cfg) + "\n"  # one line: --speculative-config "$(cat FILE)"
    validate(json.loads(text)[KEY])  # what the file says is what was checked
    write_atomic(path, text)
    return {**info, "written": True, "reason": None, "config": cfg}


def k_at(schedule: list, batch: int, num_speculative_tokens: int) -> int:
    """The k vLLM's scheduler runs at `batch` sequences (its dense lookup, the project's
    copy): the range holding `batch`, else the last range that starts below it (gaps and
    the tail carry the previous k), clamped to num_speculative_tokens."""
    k = None
    for start, _end, value in check(schedule):
        if start <= batch:
            k = value
    return min(k, num_speculative_tokens)
