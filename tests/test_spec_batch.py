"""The batched built-in loop (integration.spec_batch): a batched forward is each sequence's
own forward, and batched speculative decoding emits plain greedy decoding's tokens."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from integration import spec_batch  # noqa: E402
from integration.tp_model import Collective, ModelShape, build_models  # noqa: E402


def models(noise=0.25):
    shape = ModelShape(2, 64, 4, 128, 256)
    return build_models(
        shape, 1, noise, 0, 0, 1, torch.float64, torch.device("cpu"), Collective(None), residual_scale=0.25
    )


def test_forward_many_equals_each_sequences_own_forward():
    target, _ = models()
    a, b = [5, 7, 9], [1, 2]
    ca, cb, c1, c2 = (target.new_cache(32) for _ in range(4))
    alone = [target.forward(a, ca), target.forward(b, cb)]
    together = target.forward_many([a, b], [c1, c2])
    assert all(torch.equal(x, y) for x, y in zip(alone, together))
    # uneven continuations at different positions (what a verify after rejections sees)
    alone = [target.forward([3], ca), target.forward([4, 6], cb)]
    together = target.forward_many([[3], [4, 6]], [c1, c2])
    assert all(torch.equal(x, y) for x, y in zip(alone, together))
    assert (c1.length, c2.length) == (4, 4)


@pytest.mark.parametrize("steps", [1, 3])
def test_batched_speculation_emits_plain_greedy_tokens(steps):
    target, draft = models()
    prompts = spec_batch.prompts(3, 8, 128, 0)
    plain = spec_batch.generate_batch(target, draft, prompts, 0, 12, Collective(None), False)
    spec = spec_batch.generate_batch(target, draft, prompts, steps, 12, Collective(None), False)
    assert spec.tokens == plain.tokens and all(len(t) == 12 for t in plain.tokens)
    assert len(set(map(tuple, plain.tokens))) == 3  # three different sequences
    assert all(1 <= a <= steps + 1 for a in spec.accepted) and spec.cycles < plain.cycles
    record = spec_batch.summarize(3, steps, [spec])
    assert record["accept_len"] == pytest.approx(sum(spec.accepted) / len(spec.accepted))
    assert len(record["accept_per_pos"]) == steps and record["accept_per_pos"][0] <= 1.0
