"""TEST-ONLY: sgl_kernel.speculative (see sgl_kernel/__init__.py)."""

from __future__ import annotations

import torch
from _nccl_tune_substitute import missing


def reconstruct_indices_from_tree_mask(
    tree_mask: torch.Tensor,
    verified_seq_len: torch.Tensor,
    positions: torch.Tensor,
    retrieve_index: torch.Tensor,
    retrieve_next_token: torch.Tensor,
    retrieve_next_sibling: torch.Tensor,
    batch_size: int,
    draft_token_num: int,
) -> None:
    """NGRAM's verify metadata from its draft tree's ancestor mask, in place, per request b
    with n = draft_token_num (the contract written out in sglang/kernels/ops/speculative/
    reconstruct_tree.py): tree_mask[b, i, j] with j < i marks j an ancestor of i;
    positions = the number of ancestors + verified_seq_len[b]; retrieve_index = b * n + i;
    parent(i) = the largest ancestor; retrieve_next_token(i) = the smallest k > i that has
    i as an ancestor (its first child), else -1; retrieve_next_sibling(i) = the smallest
    k > i with the same parent, else -1, and -1 for a node without a parent."""
    n = draft_token_num
    if batch_size == 0:
        return
    mask = tree_mask.reshape(-1)[: batch_size * n * n].reshape(batch_size, n, n).to(torch.bool)
    node = torch.arange(n)
    ancestors = mask & (node[None, :] < node[:, None])[None]  # [b, i, j]: j < i
    depth = ancestors.sum(dim=2)
    positions.view(batch_size, n).copy_(depth + verified_seq_len[:batch_size].to(torch.int64)[:, None])
    retrieve_index.view(batch_size, n).copy_(torch.arange(batch_size * n).view(batch_size, n))
    never = torch.full((), n, dtype=torch.int64)
    parent = torch.where(ancestors, node[None, None, :], torch.full((), -1)).amax(dim=2)  # [b, i]
    # first child of t: min k with ancestors[k, t] (k > t is implied by j < i)
    child = torch.where(ancestors, node[None, :, None], never).amin(dim=1)  # [b, t]
    retrieve_next_token.view(batch_size, n).copy_(torch.where(child < n, child, torch.full((), -1)))
    later = node[:, None] > node[None, :]  # [k, t]: k > t
    same = (parent[:, :, None] == parent[:, None, :]) & later[None]  # [b, k, t]
    sibling = torch.where(same, node[None, :, None], never).amin(dim=1)  # [b, t]
    has_parent = parent >= 0
    retrieve_next_sibling.view(batch_size, n).copy_(
        torch.where(has_parent & (sibling < n), sibling, torch.full((), -1))
    )


def __getattr__(name: str):
    return missing(__name__, name)
