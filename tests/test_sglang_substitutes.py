"""The test-only sgl_kernel substitute (tests/sglang_cpu/substitutes) on hand-worked examples:
each helper does what its SGLang caller's contract says (see their docstrings)."""

from __future__ import annotations

import sys

import pytest
import torch

from tests.sglang_cpu import SUBSTITUTES

# one draft tree (n = 4): root 0; 1 and 2 children of 0; 3 a child of 1. Row i marks the
# nodes i attends to (itself and its ancestors), as NGRAM's mask does.
TREE = [[1, 0, 0, 0], [1, 1, 0, 0], [1, 0, 1, 0], [1, 1, 0, 1]]


@pytest.fixture(scope="module")
def sk():
    """The substitute sgl_kernel, imported for this module only (its folder leaves sys.path
    and sys.modules afterwards, so nothing else here can import its torchvision)."""
    sys.path.insert(0, str(SUBSTITUTES))
    try:
        import sgl_kernel
        import sgl_kernel.speculative

        yield sgl_kernel
    finally:
        sys.path.remove(str(SUBSTITUTES))
        for name in [n for n in sys.modules if n.split(".")[0] in ("sgl_kernel", "_nccl_tune_substitute")]:
            del sys.modules[name]


def test_an_unimplemented_name_imports_and_raises_by_name_when_called(sk):
    from _nccl_tune_substitute import NotImplementedBySubstitute

    with pytest.raises(NotImplementedBySubstitute, match=r"^sgl_kernel\.build_tree_kernel_efficient_cpu is not"):
        sk.build_tree_kernel_efficient_cpu(1, 2)
    with pytest.raises(AttributeError):
        sk.__wrapped__  # noqa: B018 - special names stay missing (import machinery probes them)


def test_assign_req_to_token_pool_writes_each_requests_slots_in_order(sk):
    req_to_token = torch.zeros(3, 8, dtype=torch.int32)
    sk.assign_req_to_token_pool_cpu(
        torch.tensor([2, 0]),
        req_to_token,
        torch.tensor([1, 0]),
        torch.tensor([3, 3]),
        torch.tensor([10, 11, 20, 21, 22]),
        8,
    )
    assert req_to_token[2].tolist() == [0, 10, 11, 0, 0, 0, 0, 0]
    assert req_to_token[0].tolist() == [20, 21, 22, 0, 0, 0, 0, 0]
    assert req_to_token[1].tolist() == [0] * 8


def test_assign_extend_cache_locs_reads_them_back(sk):
    req_to_token = torch.tensor([[9, 9, 9, 9], [0, 5, 6, 7]], dtype=torch.int32)
    out = torch.full((3,), -1, dtype=torch.int64)
    sk.assign_extend_cache_locs_cpu(
        torch.tensor([1, 0]), req_to_token, torch.tensor([1, 3]), torch.tensor([3, 4]), out, 4
    )
    assert out.tolist() == [5, 6, 9]


def test_copy_all_layer_kv_cache_reads_every_source_before_writing(sk):
    a = torch.tensor([[0, 0], [1, 1], [2, 2], [3, 3]], dtype=torch.int32)  # 8-byte slots
    b = torch.tensor([[0, 0, 0], [1, 1, 1], [2, 2, 2], [3, 3, 3]], dtype=torch.int16)  # 6-byte
    ptrs = torch.tensor([a.data_ptr(), b.data_ptr()], dtype=torch.int64)
    sk.copy_all_layer_kv_cache_cpu(ptrs, torch.tensor([8, 6]), torch.tensor([0, 1]), torch.tensor([1, 2]))
    # slot 1 is a source and a target: slot 0 gets its old value
    assert a.tolist() == [[1, 1], [2, 2], [2, 2], [3, 3]]
    assert b.tolist() == [[1, 1, 1], [2, 2, 2], [2, 2, 2], [3, 3, 3]]


