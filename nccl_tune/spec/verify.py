"""Verify cost against tokens per forward: measured points, MoE-aware and dense models.

- interp: measured points, linear between them. Outside them a token count is
  `extrapolated` (callers leave it out, or with --extrapolate mark it): never silent.
- moe: t(n) = fixed + per_expert x E (1 - (1 - K/E)^n) + comm(n). A MoE layer's weights
  are read once per distinct routed expert that some token in the forward uses; with E
  experts, top-K routing and routing assumed uniform and independent across tokens (the
  stated assumption), n tokens touch E (1 - (1 - K/E)^n) distinct experts on average. So
  the cost rises steeply for the first extra tokens and then flattens.
- dense: t(n) = fixed + per_token x n + comm(n).

comm(n) is the collectives time of a forward of n tokens (nccl_tune.model.per_token: layers x
collectives x latency(n x hidden x dtype bytes)), so an NCCL profile changes the verify
cost at every n. The free parameters (fixed, per_expert / per_token) are fitted by least
squares to the given points minus comm; with two points the fit is exact. Beyond the
largest fitted token count a model's value is marked `extrapolated` too (model-based).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

INTERP, MOE, DENSE = "interp", "moe", "dense"


def expected_experts(tokens: float, experts: int, topk: int) -> float:
    """Expected distinct experts that `tokens` tokens route to: E (1 - (1 - K/E)^n).

    Assumes each token picks its top-K uniformly and independently of the others.
    """
    if experts < 1 or not 1 <= topk <= experts:
        raise ValueError(f"need experts >= 1 and 1 <= topk <= experts, got {experts}, {topk}")
    if tokens < 0:
        raise ValueError("tokens must be >= 0")
    return experts * (1.0 - (1.0 - topk / experts) ** tokens)


def simulate_distinct_experts(tokens: int, experts: int, topk: int, trials: int, seed: int = 0) -> float:
    """Mean distinct experts over `trials` draws of top-K routing (K distinct experts per
    token, uniformly at random): a check of expected_experts."""
    import random

    rng = random.Random(seed)
    total = 0
    for _ in range(trials):
        seen: set[int] = set()
        for _ in range(tokens):
            seen.update(rng.sample(range(experts), topk))
        total += len(seen)
    return total / trials


def _no_comm(tokens: int) -> float:
    return 0.0


@dataclass
class VerifyCurve:
    """Verify time (ms) of a target forward of n tokens, and how it was obtained."""

    kind: str  # interp | moe | dense
    points: tuple[tuple[int, float], ...]  # (tokens, ms) the curve was built or fitted from
    fixed_ms: float = 0.0
    slope_ms: float = 0.0  # per expert (moe) or per token (dense)
    experts: int | None = None
    topk: int | None = None
    comm: Callable[[int], float] = _no_comm
    comm_note: str | None = None
    linear_beyond: bool = False  # interp: extrapolate linearly (--extrapolate) instead of refusing
    sources: list[str] = field(default_factory=list)
    residual_ms: float | None = None  # rms misfit of the fitted model at its points
    covers_all: bool = False  # a stated model for every n (recommend's flat-compute default)
    # batch sizes (nccl_tune.spec.saturation): a forward of n tokens over b sequences takes
    # max(curve(n) + per_seq_ms x (b - 1), sat_t1_ms x n / sat_tokens)
    per_seq_ms: float = 0.0
    sat_tokens: float | None = None
    sat_t1_ms: float = 0.0
    sat_note: str | None = None

    @property
    def flat(self) -> bool:
        """One point and no model: the same time at every token count."""
        return self.kind == INTERP and len(self.points) == 1

    def extrapolated(self, tokens: int) -> bool:
        """True when `tokens` lies beyond the points this curve was built or fitted from."""
        if self.flat or self.covers_all:
            return False
        return not self.points[0][0] <= tokens <= self.points[-1][0]

    def usable(self, tokens: int) -> bool:
        """False when an interp curve would have to extrapolate and was not allowed to."""
        return self.kind != INTERP or self.linear_beyond or not self.extrapolated(tokens)

    def shape(self, tokens: float) -> float:
        """The model's growth term per unit slope: distinct experts (moe) or tokens (dense)."""
        if self.kind == MOE:
            return expected_experts(tokens, self.experts, self.topk)
        return float(tokens)

    def __call__(self, tokens: int) -> float:
        return self.at(tokens, 1)

    def at(self, tokens: int, batch: int = 1) -> float:
        """A forward of `tokens` tokens over `batch` sequences (n = batch x (k + 1) for a
        verify): the curve, each sequence beyond the first (its own KV reads and work)
        and, once compute-bound, the saturation line."""
        base = self.base(tokens) + self.per_seq_ms * (batch - 1)
        if self.sat_tokens:
            return max(base, self.sat_t1_ms * tokens / self.sat_tokens)
        return base

    def base(self, tokens: int) -> float:
        """The curve without the saturation term."""
        if self.kind != INTERP:
            return self.fixed_ms + self.slope_ms * self.shape(tokens) + self.comm(tokens)
        pts = self.points
        if len(pts) == 1:
            return pts[0][1]
        if tokens <= pts[0][0]:
            (t0, m0), (t1, m1) = pts[0], pts[1]
        elif tokens >= pts[-1][0]:
            (t0, m0), (t1, m1) = pts[-2], pts[-1]
        else:
            i = next(j for j, (t, _) in enumerate(pts) if t >= tokens)
            (t0, m0), (t1, m1) = pts[i - 1], pts[i]
        return max(0.0, m0 + (m1 - m0) * (tokens - t0) / (t1 - t0))

    def describe(self) -> str:
        """One line: which model, fitted to what (and the saturation term, if any)."""
        text = self._describe_base()
        if self.per_seq_ms:
            text += f"; + {self.per_seq_ms:.3f} ms per sequence beyond the first"
        if self.sat_tokens:
            text += (
                f"; saturation: at least {self.sat_t1_ms:.3f} ms x n / {self.sat_tokens:.3g} "
                f"(compute-bound beyond {self.sat_tokens:.3g} tokens: {self.sat_note})"
            )
        return text

    def _describe_base(self) -> str:
        pts = ", ".join(f"{m:g} ms @ {t}" for t, m in self.points)
        src = f" ({'; '.join(self.sources)})" if self.sources else ""
        comm = (
            f"; comm(n) {self.comm_note}"
            if self.comm_note
            else "; comm(n) not separated (inside the fitted costs; --layers models it)"
        )
        if self.flat:
            return (
                f"flat: {self.points[0][1]:g} ms at any token count (dense-like; give "
                f"V1,V2@T1,T2 for a verify that rises with tokens){src}"
            )
        if self.kind == INTERP:
            beyond = (
                "linear beyond them (--extrapolate, marked *)"
                if self.linear_beyond
                else "step counts beyond them are left out (--extrapolate, or a model)"
            )
            return f"measured points {pts} tokens, linear between them; {beyond}{src}"
        fit = f"fitted to {pts} tokens" + (
            f", rms misfit {self.residual_ms:.3f} ms" if self.residual_ms is not None and len(self.points) > 2 else ""
        )
        if self.kind == MOE:
            return (
                f"MoE: {self.fixed_ms:.3f} ms + {self.slope_ms:.4f} ms x distinct experts "
                f"E(1-(1-K/E)^n) with E = {self.experts}, K = {self.topk} (uniform routing "
                f"assumed); {fit}{src}{comm}; rows beyond {self.points[-1][0]} tokens "
                "are model extrapolation (marked *)"
            )
        return (
            f"dense: {self.fixed_ms:.3f} ms + {self.slope_ms:.4f} ms x tokens; "
            f"{fit}{src}{comm}; rows beyond {self.points[-1][0]} tokens are model "
            "extrapolation (marked *)"
        )

    def to_dict(self) -> dict:
        """JSON-ready form."""
        return {
            "kind": self.kind,
            "description": self.describe(),
            "points": [list(p) for p in self.points],
            "fixed_ms": self.fixed_ms if self.kind != INTERP else None,
            "slope_ms": self.slope_ms if self.kind != INTERP else None,
            "slope_per": {MOE: "distinct expert", DENSE: "token"}.get(self.kind),
            "experts": self.experts,
            "topk": self.topk,
            "comm": self.comm_note,
            "rms_misfit_ms": self.residual_ms,
            "per_sequence_ms": self.per_seq_ms,
            "saturation_tokens": self.sat_tokens,
            "saturation": self.sat_note,
        }


