"""The verdicts of bench/gpu_smoke.sh, from the files its steps left in one folder.

Per step NAME the folder holds NAME.out and NAME.err (what it printed), NAME.rc (its exit
code), NAME.bound (the seconds it was allowed), NAME.skip or NAME.cut (why it did not
run: no GPU, a failed preflight, no time left before the deadline), NAME.jsonl (the
microbench's records) and NAME.nccl/ (the NCCL log it captured, kept). steps.txt lists
the steps in the order they ran.

Each line starts with a word: PASS, FAIL (the run exits 1), CUT (a step stopped or never
started for lack of time: the run exits 1), SKIP (nothing to check here: no GPU, or an
NCCL without the feature), INFO (a figure without a verdict: at world size 1 NCCL runs
no algorithm, so comparisons between modes say nothing about NCCL and decide nothing).
Failed and cut steps are followed by what they said about themselves (bench.smoke.digest).

    python -m bench.smoke.checks FOLDER
"""

from __future__ import annotations

import json
import math
import os
import re
import sys
from dataclasses import dataclass

from bench.smoke.digest import digest, read_lines

BENCH_STEPS = ("graph", "eager1", "eager10")
LOOP_STEPS = ("loop64", "loopbf16")
SKIP_CODE = 77  # a step that skipped itself (the automake convention)
SHORT_HEAD_START_SHARE = 0.05  # at most this share of one-op eager samples may be short


@dataclass(frozen=True)
class Verdict:
    """One line of the report."""

    status: str  # PASS | FAIL | CUT | SKIP | INFO
    what: str
    detail: str = ""

    def line(self) -> str:
        """The printed line."""
        return f"{self.status:4} {self.what}" + (f": {self.detail}" if self.detail else "")


def _read(folder: str, name: str) -> str | None:
    try:
        with open(os.path.join(folder, name), encoding="utf-8", errors="replace") as handle:
            return handle.read().strip()
    except OSError:
        return None


def _int(text: str | None) -> int | None:
    try:
        return int(text) if text is not None else None
    except ValueError:
        return None


def step_names(folder: str) -> list[str]:
    """The steps in the order the smoke ran (or skipped, or cut) them."""
    text = _read(folder, "steps.txt") or ""
    return list(dict.fromkeys(n for n in text.split() if n))


def step_verdict(folder: str, name: str) -> Verdict:
    """How a step ended: SKIP / CUT with the reason the smoke wrote, else by its exit code
    (0 PASS; 0 or 77 with a line 'SKIP (reason)' of its own SKIP; 124/137 CUT: the
    smoke's bound stopped it; anything else FAIL)."""
    for suffix, status in ((".skip", "SKIP"), (".cut", "CUT")):
        reason = _read(folder, name + suffix)
        if reason is not None:
            return Verdict(status, name, reason)
    rc, bound = _int(_read(folder, name + ".rc")), _read(folder, name + ".bound")
    out = (_read(folder, name + ".out") or "").splitlines()
    said = [text.strip() for text in out if text.strip()]
    skipped = [text for text in said if text.startswith("SKIP (") and text.endswith(")")]
    if rc in (0, SKIP_CODE) and skipped:
        return Verdict("SKIP", name, skipped[-1][len("SKIP (") : -1])
    if rc == 0:
        return Verdict("PASS", name, said[-1] if said else "exit code 0")
    if rc in (124, 137):
        return Verdict("CUT", name, f"stopped at its bound of {bound} s (exit code {rc})")
    return Verdict("FAIL", name, f"exit code {rc}" if rc is not None else "no exit code recorded")


def records(folder: str, name: str) -> list[dict]:
    """The microbench records a step wrote (unreadable lines skipped)."""
    out = []
    for line in (_read(folder, name + ".jsonl") or "").splitlines():
        try:
            item = json.loads(line)
        except ValueError:
            continue
        if isinstance(item, dict):
            out.append(item)
    return out


def _p50(rs: list[dict]) -> float | None:
    ok = [r for r in rs if r.get("status") == "ok"]
    return (ok[0].get("lat_us") or {}).get("p50") if ok else None


def _timing(rs: list[dict]) -> dict:
    return (rs or [{}])[0].get("timing") or {}


def nccl_log_lines(folder: str, name: str) -> dict[str, list[str]]:
    """The `# nccl-log CELL FILE: LINE` lines a step printed (--show-nccl-log), by cell,
    and the set of files under the key None."""
    by_cell: dict = {None: []}
    for line in (_read(folder, name + ".err") or "").splitlines():
        m = re.match(r"# nccl-log (\S+) (\S+): (.*)$", line)
        if m:
            by_cell.setdefault(m.group(1), []).append(m.group(3))
            if m.group(2) not in by_cell[None]:
                by_cell[None].append(m.group(2))
    return by_cell


