"""TEST-ONLY: tree-mask verify attention for SGLang's torch_native backend (nccl-tune's tests).

SGLang's `torch_native` attention backend (the one a CPU-only torch can run without
sgl-kernel's AMX library) has no path for a speculative TARGET_VERIFY batch: such a
batch carries no `extend_prefix_lens` / `extend_seq_lens` and needs a custom tree mask,
and `_run_sdpa_forward_extend` fails on it. This module gives that backend the missing
path and nothing else: `install` wraps `TorchNativeAttnBackend.forward_extend` so that a
TARGET_VERIFY batch goes to `forward_target_verify` here, and every other batch (prefill,
extend, decode) runs SGLang's own code unchanged.

The math is tree attention as SGLang's verify contract states it (the callers read:
sglang/srt/speculative/ngram_worker.py `_prepare_for_speculative_decoding`,
ngram_info.py `NgramVerifyInput.generate_attn_arg_prefill`, and the TARGET_VERIFY branch
of intel_amx_backend.py `_build_extend_metadata`): request b has `seq_lens[b]` committed
tokens in the KV cache and `draft_token_num` = n draft tokens written at
`req_to_token[b, seq_lens[b] : seq_lens[b] + n]` by this forward; draft token i attends
to every committed token (the causal prefix) and to the draft tokens j that the mask
marks (its ancestors in the draft tree, and itself). The mask comes in one of SGLang's
two layouts, told apart by size: draft-only, `[bs, n, n]` flat (what NGRAM builds on CPU),
or full, per request `[n, seq_lens[b] + n]` rows flat one request after another (what
it builds on GPUs, the prefix columns all true). Softmax scale, grouped-query heads and
the output layout are the backend's own (`torch.nn.functional.scaled_dot_product_attention`
with a boolean mask). SGLang's C++/CUDA/Triton kernels are not copied.

It is loaded by this folder's sitecustomize.py (so it reaches the server only through
PYTHONPATH), and the first verify batch a process runs prints the substitute marker
line, so a run that used it says so in the server's log and in nccl-tune's outputs.
"""

from __future__ import annotations

import torch
from _nccl_tune_substitute import announce
from torch.nn.functional import scaled_dot_product_attention

TARGET = "sglang.srt.layers.attention.torch_native_backend"
NAME = "torch_native_tree_verify"
WHAT = (
    "tree-mask attention for speculative TARGET_VERIFY batches of SGLang's torch_native backend, not SGLang's kernels"
)


def split_mask(mask: torch.Tensor, prefix_lens: list[int], n: int) -> list[torch.Tensor]:
    """Per request, the [n, n] boolean draft-to-draft part of a verify mask in either of
    SGLang's layouts: draft-only (bs * n * n entries) or full (sum of n * (prefix + n))."""
    flat = mask.reshape(-1).to(torch.bool)
    bs = len(prefix_lens)
    if flat.numel() == bs * n * n:
        return list(flat.view(bs, n, n).unbind(0))
    full = sum(n * (p + n) for p in prefix_lens)
    if flat.numel() < full:
        raise ValueError(
            f"verify mask has {flat.numel()} entries: neither draft-only "
            f"({bs * n * n}) nor full ({full}) for {bs} requests of {n} drafts"
        )
    out, start = [], 0
    for p in prefix_lens:  # a longer one is SGLang's padding for CUDA graphs: ignored
        rows = flat[start : start + n * (p + n)].view(n, p + n)
        if not bool(rows[:, :p].all()):
            raise ValueError("full verify mask hides part of the committed prefix")
        out.append(rows[:, p:])
        start += n * (p + n)
    return out


