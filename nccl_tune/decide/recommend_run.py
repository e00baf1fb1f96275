"""`recommend` as one library call: RecommendRequest -> run -> RecommendResult.

The command parses its options into a frozen RecommendRequest; `run` does the rest, in
this order: measured (or simulated) records when given, else the embedded cost model
(a `model fit` file's constants when given) with the published range of the kind; the
engine's path for each decode allreduce (nccl_tune.model.engines.report); with step
counts, the speculative planner under the baseline and the recommended cell
(nccl_tune.spec.profile_steps); the release check and the exports (.env, conf file,
tuner CSV: nccl_tune.decide.export, which renders recommendation.export_row's cell and
tuner_rows' rules); the plot. The result renders itself as `--json` (`to_dict`); the
command renders the text.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from nccl_tune import store
from nccl_tune.decide import export, recommendation
from nccl_tune.decide.recommendation import MODELLED, Analysis
from nccl_tune.errors import NcclTuneError
from nccl_tune.model import calibrate, costmodel, engines, per_token, references
from nccl_tune.model.per_token import Workload
from nccl_tune.model.ranges import Range
from nccl_tune.nccl import releases
from nccl_tune.spec.accept import Acceptance
from nccl_tune.spec.options import SpecInputs
from nccl_tune.spec.profile_steps import SpecComparison, compare_profiles

# costmodel's doc: which constants were fitted to public tables.
MODEL_CALIBRATION = (
    "its host-memory per-hop and bandwidth and Simple-over-PCIe constants were "
    "fitted to published tables, and real machines of one kind differ by 1.5x and more: "
    "a published range (or a `model fit` of your machine) says by how much"
)
FILE_OPTIONS = {"export": "--export", "export_conf": "--export-conf", "tuner_csv": "--tuner-csv", "plot": "--plot"}


@dataclass(frozen=True)
class RecommendRequest:
    """What `recommend` was asked, its options checked (the command builds it)."""

    workload: Workload
    collectives_per_layer: int = 2
    extra_collectives: int = 1
    results: tuple[str, ...] = ()
    topology: str = "auto"
    engine: str = "none"
    cc: str | None = None  # the GPUs' compute capability (--arch, or this machine's)
    model_path: str | None = None
    baseline_tok_s: float | None = None
    steps: tuple[int, ...] = ()  # --spec-steps; () plans no speculation
    spec: SpecInputs | None = None
    verify_model: str = "auto"
    moe_experts: int | None = None
    moe_topk: int | None = None
    compute_per_token_ms: float = 0.0
    draft_collectives: int | None = None  # None: collectives per layer + extra
    extrapolate: bool = False
    export_path: str | None = None
    conf_path: str | None = None
    tuner_path: str | None = None
    plot_path: str | None = None
    force: bool = False
    confidence: float = 0.95
    nccl_version: str | None = None  # the release the exports target (None: the installed one)
    command: str = "nccl-tune recommend"  # the exact command, for the exports' headers

    @property
    def nbytes(self) -> int:
        """Bytes of one decode allreduce (batch x hidden x dtype)."""
        w = self.workload
        return per_token.message_bytes(w.batch, w.hidden, w.dtype)

    @property
    def collectives(self) -> int:
        """Allreduces per token."""
        return per_token.collectives_per_forward(
            self.workload.layers, self.collectives_per_layer, self.extra_collectives
        )

    @property
    def extra_sizes(self) -> list[int]:
        """The verify sizes of the planned step counts ((k + 1) x batch tokens)."""
        w = self.workload
        return [per_token.message_bytes((k + 1) * w.batch, w.hidden, w.dtype) for k in self.steps]


@dataclass(frozen=True)
class RecommendResult:
    """Everything `recommend` prints: the analysis, where its figures come from, the
    engine's paths, the speculative plan and what was written."""

    request: RecommendRequest
    analysis: Analysis
    topology: str  # the kind the model (and the tuner rows) assumed
    topology_note: str
    published: Range | None  # the defaults' published range (modelled only)
    engine: engines.EngineReport
    acceptance: Acceptance | None  # with step counts
    comparison: SpecComparison | None
    workload: export.Workload
    target: releases.Target | None = None
    files: dict = field(default_factory=dict)  # kind -> what was written or why not

    @property
    def refused(self) -> list[str]:
        """Files asked for and not written, one phrase each (the command exits 1)."""
        return [
            f"{FILE_OPTIONS[kind]} {info['path']} {info['reason']}"
            for kind, info in self.files.items()
            if not info.get("written")
        ]

    def to_dict(self) -> dict:
        """`--json`: the analysis plus where it comes from, the engine, the plan, the files."""
        modelled = self.analysis.source == MODELLED
        out = self.analysis.to_dict()
        out["topology_note"] = self.topology_note if modelled else None
        out["model_calibration"] = MODEL_CALIBRATION if modelled else None
        out["published_range"] = self.published.to_dict() if self.published else None
        out["engine"] = {"name": self.request.engine, **self.engine.to_dict()}
        out["acceptance"] = self.acceptance.description if self.acceptance else None
        out["acceptance_detail"] = self.acceptance.to_dict() if self.acceptance else None
        out["spec"] = self.comparison.to_dict() if self.comparison else None
        out["files"] = self.files
        out["nccl_target"] = self.target.to_dict() if self.target else None
        return out


