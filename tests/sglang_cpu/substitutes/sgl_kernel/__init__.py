"""TEST-ONLY pure-torch stand-in for SGLang's `sgl_kernel` on CPU (nccl-tune's tests).

SGLang's CPU backend imports `sgl_kernel` (its C++ kernels built for CPU, which are not on
PyPI) for a few index- and copy-helpers even when attention, sampling and the layers run
in torch (`--attention-backend torch_native --sampling-backend pytorch`, and no AMX
kernels switched on). This package implements those helpers in plain torch, each from the
contract of SGLang's own Python caller and the Triton kernel it replaces on GPUs
(sglang/kernels/ops/..., sglang/srt/mem_cache/allocation.py): the caller's argument
names, shapes and in-place outputs. Any other name raises NotImplementedError naming
itself when called. It reaches the server only through PYTHONPATH
(tests/sglang_cpu/substitutes); never install it. Every process that imports it says
so on stderr (the server's log), and nccl-tune's outputs repeat it.
"""

from __future__ import annotations

import ctypes

import torch
from _nccl_tune_substitute import announce, missing

announce("sgl_kernel", "pure-torch helpers for SGLang's CPU path, not SGLang's kernels")
__version__ = "0.0.0+nccl-tune.test.substitute"

# What this substitute implements (the tests and the report list them from here).
IMPLEMENTED = (
    "copy_all_layer_kv_cache_cpu",
    "assign_req_to_token_pool_cpu",
    "assign_extend_cache_locs_cpu",
    "fill_accept_out_cache_loc_cpu",
    "fill_bonus_tokens_cpu",
    "verify_tree_greedy_cpu",
    "speculative.reconstruct_indices_from_tree_mask",
)


def _bytes_at(address: int, nbytes: int) -> torch.Tensor:
    # a uint8 view of memory torch already owns (a KV buffer given by its data_ptr)
    buffer = (ctypes.c_uint8 * nbytes).from_address(address)
    return torch.frombuffer(buffer, dtype=torch.uint8)


def copy_all_layer_kv_cache_cpu(
    data_ptrs: torch.Tensor, strides: torch.Tensor, tgt_loc: torch.Tensor, src_loc: torch.Tensor
) -> None:
    """For every KV buffer i (base address data_ptrs[i], slot size strides[i] bytes):
    copy slot src_loc[j] to slot tgt_loc[j] for every j, all sources read before any
    write (the Triton kernel's "safe for in-place copy";
    sglang/kernels/ops/kvcache/cache_move.py, copy_all_layer_kv_cache_func)."""
    if tgt_loc.numel() == 0:
        return
    src = src_loc.to(torch.int64)
    tgt = tgt_loc.to(torch.int64)
    slots = int(torch.maximum(src.max(), tgt.max()).item()) + 1
    for address, stride in zip(data_ptrs.tolist(), strides.tolist()):
        rows = _bytes_at(int(address), slots * int(stride)).view(slots, int(stride))
        rows[tgt] = rows[src].clone()


def assign_req_to_token_pool_cpu(
    req_pool_indices: torch.Tensor,
    req_to_token: torch.Tensor,
    start_offset: torch.Tensor,
    end_offset: torch.Tensor,
    out_cache_loc: torch.Tensor,
    pool_len: int,
) -> None:
    """req_to_token[req_pool_indices[i], start_offset[i]:end_offset[i]] = the next
    end - start entries of out_cache_loc, request by request in order
    (sglang/srt/mem_cache/allocation.py, assign_req_to_token_pool)."""
    del pool_len  # the row length; req_to_token's own shape says it
    done = 0
    for row, start, end in zip(req_pool_indices.tolist(), start_offset.tolist(), end_offset.tolist()):
        length = end - start
        if length > 0:
            req_to_token[row, start:end] = out_cache_loc[done : done + length].to(req_to_token.dtype)
            done += length


