"""integration.metrics: Prometheus text, deltas around a run, speculative figures."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from integration import metrics
from nccl_tune.cli import cli

HERE = Path(__file__).parent / "fixtures" / "metrics"


def _read(name: str) -> metrics.Scrape:
    return metrics.parse((HERE / name).read_text())


def test_parse_labels_types_and_special_values():
    text = (
        "# TYPE a_total counter\n"
        'a_total{x="1",y="q\\"uote"} 3\n'
        'a_total{x="2"} 4 1700000000000\n'
        "b NaN\n"
        'c{p="0"} +Inf\n'
        "not a sample line\n"
        "d{broken 1\n"
    )
    sc = metrics.parse(text)
    assert sc.types == {"a_total": "counter"}
    assert sc.total("a_total") == 7 and sc.total("a_total", x="2") == 4
    assert sc.samples[("a_total", (("x", "1"), ("y", 'q"uote')))] == 3
    assert math.isnan(sc.total("b")) and sc.total("c") == math.inf
    assert sc.total("d") is None and sc.total("nothing") is None


def test_vllm_delta_gives_accept_length_and_per_position():
    spec = metrics.speculative(metrics.delta(_read("vllm_spec_before.prom"), _read("vllm_spec_after.prom")))
    assert spec["drafts"] == 40 and spec["accepted_tokens"] == 66 and spec["draft_tokens"] == 120
    assert spec["accept_len"] == pytest.approx(1 + 66 / 40)
    assert spec["accept_rate"] == pytest.approx(66 / 120)
    assert spec["per_position"] == pytest.approx([36 / 40, 21 / 40, 9 / 40])
    # the per-position rates add up to the accepted tokens per draft (the same counters)
    assert sum(spec["per_position"]) == pytest.approx(spec["accept_len"] - 1)
    assert spec["generation_tokens"] == 150


def test_delta_keeps_gauges_and_survives_a_restart():
    before, after = _read("vllm_spec_after.prom"), _read("vllm_spec_before.prom")  # counters fell
    d = metrics.delta(before, after)
    assert d.total(metrics.VLLM_DRAFTS) == 10  # counted from zero after the restart
    assert d.total("vllm:num_requests_running") == 0.0


def test_no_drafts_in_the_interval_gives_no_accept_length():
    same = _read("vllm_spec_after.prom")
    spec = metrics.speculative(metrics.delta(same, same))
    assert spec["drafts"] == 0 and spec["accept_len"] is None and spec["per_position"] is None


def test_sglang_gauge_is_averaged_over_ranks_and_nothing_for_plain_servers():
    spec = metrics.speculative(_read("sglang_spec.prom"))
    assert spec["accept_len"] == pytest.approx(2.6) and "gauge" in spec["source"]
    assert metrics.speculative(metrics.parse("# TYPE x gauge\nx 1\n")) is None


def test_looks_like_metrics_tells_scrapes_from_logs():
    assert metrics.looks_like_metrics((HERE / "sglang_spec.prom").read_text())
    assert metrics.looks_like_metrics("vllm:num_requests_running 0.0\n")
    log = (Path(__file__).parent / "fixtures" / "logs" / "vllm_v1_spec.log").read_text()
    assert not metrics.looks_like_metrics(log)


def test_scrape_of_a_dead_url_is_none():
    from integration.server import free_port

    assert metrics.try_scrape(f"http://127.0.0.1:{free_port()}", timeout=2) is None
    with pytest.raises(metrics.MetricsError):
        metrics.scrape(f"http://127.0.0.1:{free_port()}", timeout=2)


def test_logs_summarize_reads_a_saved_scrape_and_several_files(cli_runner):
    out = cli_runner.invoke(
        cli,
        [
            "logs",
            "summarize",
            str(HERE / "vllm_spec_after.prom"),
            str(Path(__file__).parent / "fixtures" / "logs" / "vllm_v1_spec.log"),
        ],
    )
    assert out.exit_code == 0, out.output
    assert "/metrics scrape" in out.output and "2.56" in out.output  # 1 + 78/50
    assert "0.860, 0.500, 0.200" in out.output  # 43/50, 25/50, 10/50
    assert "vllm_v1_spec.log" in out.output and "decode lines" in out.output
    js = cli_runner.invoke(
        cli, ["logs", "summarize", "--json", str(HERE / "vllm_spec_after.prom"), str(HERE / "sglang_spec.prom")]
    )
    data = json.loads(js.output)
    assert [d["engine"] for d in data] == ["vllm", "sglang"]
    assert data[1]["accept_len_mean"] == pytest.approx(2.6)


def test_sglang_0523_exports_its_spec_gauges_at_zero_without_speculation():
    # what a real SGLang 0.5.23 server without speculative decoding answers (label sets cut)
    text = (
        "# TYPE sglang:spec_accept_length gauge\n"
        'sglang:spec_accept_length{engine_type="unified",tp_rank="0"} 0.0\n'
        "# TYPE sglang:spec_accept_rate gauge\n"
        'sglang:spec_accept_rate{engine_type="unified",tp_rank="0"} 0.0\n'
    )
    assert metrics.speculative(metrics.parse(text)) is None  # plain decoding is 1, never 0


def test_sglang_0523_counters_give_the_runs_kept_tokens_per_verify():
    # a real 0.5.23 NGRAM server (fixtures README): three requests of 24 tokens, 18 verifies
    spec = metrics.speculative(
        metrics.delta(_read("sglang_0523_ngram_before.prom"), _read("sglang_0523_ngram_after.prom"))
    )
    assert (spec["verify_calls"], spec["generation_tokens"], spec["requests"]) == (18, 72, 3)
    assert spec["accept_len"] == pytest.approx((72 - 3) / 18)  # each first token is the prefill's
    assert spec["accept_rate"] == pytest.approx(((72 - 3) / 18 - 1) / 3)  # 3 drafts a verify
    assert spec["source"].startswith("sglang /metrics counters")
    # its gauge (the last logging interval) says 4.0; the run's own meta_info 1 + 53/18
    assert _read("sglang_0523_ngram_after.prom").mean(metrics.SGLANG_ACCEPT_LENGTH) == 4.0
    # without a verify in the interval the counters give nothing and the gauge is read
    same = _read("sglang_0523_ngram_after.prom")
    assert metrics.speculative(metrics.delta(same, same))["accept_len"] == 4.0
