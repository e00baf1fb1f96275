"""--plot figures people can read: byte ticks 1K/14K/1M, plain microseconds, intervals
drawn, gloo captioned as noise, k = 0 in tok/s against steps, long labels wrapped, and
report saying where it wrote. Each figure is captured before saving and inspected."""

from __future__ import annotations

import json

import factories
import pytest

from nccl_tune import store
from nccl_tune.cli import cli
from nccl_tune.decide import plotting

pytest.importorskip("matplotlib")


@pytest.fixture
def figures(monkeypatch):
    """The figures the commands save (still written to disk, then kept for inspection)."""
    kept = []
    real = plotting.save

    def save(fig, path, dpi):
        fig.canvas.draw()  # tick labels exist only once drawn
        kept.append(fig)
        real(fig, path, dpi)

    monkeypatch.setattr(plotting, "save", save)
    return kept


def _labels(axis) -> list[str]:
    return [t.get_text() for t in axis.get_ticklabels() if t.get_text()]


def _records(backend="gloo"):
    four = {"NCCL_PROTO": "LL", "NCCL_ALGO": "Ring", "NCCL_MAX_NCHANNELS": "16", "NCCL_BUFFSIZE": "16777216"}
    cells = [({}, lambda b: 60.0 + b / 5000), (four, lambda b: 50.0 + b / 5000)]
    return factories.sweep_records(
        cells,
        (1024, 14336, 1 << 20),
        rounds=3,
        first_round=1,
        noise=2.0,
        samples=20,
        seed=0,
        backend=backend,
        world_size=2,
    )


def test_axis_words():
    assert [plotting.bytes_label(b) for b in (512, 1024, 14336, 57344, 1 << 20)] == ["512", "1K", "14K", "56K", "1M"]
    assert [plotting.plain_number(v) for v in (20.0, 60.0, 2500.0, 0.5)] == ["20", "60", "2,500", "0.5"]
    assert plotting.wrap("NCCL_PROTO=LL NCCL_ALGO=Ring NCCL_MAX_NCHANNELS=16", 20).count("\n") == 2


def test_report_plot_ticks_intervals_caption_and_where(cli_runner, tmp_path, figures):
    path = tmp_path / "r.jsonl"
    store.append_records(str(path), _records("gloo"))
    png = tmp_path / "lat.png"
    result = cli_runner.invoke(cli, ["report", str(path), "--plot", str(png)])
    assert result.exit_code == 0, result.output
    assert f"plot: wrote {png}" in result.output and png.stat().st_size > 0
    (fig,) = figures
    ax = fig.axes[0]
    assert _labels(ax.xaxis) == ["1K", "14K", "1M"]  # the measured sizes
    ys = _labels(ax.yaxis)
    assert ys and all(label.replace(",", "").replace(".", "").isdigit() for label in ys), ys
    assert ax.collections, "no interval drawn"  # errorbar line collections
    texts = [t.get_text() for t in fig.texts]
    assert any("differences between lines are noise" in t for t in texts)
    legend = [t.get_text() for t in ax.get_legend().get_texts()]
    assert any("\n" in t for t in legend)  # the four-variable label is wrapped


def test_report_plot_on_nccl_has_no_gloo_caption(cli_runner, tmp_path, figures):
    path = tmp_path / "r.jsonl"
    store.append_records(str(path), _records("nccl"))
    cli_runner.invoke(cli, ["report", str(path), "--plot", str(tmp_path / "p.png")])
    assert not any("gloo" in t.get_text() for t in figures[0].texts)


def test_recommend_plot_includes_plain_decoding_and_wraps_labels(cli_runner, tmp_path, figures):
    png = tmp_path / "rec.png"
    result = cli_runner.invoke(
        cli,
        [
            "recommend",
            "--layers",
            "61",
            "--topology",
            "pcie-shm",
            "--spec-steps",
            "1-4",
            "--accept-len",
            "2.5@3",
            "--baseline-tok-s",
            "62.9",
            "--plot",
            str(png),
            "--json",
        ],
    )
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)["files"]["plot"]["written"]
    (fig,) = figures
    bars, steps = fig.axes[:2]
    assert [list(line.get_xdata()) for line in steps.get_lines()][0][0] == 0  # k = 0 drawn
    assert steps.get_lines()[0].get_ydata()[0] == pytest.approx(62.9, abs=0.5)
    assert any("\n" in label for label in _labels(bars.yaxis))  # the public report's 6 variables
    assert any("MODELLED" in t.get_text() for t in fig.texts)


def test_recommend_plot_on_gloo_results_is_captioned(cli_runner, tmp_path, figures):
    path = tmp_path / "r.jsonl"
    store.append_records(str(path), _records("gloo"))
    result = cli_runner.invoke(
        cli, ["recommend", "--layers", "61", "--results", str(path), "--plot", str(tmp_path / "g.png")]
    )
    assert result.exit_code == 0, result.output
    assert any("differences between cells are noise" in t.get_text() for t in figures[0].texts)