def test_fill_accept_out_cache_loc_packs_the_accepted_slots(sk):
    out = torch.zeros(6, dtype=torch.int64)
    sk.fill_accept_out_cache_loc_cpu(
        torch.tensor([[0, 2, -1], [3, -1, -1]]), torch.tensor([100, 101, 102, 103, 104, 105]), out
    )
    assert out.tolist()[:3] == [100, 102, 103] and out.tolist()[3:] == [0, 0, 0]


def test_fill_bonus_tokens_takes_each_requests_last_accepted_token(sk):
    bonus = torch.zeros(2, dtype=torch.int64)
    sk.fill_bonus_tokens_cpu(torch.tensor([[7, 8, 9], [4, 5, 6]]), torch.tensor([2, 1]), bonus, 3)
    assert bonus.tolist() == [8, 4]


def test_reconstruct_indices_from_tree_mask(sk):
    n, mask = 4, torch.tensor([TREE, TREE], dtype=torch.bool).flatten()
    positions, index, next_token, sibling = (torch.zeros(2 * n, dtype=torch.int64) for _ in range(4))
    sk.speculative.reconstruct_indices_from_tree_mask(
        mask, torch.tensor([10, 3]), positions, index, next_token, sibling, 2, n
    )
    assert positions.tolist() == [10, 11, 11, 12, 3, 4, 4, 5]  # seq len + depth
    assert index.tolist() == [0, 1, 2, 3, 4, 5, 6, 7]
    assert next_token.tolist() == [1, 3, -1, -1] * 2  # first child
    assert sibling.tolist() == [-1, 2, -1, -1] * 2  # the root has none; 2 follows 1


@pytest.mark.parametrize(
    "targets, accepted, accept_index, predicts",
    [
        # root predicts 6: child 1 (5) fails, its sibling 2 (6) matches; 2 has no child
        ([6, 9, 7, 8], 1, [0, 2, -1], [6, 0, 7, 0]),
        # root predicts 5: node 1 matches, then its child 3 (7) matches 1's prediction 7
        ([5, 7, 0, 8], 2, [0, 1, 3], [5, 7, 0, 8]),
        # nothing matches: only the bonus token at the root
        ([4, 0, 0, 0], 0, [0, -1, -1], [4, 0, 0, 0]),
    ],
)
def test_verify_tree_greedy_walks_children_then_siblings(sk, targets, accepted, accept_index, predicts):
    out_predicts = torch.zeros(4, dtype=torch.int32)
    out_index = torch.full((1, 3), -1, dtype=torch.int32)
    out_num = torch.zeros(1, dtype=torch.int32)
    sk.verify_tree_greedy_cpu(
        predicts=out_predicts,
        accept_index=out_index,
        accept_token_num=out_num,
        candidates=torch.tensor([[3, 5, 6, 7]]),
        retrive_index=torch.tensor([[0, 1, 2, 3]]),
        retrive_next_token=torch.tensor([[1, 3, -1, -1]]),
        retrive_next_sibling=torch.tensor([[-1, 2, -1, -1]]),
        target_predict=torch.tensor([targets]),
    )
    assert out_num.tolist() == [accepted]
    assert out_index.tolist() == [accept_index]
    assert out_predicts.tolist() == predicts


# The tree-mask verify attention (_nccl_tune_tree_verify): each draft query's output must be
# plain softmax attention over the committed prefix plus its own path in the tree (its
# ancestors and itself), worked out below by a direct formula on the listed keys.
PATHS = {0: [0], 1: [0, 1], 2: [0, 2], 3: [0, 1, 3]}  # TREE's rows as node lists


@pytest.fixture(scope="module")
def tv():
    sys.path.insert(0, str(SUBSTITUTES))
    try:
        import _nccl_tune_tree_verify

        yield _nccl_tune_tree_verify
    finally:
        sys.path.remove(str(SUBSTITUTES))
        for name in ("_nccl_tune_tree_verify", "_nccl_tune_substitute"):
            sys.modules.pop(name, None)


