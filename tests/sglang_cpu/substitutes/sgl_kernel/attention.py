"""TEST-ONLY: the two attention ops SGLang's `intel_amx` attention backend calls
(torch.ops.sgl_kernel.decode_attention_cpu / extend_attention_cpu), in plain torch
(scaled_dot_product_attention per request), registered as torch custom ops.

Why: SGLang's `torch_native` backend cannot run a speculative verify (TARGET_VERIFY
batches carry no extend_prefix_lens, and it has no tree mask), so NGRAM on CPU needs the
`intel_amx` backend. Its contract is read from its caller
(sglang/srt/layers/attention/intel_amx_backend.py: argument order, which tensors are
written, how the verify batch's lengths and tree mask are built) and the math from
SGLang's own torch_native backend. Cases the tests never reach (cross-attention,
sliding windows, attention sinks, logit caps) raise NotImplementedError.

SGLang switches its layers to AMX kernels only when `convert_weight_packed` exists
(sglang.srt.utils.common._is_intel_amx_backend_available); it is not registered here,
so the model's layers stay on their torch paths.
"""

from __future__ import annotations

from typing import Optional

import torch
from torch.nn.functional import scaled_dot_product_attention

from _nccl_tune_substitute import NotImplementedBySubstitute


def _unsupported(op: str, is_cross_attention: bool, sliding_window_size: int,
                 sinks: Optional[torch.Tensor], logit_cap: float) -> None:
    what = [name for name, used in (("cross-attention", is_cross_attention),
                                     ("a sliding window", sliding_window_size > 0),
                                     ("attention sinks", sinks is not None),
                                     ("a logit cap", logit_cap > 0)) if used]
    if what:
        raise NotImplementedBySubstitute(
            f"sgl_kernel.{op} with {', '.join(what)} is not implemented by nccl-tune's "
            "test-only substitute")


def _attend(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
            mask: Optional[torch.Tensor], scale: float) -> torch.Tensor:
    # [q, H, D] x [kv, Hkv, D] -> [q, H, Dv]; grouped-query heads shared as SGLang does
    out = scaled_dot_product_attention(
        query.movedim(0, 1).unsqueeze(0), key.movedim(0, 1).unsqueeze(0).to(query.dtype),
        value.movedim(0, 1).unsqueeze(0).to(query.dtype), attn_mask=mask, scale=scale,
        enable_gqa=query.shape[1] != key.shape[1])
    return out.squeeze(0).movedim(0, 1)


@torch.library.custom_op("sgl_kernel::decode_attention_cpu",
                         mutates_args=("k_buffer", "v_buffer", "output", "attn_logits"))
def decode_attention_cpu(query: torch.Tensor, k_buffer: torch.Tensor, v_buffer: torch.Tensor,
                         k_scale: float, v_scale: float, output: torch.Tensor,
                         key: Optional[torch.Tensor], value: Optional[torch.Tensor],
                         loc: torch.Tensor, attn_logits: torch.Tensor,
                         req_to_token: torch.Tensor, req_pool_indices: torch.Tensor,
                         seq_lens: torch.Tensor, sm_scale: float, logit_cap: float,
                         is_cross_attention: bool, sliding_window_size: int,
                         encoder_lens: Optional[torch.Tensor],
                         sinks: Optional[torch.Tensor]) -> None:
    """One new token per request: store its key/value at `loc` (the backend leaves that
    write to this op), then attend over the request's first seq_lens[i] cache slots."""
    del attn_logits, encoder_lens  # the kernel's split-K scratch; cross-attention only
    _unsupported("decode_attention_cpu", is_cross_attention, sliding_window_size, sinks, logit_cap)
    if key is not None and value is not None:
        k_buffer[loc] = key.view(-1, *k_buffer.shape[1:]).to(k_buffer.dtype)
        v_buffer[loc] = value.view(-1, *v_buffer.shape[1:]).to(v_buffer.dtype)
    for i, (row, length) in enumerate(zip(req_pool_indices.tolist(), seq_lens.tolist())):
        slots = req_to_token[row, :length].to(torch.int64)
        keys = k_buffer[slots] * k_scale if k_scale != 1.0 else k_buffer[slots]
        values = v_buffer[slots] * v_scale if v_scale != 1.0 else v_buffer[slots]
        output[i:i + 1] = _attend(query[i:i + 1], keys, values, None, sm_scale)


@torch.library.custom_op("sgl_kernel::extend_attention_cpu",
                         mutates_args=("o_extend",))
def extend_attention_cpu(q_extend: torch.Tensor, k_extend: Optional[torch.Tensor],
                         v_extend: Optional[torch.Tensor], o_extend: torch.Tensor,
                         k_buffer: torch.Tensor, v_buffer: torch.Tensor, k_scale: float,
                         v_scale: float, req_to_token: torch.Tensor,
                         req_pool_indices: torch.Tensor, seq_lens: torch.Tensor,
                         extend_seq_lens: torch.Tensor, extend_start_loc: torch.Tensor,
                         max_len_extend: int, sm_scale: float, logit_cap: float,
                         is_cross_attention: bool, sliding_window_size: int,
                         encoder_lens: Optional[torch.Tensor], sinks: Optional[torch.Tensor],
                         custom_mask: Optional[torch.Tensor], is_causal: bool) -> None:
    """Request i extends its first seq_lens[i] - extend_seq_lens[i] cached tokens (all
    visible) by extend_seq_lens[i] new ones starting at extend_start_loc[i]; the new ones
    see each other causally, or as `custom_mask` says (a speculative verify's draft tree:
    per request an n x n boolean block, row = query, column = key, requests in order)."""
    del max_len_extend, encoder_lens
    _unsupported("extend_attention_cpu", is_cross_attention, sliding_window_size, sinks, logit_cap)
    mask_at = 0
    for i, (row, total, new, start) in enumerate(zip(
            req_pool_indices.tolist(), seq_lens.tolist(), extend_seq_lens.tolist(),
            extend_start_loc.tolist())):
        prefix = total - new
        slots = req_to_token[row, :total].to(torch.int64)
        keys = k_buffer[slots].clone()
        values = v_buffer[slots].clone()
        if k_extend is not None and v_extend is not None:  # the new tokens as computed
            keys[prefix:] = k_extend[start:start + new].to(keys.dtype)
            values[prefix:] = v_extend[start:start + new].to(values.dtype)
        if k_scale != 1.0:
            keys = keys * k_scale
        if v_scale != 1.0:
            values = values * v_scale
        visible = torch.ones(new, total, dtype=torch.bool)
        if custom_mask is not None:
            block = custom_mask.reshape(-1)[mask_at:mask_at + new * new].reshape(new, new)
            visible[:, prefix:] = block.to(torch.bool)
            mask_at += new * new
        elif is_causal:
            visible[:, prefix:] = torch.ones(new, new, dtype=torch.bool).tril()
        o_extend[start:start + new] = _attend(q_extend[start:start + new], keys, values,
                                              visible, sm_scale)