def _distinct(points: Sequence[tuple[int, float]]) -> tuple[tuple[int, float], ...]:
    pairs = sorted((int(t), float(m)) for t, m in points)
    if any(t <= 0 for t, _ in pairs) or any(not m > 0 for _, m in pairs):
        raise ValueError("token counts and verify times must be positive")
    if len({t for t, _ in pairs}) != len(pairs):
        raise ValueError("token counts must be distinct")
    return tuple(pairs)


def measured_curve(
    points: Sequence[tuple[int, float]], linear_beyond: bool = False, sources: list[str] | None = None
) -> VerifyCurve:
    """Measured points, interpolated (never silently extrapolated)."""
    if not points:
        raise ValueError("give at least one verify time")
    return VerifyCurve(INTERP, _distinct(points), linear_beyond=linear_beyond, sources=list(sources or []))


def fit_curve(
    kind: str,
    points: Sequence[tuple[int, float]],
    *,
    experts: int | None = None,
    topk: int | None = None,
    comm: Callable[[int], float] | None = None,
    comm_note: str | None = None,
    sources: list[str] | None = None,
) -> VerifyCurve:
    """Least-squares fixed + slope x shape(n) to the points minus comm(n) (moe or dense).

    One point: no slope can be fitted; ValueError. The fitted slope is kept >= 0 (a
    verify does not get cheaper with more tokens); the fixed cost then absorbs the rest.
    """
    pts = _distinct(points)
    if len(pts) < 2:
        raise ValueError(
            f"a {kind} verify model needs the verify time at two token counts at "
            "least (e.g. --decode-ms for 1 token and --verify-ms V@T)"
        )
    curve = VerifyCurve(
        kind, pts, experts=experts, topk=topk, comm=comm or _no_comm, comm_note=comm_note, sources=list(sources or [])
    )
    xs = [curve.shape(t) for t, _ in pts]
    ys = [m - curve.comm(t) for t, m in pts]
    n = len(pts)
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx if sxx > 0 else 0.0
    slope = max(slope, 0.0)
    curve.slope_ms = slope
    curve.fixed_ms = my - slope * mx
    curve.residual_ms = (sum((curve(t) - m) ** 2 for t, m in pts) / n) ** 0.5
    if curve.fixed_ms + curve.comm(pts[0][0]) <= 0:
        raise ValueError("the fitted verify model has no positive fixed cost: check the verify times against comm(n)")
    return curve