def direct(q, keys, values, scale):
    """softmax(q . k * scale) @ v for one query head over the listed keys."""
    weights = torch.softmax(torch.stack([q @ k for k in keys]) * scale, dim=0)
    return sum(w * v for w, v in zip(weights, values))


def _cache(slots, kv_heads, dim, seed):
    g = torch.Generator().manual_seed(seed)
    return (
        torch.randn(slots, kv_heads, dim, generator=g, dtype=torch.float64),
        torch.randn(slots, kv_heads, dim, generator=g, dtype=torch.float64),
    )


def test_tree_verify_attention_sees_the_prefix_and_each_drafts_own_path(tv):
    n, scale = 4, 0.5
    # two requests in pool rows 2 and 0, prefixes 3 and 1; GQA: 4 query heads on 2 kv heads
    req_to_token = torch.tensor([[11, 12, 13, 14, 15, 0, 0, 0], [0] * 8, [1, 2, 3, 4, 5, 6, 7, 0]], dtype=torch.int32)
    rows, prefixes = [2, 0], [3, 1]
    k_cache, v_cache = _cache(16, 2, 8, 0)
    query = torch.randn(2 * n, 4, 8, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    masks = [torch.tensor(TREE, dtype=torch.bool)] * 2
    out = tv.tree_verify_attention(
        query, k_cache, v_cache, req_to_token, rows, prefixes, masks, n, scale, enable_gqa=True
    )
    for b, (row, prefix) in enumerate(zip(rows, prefixes)):
        slots = req_to_token[row].tolist()
        for i in range(n):
            seen = slots[:prefix] + [slots[prefix + j] for j in PATHS[i]]
            for h in range(4):
                kv = h // 2  # query heads 0,1 -> kv head 0; 2,3 -> 1
                want = direct(
                    query[b * n + i, h], [k_cache[s, kv] for s in seen], [v_cache[s, kv] for s in seen], scale
                )
                assert torch.allclose(out[b * n + i, h], want, atol=1e-12), (b, i, h)


def test_a_chain_of_drafts_is_plain_causal_attention(tv):
    # a chain (each draft the child of the one before) attends exactly like causal decoding
    n, prefix = 3, 2
    chain = torch.tril(torch.ones(n, n, dtype=torch.bool))
    k_cache, v_cache = _cache(n + prefix, 1, 4, 2)
    query = torch.randn(n, 1, 4, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    req_to_token = torch.arange(n + prefix).view(1, -1)
    out = tv.tree_verify_attention(
        query, k_cache, v_cache, req_to_token, [0], [prefix], [chain], n, None, enable_gqa=False
    )
    for i in range(n):
        seen = range(prefix + i + 1)
        want = direct(query[i, 0], [k_cache[s, 0] for s in seen], [v_cache[s, 0] for s in seen], 0.5)
        assert torch.allclose(out[i, 0], want, atol=1e-12), i  # default scale 1/sqrt(4)


def test_split_mask_reads_both_of_sglangs_layouts_and_refuses_others(tv):
    tree = torch.tensor(TREE, dtype=torch.bool)
    draft_only = torch.stack([tree, ~tree]).flatten()
    assert [m.tolist() for m in tv.split_mask(draft_only, [3, 1], 4)] == [TREE, (~tree).int().tolist()]
    # full layout: per request [n, prefix + n], the prefix columns true
    full = torch.cat(
        [
            torch.cat([torch.ones(4, 3, dtype=torch.bool), tree], 1).flatten(),
            torch.cat([torch.ones(4, 1, dtype=torch.bool), ~tree], 1).flatten(),
        ]
    )
    assert [m.int().tolist() for m in tv.split_mask(full, [3, 1], 4)] == [TREE, (~tree).int().tolist()]
    hidden = full.clone()
    hidden[0] = False  # draft 0 of request 0 would not see prefix token 0
    with pytest.raises(ValueError, match="hides part of the committed prefix"):
        tv.split_mask(hidden, [3, 1], 4)
    with pytest.raises(ValueError, match="neither draft-only"):
        tv.split_mask(draft_only[:-1], [3, 1], 4)