def _analyze(req: RecommendRequest, warn) -> tuple[Analysis, str, str, Range | None]:
    """(analysis, topology, how it was found, the defaults' published range): measured
    from the records when given, else the cost model (`model fit`'s constants with --model)."""
    topo_name, topo_note = costmodel.resolve_topology(req.topology)
    w = req.workload
    if req.results:
        records = store.read_records(req.results, warn=warn)
        if not records:
            raise NcclTuneError("no results records to read", path=", ".join(req.results))
        analysis = recommendation.analyze_records(
            records,
            nbytes=req.nbytes,
            collectives=req.collectives,
            tp=w.tp,
            extrapolate=req.extrapolate,
            baseline_tok_s=req.baseline_tok_s,
            confidence=req.confidence,
        )
        if analysis.topology in costmodel.TOPOLOGIES:
            topo_name = analysis.topology
        return analysis, topo_name, topo_note, None
    loaded = None
    if req.model_path:
        loaded = calibrate.load(req.model_path)
        topo_name, topo_note = loaded.topology, f"{loaded.topology} (from {req.model_path})"
    analysis = recommendation.analyze_model(
        topology_name=topo_name,
        nranks=w.tp or (loaded.nranks if loaded else 8),
        nbytes=req.nbytes,
        collectives=req.collectives,
        baseline_tok_s=req.baseline_tok_s,
        extra_sizes=req.extra_sizes,
        params=loaded.params if loaded else None,
    )
    analysis.topology_note = topo_note
    if loaded:
        analysis.notes.insert(0, loaded.describe())
    published = references.attach_published_range(analysis, topo_name, req.baseline_tok_s, loaded)
    return analysis, topo_name, topo_note, published


def _compare(req: RecommendRequest, analysis: Analysis) -> SpecComparison:
    """recommend --spec-steps: the planner under the baseline and the recommended cell."""
    w, t = req.workload, req.spec.timings
    return compare_profiles(
        analysis,
        steps=list(req.steps),
        acceptance=req.spec.acceptance,
        hidden=w.hidden,
        dtype=w.dtype,
        batch=w.batch,
        layers=w.layers,
        baseline_tok_s=req.baseline_tok_s,
        decode_ms=t.decode_ms,
        verify_points=list(t.verify_points),
        verify_model=req.verify_model,
        experts=req.moe_experts,
        topk=req.moe_topk,
        compute_per_token_ms=req.compute_per_token_ms,
        draft_ms=t.draft_ms,
        draft_collectives=(
            req.collectives_per_layer + req.extra_collectives
            if req.draft_collectives is None
            else req.draft_collectives
        ),
        other_ms=t.other_ms,
        extrapolate=req.extrapolate,
        profile=req.export_path,
        halves=t.halves(),
    )


def spec_words(comp: SpecComparison | None) -> str | None:
    """The exported profile's `# speculative:` line: the planner's decision under this profile."""
    if comp is None:
        return None
    which = "recommended" if comp.recommended else "baseline"
    return (
        f"{comp.decision(which)['words']} (planned by recommend --spec-steps under the "
        f"{which} cell; the measured sweep decides: nccl-tune validate)"
    )


def _export(
    req: RecommendRequest,
    analysis: Analysis,
    topo_name: str,
    topo_note: str,
    sizes: export.Workload,
    comp: SpecComparison | None,
) -> tuple[dict, releases.Target | None]:
    """The files asked for, checked against the target release first."""
    written: dict = {}
    target, target_notes = None, ()
    if req.export_path or req.conf_path or req.tuner_path:  # exports name and are checked against a release
        target = releases.resolve_target(req.nccl_version)
        row = recommendation.export_row(analysis, req.force)[0]
        target_notes = releases.check_export(row.env if row else None, analysis.nccl_version, target)
        analysis.notes.extend([f"exports checked against {target.describe()}", *target_notes])
    said = spec_words(comp)
    for kind, path, conf in (("export", req.export_path, False), ("export_conf", req.conf_path, True)):
        if path:
            written[kind] = export.write_profile(
                path,
                analysis,
                sizes,
                req.command,
                force=req.force,
                topology_note=topo_note,
                baseline_tok_s=req.baseline_tok_s,
                confidence=req.confidence,
                conf=conf,
                target=target,
                target_notes=target_notes,
                speculative=said,
            )
    if req.tuner_path:
        written["tuner_csv"] = export.write_tuner_csv(
            req.tuner_path, analysis, topo_name, req.command, force=req.force, target=target
        )
    return written, target


def run(req: RecommendRequest, warn: Callable[[str], None] | None = None) -> RecommendResult:
    """Analyse, plan, export and plot as `req` asks; `warn` receives the results files'
    skipped-line warnings. NcclTuneError on bad input (nothing written)."""
    analysis, topo_name, topo_note, published = _analyze(req, warn)
    w = req.workload
    engine_report = engines.report(
        req.engine,
        analysis.topology or topo_name,
        analysis.world_size or w.tp or 8,
        [req.nbytes, *req.extra_sizes],
        cc=req.cc,
        dtype=w.dtype,
    )
    analysis.notes.extend(engine_report.lines)
    comp = _compare(req, analysis) if req.steps else None
    acceptance = req.spec.acceptance.build(max(req.steps)) if req.steps else None
    sizes = export.Workload(w.layers, req.collectives_per_layer, req.extra_collectives, w.batch, w.hidden, w.dtype)
    written, target = _export(req, analysis, topo_name, topo_note, sizes, comp)
    if req.plot_path:
        from nccl_tune.decide.recommend_plot import plot_saving

        plot_saving(req.plot_path, analysis, comp)
        written["plot"] = {"path": req.plot_path, "written": True}
    return RecommendResult(
        req, analysis, topo_name, topo_note, published, engine_report, acceptance, comp, sizes, target, written
    )