def assign_extend_cache_locs_cpu(
    req_pool_indices: torch.Tensor,
    req_to_token: torch.Tensor,
    start_offset: torch.Tensor,
    end_offset: torch.Tensor,
    out_cache_loc: torch.Tensor,
    pool_len: int,
) -> None:
    """The reverse of assign_req_to_token_pool_cpu: the next end - start entries of
    out_cache_loc = req_to_token[req_pool_indices[i], start_offset[i]:end_offset[i]],
    request by request in order (sglang/kernels/ops/speculative/cache_locs.py,
    assign_extend_cache_locs)."""
    del pool_len
    done = 0
    for row, start, end in zip(req_pool_indices.tolist(), start_offset.tolist(), end_offset.tolist()):
        length = end - start
        if length > 0:
            out_cache_loc[done : done + length] = req_to_token[row, start:end].to(out_cache_loc.dtype)
            done += length


def fill_accept_out_cache_loc_cpu(
    accept_index: torch.Tensor, out_cache_loc: torch.Tensor, accept_out_cache_loc: torch.Tensor
) -> None:
    """accept_out_cache_loc packs out_cache_loc[i] for every accepted index i of the flat
    accept_index (-1: not accepted), in order (sglang/kernels/ops/speculative/eagle.py,
    fill_accept_out_cache_loc)."""
    flat = accept_index.reshape(-1).to(torch.int64)
    kept = flat[flat != -1]
    accept_out_cache_loc[: kept.numel()] = out_cache_loc[kept].to(accept_out_cache_loc.dtype)


def fill_bonus_tokens_cpu(
    accept_tokens: torch.Tensor, accept_lens: torch.Tensor, bonus_tokens: torch.Tensor, accept_stride: int
) -> None:
    """bonus_tokens[b] = the last accepted token of request b: the flat accept_tokens at
    accept_stride * b + accept_lens[b] - 1 (accept_lens counts the bonus token;
    sglang/kernels/ops/speculative/eagle.py, fill_bonus_tokens)."""
    batch = bonus_tokens.numel()
    rows = torch.arange(batch, dtype=torch.int64) * int(accept_stride)
    index = rows + accept_lens[:batch].to(torch.int64) - 1
    bonus_tokens.copy_(accept_tokens.reshape(-1)[index].to(bonus_tokens.dtype))


def verify_tree_greedy_cpu(
    predicts: torch.Tensor,
    accept_index: torch.Tensor,
    accept_token_num: torch.Tensor,
    candidates: torch.Tensor,
    retrive_index: torch.Tensor,
    retrive_next_token: torch.Tensor,
    retrive_next_sibling: torch.Tensor,
    target_predict: torch.Tensor,
) -> None:
    """Greedy verification of a draft tree, per request b (sglang/kernels/ops/speculative/
    spec_tree.py, verify_tree_greedy_kernel_triton): start at the root, then at each
    level walk the children (first child, then its siblings) and accept the first whose
    draft token equals the target's prediction at the last accepted node; stop at the
    first level with no match or after accept_index.shape[1] - 1 accepted drafts.
    Writes accept_index[b, 0..n] (flat node indices, the root first), the number of
    accepted drafts, and the target's token at every accepted node into predicts (the
    last one is the bonus token). Keyword names as SGLang's caller passes them."""
    batch, width = candidates.shape
    depth = accept_index.shape[1]
    targets = target_predict.reshape(-1).tolist()
    for b in range(batch):
        index = retrive_index[b].tolist()
        next_token = retrive_next_token[b].tolist()
        next_sibling = retrive_next_sibling[b].tolist()
        drafts = candidates[b].tolist()
        last, accepted, node = index[0], 0, 0
        accept_index[b, 0] = last
        for _ in range(1, depth):
            node = next_token[node]
            target = targets[last]
            while node != -1 and drafts[node] != target:
                node = next_sibling[node]
            if node == -1:
                break
            predicts[last] = target
            accepted += 1
            accept_index[b, accepted] = index[node]
            last = index[node]
        accept_token_num[b] = accepted
        predicts[last] = targets[last]
    del width


def __getattr__(name: str):
    return missing(__name__, name)