def bench_checks(folder: str) -> list[Verdict]:
    """(a)-(d) of the smoke's header, from the microbench steps' records."""
    graph, eager1, eager10 = (records(folder, n) for n in BENCH_STEPS)
    every = graph + eager1 + eager10
    if not every:  # one line, not a dozen that all say the same
        return [Verdict("FAIL", "(a)-(d) the microbench steps", "no records at all (see what they said below)")]
    v: list[Verdict] = []
    # (a) graph mode end to end, two cells, each on its own group
    cells = {r.get("cell") for r in graph}
    ok = [r for r in graph if r.get("status") == "ok" and r.get("correct") is True]
    v.append(
        Verdict(
            "PASS" if len(ok) == 2 and cells == {"baseline", "c-proto-simple"} else "FAIL",
            "(a) graph all_gather, two cells on fresh groups: captured, replayed, exact",
            ", ".join(f"{r.get('cell')} {r.get('status')} correct={r.get('correct')}" for r in graph) or "no records",
        )
    )
    confirmed = {r.get("cell"): (r.get("effective") or {}).get("confirmed") for r in every}
    v.append(
        Verdict(
            "PASS" if every and all(c is None for c in confirmed.values()) else "FAIL",
            "(a) effective.confirmed is None at world 1 (nothing ran to confirm, never False)",
            str(confirmed),
        )
    )
    # (b) log files of one process; Init COMPLETE per cell; PROTO only in its cell
    by_cell = nccl_log_lines(folder, "graph")
    files = by_cell.pop(None)
    pids = {f.split(".")[-2] for f in files if f.count(".") >= 3}
    v.append(
        Verdict(
            "PASS" if files and len(pids) == 1 else "FAIL", "(b) NCCL log files of one process (%p)", str(sorted(files))
        )
    )
    for cell in ("baseline", "c-proto-simple"):
        lines = by_cell.get(cell, [])
        v.append(
            Verdict(
                "PASS" if any("Init COMPLETE" in x for x in lines) else "FAIL",
                f"(b) cell {cell}: a communicator of its own (Init COMPLETE in its lines)",
                f"{len(lines)} lines",
            )
        )
    proto = {c: any("NCCL_PROTO set by environment to Simple" in x for x in lines) for c, lines in by_cell.items()}
    v.append(
        Verdict(
            "PASS" if proto.get("c-proto-simple") and not proto.get("baseline") else "FAIL",
            "(b) 'NCCL_PROTO set by environment to Simple' only in the cell that set it",
            str(proto),
        )
    )
    # (c) the libnccl loaded
    ver = (graph or eager1 or [{}])[0].get("versions") or {}
    log = (graph or [{}])[0].get("nccl_log") or {}
    v.append(
        Verdict(
            "PASS" if ver.get("nccl_library") and ver.get("nccl_library_version") else "FAIL",
            "(c) libnccl mapped and its ncclGetVersion",
            f"{ver.get('nccl_library')} {ver.get('nccl_library_version')} ({ver.get('nccl_source')})",
        )
    )
    v.append(
        Verdict(
            "INFO",
            "(c) torch.cuda.nccl.version() / NCCL's log line",
            f"{ver.get('nccl_build')} / {ver.get('nccl_log')}"
            + (f"; DIFFER: {ver['nccl_note']}" if ver.get("nccl_note") else "; same"),
        )
    )
    v.append(
        Verdict(
            "INFO",
            "(c) ncclResetDebugInit",
            f"{log.get('reset_debug_init')}: {log.get('note')}; per-collective lines {log.get('per_collective_lines')}",
        )
    )
    # (d) timing sanity
    samples = [s for r in every for s in (r.get("samples_us") or [])]
    v.append(
        Verdict(
            "PASS"
            if samples and all(isinstance(s, (int, float)) and math.isfinite(s) and s > 0 for s in samples)
            else "FAIL",
            "(d) every sample positive and finite",
            f"{len(samples)} samples",
        )
    )
    methods = {r.get("timing_method") for r in every}
    v.append(Verdict("PASS" if methods == {"device-aligned"} else "FAIL", "(d) timing_method recorded", str(methods)))
    v.append(head_start_verdict(eager1))
    for name, rs in (("graph", [r for r in graph if r.get("cell") == "baseline"]), ("eager10", eager10)):
        if not rs:
            continue
        t = _timing(rs)
        v.append(
            Verdict(
                "INFO",
                f"(d) {name}: head start achieved / intended",
                f"{t.get('head_start_us')} / {t.get('head_start_intended_us')} us, "
                f"{t.get('head_start_short')} sample(s) whose host enqueue outlasted it"
                + (" (10 ops per sample: host-bound by design)" if name == "eager10" else ""),
            )
        )
    g, e1, e10 = _p50([r for r in graph if r.get("cell") == "baseline"]), _p50(eager1), _p50(eager10)
    host = _timing(eager1).get("host_enqueue_us")
    v.append(
        Verdict(
            "INFO",
            "(d) graph per-op p50 / eager p50 (world 1: no verdict, NCCL runs no algorithm)",
            f"graph {g} us, eager {e1} us",
        )
    )
    v.append(
        Verdict(
            "INFO",
            "(d) eager p50 with 1 op / with 10 ops per sample / host enqueue per op (world 1: no verdict)",
            f"{e1} / {e10} / {host} us",
        )
    )
    return v


