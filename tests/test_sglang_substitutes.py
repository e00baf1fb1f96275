"""The test-only sgl_kernel substitute (tests/sglang_cpu/substitutes) on hand-worked examples:
each helper does what its SGLang caller's contract says (see their docstrings)."""

from __future__ import annotations

import sys

import pytest
import torch

from tests.sglang_cpu import SUBSTITUTES

# one draft tree (n = 4): root 0; 1 and 2 children of 0; 3 a child of 1. Row i marks the
# nodes i attends to (itself and its ancestors), as NGRAM's mask does.
TREE = [[1, 0, 0, 0],
        [1, 1, 0, 0],
        [1, 0, 1, 0],
        [1, 1, 0, 1]]


@pytest.fixture(scope="module")
def sk():
    """The substitute sgl_kernel, imported for this module only (its folder leaves sys.path
    and sys.modules afterwards, so nothing else here can import its torchvision)."""
    sys.path.insert(0, str(SUBSTITUTES))
    try:
        import sgl_kernel
        import sgl_kernel.speculative  # noqa: F401

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
    sk.assign_req_to_token_pool_cpu(torch.tensor([2, 0]), req_to_token, torch.tensor([1, 0]),
                                    torch.tensor([3, 3]), torch.tensor([10, 11, 20, 21, 22]), 8)
    assert req_to_token[2].tolist() == [0, 10, 11, 0, 0, 0, 0, 0]
    assert req_to_token[0].tolist() == [20, 21, 22, 0, 0, 0, 0, 0]
    assert req_to_token[1].tolist() == [0] * 8


def test_assign_extend_cache_locs_reads_them_back(sk):
    req_to_token = torch.tensor([[9, 9, 9, 9], [0, 5, 6, 7]], dtype=torch.int32)
    out = torch.full((3,), -1, dtype=torch.int64)
    sk.assign_extend_cache_locs_cpu(torch.tensor([1, 0]), req_to_token, torch.tensor([1, 3]),
                                    torch.tensor([3, 4]), out, 4)
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
    sk.fill_accept_out_cache_loc_cpu(torch.tensor([[0, 2, -1], [3, -1, -1]]),
                                     torch.tensor([100, 101, 102, 103, 104, 105]), out)
    assert out.tolist()[:3] == [100, 102, 103] and out.tolist()[3:] == [0, 0, 0]


def test_fill_bonus_tokens_takes_each_requests_last_accepted_token(sk):
    bonus = torch.zeros(2, dtype=torch.int64)
    sk.fill_bonus_tokens_cpu(torch.tensor([[7, 8, 9], [4, 5, 6]]), torch.tensor([2, 1]), bonus, 3)
    assert bonus.tolist() == [8, 4]


def test_reconstruct_indices_from_tree_mask(sk):
    n, mask = 4, torch.tensor([TREE, TREE], dtype=torch.bool).flatten()
    positions, index, next_token, sibling = (torch.zeros(2 * n, dtype=torch.int64) for _ in range(4))
    sk.speculative.reconstruct_indices_from_tree_mask(mask, torch.tensor([10, 3]), positions, index,
                                                      next_token, sibling, 2, n)
    assert positions.tolist() == [10, 11, 11, 12, 3, 4, 4, 5]  # seq len + depth
    assert index.tolist() == [0, 1, 2, 3, 4, 5, 6, 7]
    assert next_token.tolist() == [1, 3, -1, -1] * 2  # first child
    assert sibling.tolist() == [-1, 2, -1, -1] * 2  # the root has none; 2 follows 1


@pytest.mark.parametrize("targets, accepted, accept_index, predicts", [
    # root predicts 6: child 1 (5) fails, its sibling 2 (6) matches; 2 has no child
    ([6, 9, 7, 8], 1, [0, 2, -1], [6, 0, 7, 0]),
    # root predicts 5: node 1 matches, then its child 3 (7) matches 1's prediction 7
    ([5, 7, 0, 8], 2, [0, 1, 3], [5, 7, 0, 8]),
    # nothing matches: only the bonus token at the root
    ([4, 0, 0, 0], 0, [0, -1, -1], [4, 0, 0, 0]),
])
def test_verify_tree_greedy_walks_children_then_siblings(sk, targets, accepted, accept_index, predicts):
    out_predicts = torch.zeros(4, dtype=torch.int32)
    out_index = torch.full((1, 3), -1, dtype=torch.int32)
    out_num = torch.zeros(1, dtype=torch.int32)
    sk.verify_tree_greedy_cpu(predicts=out_predicts, accept_index=out_index, accept_token_num=out_num,
                              candidates=torch.tensor([[3, 5, 6, 7]]),
                              retrive_index=torch.tensor([[0, 1, 2, 3]]),
                              retrive_next_token=torch.tensor([[1, 3, -1, -1]]),
                              retrive_next_sibling=torch.tensor([[-1, 2, -1, -1]]),
                              target_predict=torch.tensor([targets]))
    assert out_num.tolist() == [accepted]
    assert out_index.tolist() == [accept_index]
    assert out_predicts.tolist() == predicts