def modelled_comm(
    layers: int,
    hidden: int,
    dtype: str,
    nranks: int,
    topology: str,
    env: dict[str, str] | None = None,
    per_layer: int = 2,
    extra: int = 1,
) -> tuple[Callable[[int], float], str]:
    """comm(n) in ms from nccl_tune.model.costmodel (MODELLED, not measured) and its description:
    layers x per_layer + extra allreduces of n x hidden x dtype bytes (nccl_tune.model.per_token)."""
    from nccl_tune.model import costmodel
    from nccl_tune.model import per_token as model

    collectives = model.collectives_per_forward(layers, per_layer, extra)
    cache: dict[int, float] = {}

    def comm(tokens: int) -> float:
        if tokens not in cache:
            nbytes = model.message_bytes(tokens, hidden, dtype)
            cache[tokens] = collectives * costmodel.latency_us(nbytes, nranks, topology, env) / 1000.0
        return cache[tokens]

    comm(1)  # refuse a bad topology or dtype now, not mid-plan
    where = "under the given NCCL settings" if env else "under NCCL's defaults"
    return comm, (
        f"MODELLED by nccl_tune.model.costmodel ({topology}, {nranks} ranks, {where}): "
        f"{collectives} allreduces of n x {hidden} x {model.dtype_bytes(dtype)} B"
    )


def comm_ranges(
    comm: Callable[[int], float],
    layers: int,
    hidden: int,
    dtype: str,
    nranks: int,
    topology: str,
    env: dict[str, str] | None,
    tokens,
    per_layer: int = 2,
    extra: int = 1,
) -> dict:
    """What `modelled_comm`'s comm(n) rests on at each token count in `tokens`: per
    allreduce the model's time, NCCL's choice, whether it is calibrated and its range, as
    `model predict` gives them (nccl_tune.model.calibrate.predict_rows, ranges from the
    published machines of the kind), and comm(n) with that range times the allreduces
    per forward. No fit of the machine is used here, so nothing is calibrated."""
    from nccl_tune.model import calibrate, references
    from nccl_tune.model import per_token as model

    collectives = model.collectives_per_forward(layers, per_layer, extra)
    tokens = sorted(set(tokens))
    rows = calibrate.predict_rows(
        topology,
        nranks,
        [model.message_bytes(n, hidden, dtype) for n in tokens],
        dict(env or {}),
        None,
        None,
        references.load(),
    )
    out = [
        {
            "tokens": n,
            **row,
            "comm_ms": comm(n),
            "comm_range_ms": ([collectives * v / 1000.0 for v in row["range_us"]] if row["range_us"] else None),
        }
        for n, row in zip(tokens, rows)
    ]
    return {"collectives": collectives, "calibrated": all(r["calibrated"] for r in out), "rows": out}