def head_start_verdict(eager1: list[dict]) -> Verdict:
    """PASS when the one-op eager samples got a measured head start that the host's enqueue
    outlasted in at most SHORT_HEAD_START_SHARE of them (else host launch time is inside)."""
    what = "(d) eager, 1 op: the measured head start covered the host's enqueue"
    t = _timing(eager1)
    achieved, short = t.get("head_start_us"), t.get("head_start_short")
    iters = (eager1 or [{}])[0].get("iters")
    if not eager1:
        return Verdict("FAIL", what, "no records")
    if achieved is None or short is None or not iters:
        return Verdict(
            "INFO", what, f"no measured head start ({t.get('head_start_basis')}; torch without torch.cuda._sleep?)"
        )
    share = short / iters
    return Verdict(
        "PASS" if share <= SHORT_HEAD_START_SHARE else "FAIL",
        what,
        f"achieved {achieved} us (min {t.get('head_start_min_us')}, intended "
        f"{t.get('head_start_intended_us')}; GPU {t.get('gpu_cycles_per_us')} cycles/us, "
        f"{t.get('gpu_cycles_per_us_before_loop')} right before the loop); host after "
        f"the wait {t.get('host_after_head_start_us')} us; short in {short} of {iters}",
    )


def loop_checks(folder: str) -> list[Verdict]:
    """(e): the built-in loop's JSON line."""
    v = []
    for name, want in (("loop64", True), ("loopbf16", None)):
        lines = [text for text in (_read(folder, name + ".out") or "").splitlines() if text.startswith("{")]
        try:
            rec = json.loads(lines[-1])
        except (IndexError, ValueError):
            rec = None
        rc = _int(_read(folder, name + ".rc"))
        if rc != 0 or not isinstance(rec, dict):
            v.append(Verdict("FAIL", f"(e) {name}", f"exit code {rc}, no JSON record"))
        elif want:
            v.append(
                Verdict(
                    "PASS" if rec.get("matches_greedy") is True and rec.get("backend") == "nccl" else "FAIL",
                    "(e) float64 --check-greedy on NCCL: matches_greedy",
                    f"{rec.get('matches_greedy')}, tok/s {rec.get('tok_s')}, nccl "
                    f"{(rec.get('versions') or {}).get('nccl')}",
                )
            )
        else:
            v.append(
                Verdict(
                    "PASS" if rec.get("dtype") == "bfloat16" else "FAIL",
                    "(e) bf16 run completes",
                    f"tok/s {rec.get('tok_s')}, accept len {rec.get('accept_len')}",
                )
            )
    return v


def report(folder: str) -> tuple[list[str], int]:
    """The printed lines and the exit code (1 when anything FAILed or was CUT)."""
    names = step_names(folder)
    steps = {n: step_verdict(folder, n) for n in names}
    lines = ["== steps"] + [v.line() for v in steps.values()]
    for v in steps.values():  # NCCL's warnings matter even when the step passed
        if v.status == "PASS":
            warns = [
                text for text in digest(read_lines([os.path.join(folder, v.what + ".err")])) if "NCCL WARN" in text
            ]
            lines += [Verdict("INFO", f"{v.what}: NCCL said", w).line() for w in warns[:3]]
    ran = lambda group: [n for n in group if _read(folder, n + ".rc") is not None]  # noqa: E731
    checks: list[Verdict] = []
    if ran(BENCH_STEPS):
        checks += bench_checks(folder)
    if ran(LOOP_STEPS):
        checks += loop_checks(folder)
    lines.append("== checks (world size 1: these prove the CUDA paths, not NCCL's algorithms)")
    lines += [c.line() for c in checks] or ["SKIP no step that checks look at ran"]
    bad = [v for v in steps.values() if v.status in ("FAIL", "CUT")]
    started = [v for v in bad if _read(folder, v.what + ".rc") is not None]
    if started:
        lines.append("== what the failed steps said")
        for v in started:
            paths = [os.path.join(folder, v.what + s) for s in (".err", ".out", ".nccl")]
            said = digest(read_lines(paths))
            lines.append(f"-- {v.what} ({v.status}: {v.detail})")
            lines += [f"  {text}" for text in said] or ["  (nothing in its output says why)"]
    failed = [f"{v.what} {v.status.lower()}" for v in bad] + [c.what for c in checks if c.status == "FAIL"]
    named = "; ".join(failed[:8]) + (f"; and {len(failed) - 8} more" if len(failed) > 8 else "")
    lines.append(f"{len(failed)} failure(s)" + (": " + named if failed else ""))
    return lines, 1 if failed else 0


def main(argv: list[str]) -> int:
    """Print the report of the folder argv[0]; the exit code says whether anything failed."""
    lines, code = report(argv[0])
    print("\n".join(lines), flush=True)
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
