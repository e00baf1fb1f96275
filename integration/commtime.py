"""Where a tensor-parallel step's collective time goes, from every rank's host clock.

The built-in loop's `Collective` can stamp each allreduce call with the host time it was
entered and left (`time.perf_counter`, CLOCK_MONOTONIC on Linux: one clock for every
process of a host). Gathered from all ranks, the stamps split a synchronised run along
its critical path. With d_r,i = enter_r,i - exit_r,(i-1) the compute rank r did between
calls i-1 and i:

    collective_i = max_r exit_r,i - max_r enter_r,i          (last arrival until all are done)
    straggler_i  = max_r enter_r,i - max_r exit_r,(i-1) - mean_r d_r,i
                                   (the wait for the slowest rank, beyond the mean compute)

and the run's time telescopes into sum(collective) + sum(mean compute) + sum(straggler).
`collective` is what a microbenchmark that aligns the ranks before each collective and
takes the slowest rank measures (microbench.allreduce), so it is what the per-token
model predicts; the straggler wait is compute imbalance between ranks, a cost of the
compute, not of NCCL settings. `in_collective` (exit - enter, averaged over ranks) is
what a per-rank profiler would show: collective time plus the early ranks' waiting.

With the allreduces skipped (compute only), the stamps mark where each rank would have
synchronised. Had they synchronised (every rank leaving each call together), the wait
would be, as in the bulk-synchronous model where a superstep lasts as long as its
slowest rank,

    straggler_i = max_r d_r,i - mean_r d_r,i

so a compute-only run predicts the synchronised run's compute time, skew included.
Only meaningful where the collective is synchronous on the host (gloo on CPU) and every
rank runs on the same host; the loop reports nothing rather than a wrong split elsewhere.
"""

from __future__ import annotations

Stamp = tuple[float, float]  # (enter, exit), seconds on the host's monotonic clock


def _check(stamps_by_rank: list[list[Stamp]], first: int, end: int, cycles: int) -> None:
    if cycles < 1:
        raise ValueError("cycles must be at least 1")
    if not stamps_by_rank:
        raise ValueError("no ranks' stamps")
    if any(len(s) < end for s in stamps_by_rank) or not 0 <= first <= end:
        raise ValueError(
            f"calls {first}..{end} are not stamped on every rank ({[len(s) for s in stamps_by_rank]} stamps)"
        )


def synchronised_split(stamps_by_rank: list[list[Stamp]], first: int, end: int, cycles: int) -> dict:
    """Per-cycle means (ms) of a run with real collectives: calls first..end-1 over `cycles`.

    collective_ms (last arrival to all done), straggler_ms (critical-path compute beyond the
    ranks' mean, from the second call of the range on) and in_collective_ms (each rank's
    own time inside calls, averaged over ranks).
    """
    _check(stamps_by_rank, first, end, cycles)
    collective = straggler = inside = 0.0
    for i in range(first, end):
        enters = [s[i][0] for s in stamps_by_rank]
        exits = [s[i][1] for s in stamps_by_rank]
        collective += max(exits) - max(enters)
        inside += sum(x - e for e, x in zip(enters, exits)) / len(enters)
        if i > first:
            before = [s[i - 1][1] for s in stamps_by_rank]
            mean_compute = sum(e - b for e, b in zip(enters, before)) / len(enters)
            straggler += max(enters) - max(before) - mean_compute
    scale = 1000.0 / cycles
    return {
        "collective_ms": collective * scale,
        "straggler_ms": straggler * scale,
        "in_collective_ms": inside * scale,
        "calls_per_cycle": (end - first) / cycles,
    }


def straggler_estimate(stamps_by_rank: list[list[Stamp]], first: int, end: int, cycles: int) -> dict:
    """Per-cycle wait (ms) for the slowest rank had the ranks synchronised at each stamped
    call, from a run where they did not (compute only): the sum over calls of
    max_r d - mean_r d, d a rank's compute since its previous call (from the second call
    of the range on)."""
    _check(stamps_by_rank, first, end, cycles)
    total = 0.0
    for i in range(first + 1, end):
        segments = [s[i][0] - s[i - 1][1] for s in stamps_by_rank]
        total += max(segments) - sum(segments) / len(segments)
    return {"straggler_ms": total * 1000.0 / cycles, "calls_per_cycle": (end - first) / cycles}