def tree_verify_attention(
    query: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    req_to_token: torch.Tensor,
    req_pool_indices: list[int],
    prefix_lens: list[int],
    draft_masks: list[torch.Tensor],
    n: int,
    scaling: float | None,
    enable_gqa: bool,
) -> torch.Tensor:
    """Attention of bs * n draft queries ([tokens, heads, dim]) over their request's
    committed prefix and their tree ancestors (and themselves): the [tokens, heads,
    v_dim] output. k_cache / v_cache are [slots, kv_heads, dim]; request b's keys are at
    req_to_token[req_pool_indices[b], :prefix_lens[b] + n]."""
    out = query.new_empty((query.shape[0], query.shape[1], v_cache.shape[-1]))
    eye = torch.eye(n, dtype=torch.bool, device=query.device)
    for b, (row, prefix) in enumerate(zip(req_pool_indices, prefix_lens)):
        slots = req_to_token[row, : prefix + n].to(torch.int64)
        q = query[b * n : (b + 1) * n].movedim(0, 1)  # [heads, n, dim]
        k = k_cache[slots].movedim(0, 1).to(q.dtype)  # [kv_heads, prefix + n, dim]
        v = v_cache[slots].movedim(0, 1).to(q.dtype)
        visible = torch.cat(
            (torch.ones((n, prefix), dtype=torch.bool, device=q.device), draft_masks[b] | eye), dim=1
        )  # [n, prefix + n]
        o = scaled_dot_product_attention(
            q.unsqueeze(0), k.unsqueeze(0), v.unsqueeze(0), attn_mask=visible, scale=scaling, enable_gqa=enable_gqa
        )
        out[b * n : (b + 1) * n] = o.squeeze(0).movedim(1, 0)
    return out


def forward_target_verify(backend, q, k, v, layer, forward_batch, save_kv_cache=True):
    """TorchNativeAttnBackend.forward_extend for a TARGET_VERIFY batch: store the drafts'
    K/V at out_cache_loc (as the backend's own extend does), then tree_verify_attention."""
    from sglang.srt.mem_cache.memory_pool import KVWriteLoc

    if (
        layer.is_cross_attention
        or getattr(layer, "sliding_window_size", None) not in (None, -1)
        or forward_batch.encoder_lens is not None
    ):
        raise NotImplementedError(f"{NAME} (test-only) verifies plain causal self-attention only")
    if save_kv_cache and k is not None and v is not None:
        backend.token_to_kv_pool.set_kv_buffer(
            layer, KVWriteLoc(forward_batch.out_cache_loc, backend.swa_out_cache_loc), k, v
        )
    spec = forward_batch.spec_info
    n = int(spec.draft_token_num)
    prefix_lens = [int(x) for x in forward_batch.seq_lens.tolist()]
    rows = [int(x) for x in forward_batch.req_pool_indices.tolist()]
    masks = split_mask(spec.custom_mask, prefix_lens, n)
    q_ = q.reshape(-1, layer.tp_q_head_num, layer.qk_head_dim)
    o = tree_verify_attention(
        q_,
        backend.token_to_kv_pool.get_key_buffer(layer.layer_id),
        backend.token_to_kv_pool.get_value_buffer(layer.layer_id),
        backend.req_to_token_pool.req_to_token,
        rows,
        prefix_lens,
        masks,
        n,
        layer.scaling,
        layer.tp_q_head_num != layer.tp_k_head_num,
    )
    announce(NAME, WHAT)  # once per process, at its first verify batch
    return o.reshape(q_.shape[0], layer.tp_q_head_num * layer.v_head_dim)


def install(module) -> None:
    """Wrap `module.TorchNativeAttnBackend.forward_extend` (module: SGLang's
    torch_native_backend, just imported): TARGET_VERIFY batches go to
    forward_target_verify, every other batch to SGLang's own method."""
    cls = module.TorchNativeAttnBackend
    original = cls.forward_extend
    if getattr(original, "_nccl_tune_test_only", False):
        return

    def forward_extend(self, q, k, v, layer, forward_batch, save_kv_cache=True, **kwargs):
        if forward_batch.forward_mode.is_target_verify():
            return forward_target_verify(self, q, k, v, layer, forward_batch, save_kv_cache)
        return original(self, q, k, v, layer, forward_batch, save_kv_cache=save_kv_cache, **kwargs)

    forward_extend._nccl_tune_test_only = True
    forward_extend.__doc__ = f"{original.__doc__ or ''}\n(TEST-ONLY: wrapped by {__name__})"
    cls.forward_extend = forward_extend
