"""A small tensor-parallel decoder for the built-in speculative decode loop.

The shape follows gpt-fast (pytorch-labs/gpt-fast, model.py and tp.py) and Megatron-style
tensor parallelism: in each layer the attention QKV and the MLP up-projection are split
by output (column-parallel, no communication), the attention out-projection and the MLP
down-projection by input (row-parallel), and each of the two row-parallel outputs is
summed over ranks with one allreduce. The token embedding is vocab-parallel (each rank
holds a slice of the rows; out-of-slice tokens give zeros) and needs one allreduce, as
SGLang's VocabParallelEmbedding does. So one forward of n tokens runs 2 x layers + 1
allreduces of n x hidden elements, which is the communication DESIGN.md section 1 models.
The output head is replicated on every rank (no collective), so every rank computes the
same logits and takes the same greedy decisions without further communication.

Weights come from a seed: each shard is drawn from its own generator, seeded from the
model seed, the tensor's name and the shard index, so every rank agrees on the model
without any rank holding the full matrices. (A model drawn for world size 2 is therefore
a different model from one drawn for world size 4; comparisons are made at one size.)

Exact mode (float64): every activation that enters a matrix product is rounded to a
grid of 2**-10 and bounded by 32, every weight to a grid of 2**-12 and bounded by 1.
Each product is then a multiple of 2**-22 far below 2**53 units, so every matrix product,
sum and allreduce is exact: its result does not depend on summation order, GEMM kernel,
threads, batch shape or the order in which gloo/NCCL add the ranks' parts. Softmax is
replaced by weights from an integer table indexed by the rounded score gap (an exact
base-e softmax up to the table's resolution), divided once by their exact sum. The
remaining operations are elementwise IEEE operations (multiply, add, divide, sqrt,
round), which are correctly rounded and so give the same bits for the same input in any
shape. Hence the logits of a token are bit-identical whether it is decoded alone or
verified with k others, and greedy speculative decoding reproduces plain greedy decoding
exactly. In the other dtypes (fp32, bf16, fp16) the model is a plain transformer (softmax
attention, no rounding) and no such guarantee is made.
"""

from __future__ import annotations

import hashlib
import math
import time
from dataclasses import dataclass

import torch

ACT_FRAC_BITS = 10  # activations: multiples of 2**-10
ACT_BOUND = 32.0  # |activation| <= 32
WEIGHT_FRAC_BITS = 12  # weights: multiples of 2**-12
WEIGHT_BOUND = 1.0 - 2.0**-WEIGHT_FRAC_BITS
SCORE_STEPS = 16  # exact attention: score gaps rounded to 1/16
TABLE_BITS = 16  # exact attention: weights are integers <= 2**16
TABLE_SIZE = SCORE_STEPS * 12 + 1  # exp(-12) * 2**16 < 1: beyond that the weight is 0
RMS_EPS = 1e-6

DTYPES = {
    "float64": torch.float64,
    "fp64": torch.float64,
    "float32": torch.float32,
    "fp32": torch.float32,
    "bfloat16": torch.bfloat16,
    "bf16": torch.bfloat16,
    "float16": torch.float16,
    "fp16": torch.float16,
}
DTYPE_NAMES = {torch.float64: "float64", torch.float32: "float32", torch.bfloat16: "bfloat16", torch.float16: "float16"}


@dataclass(frozen=True)
class ModelShape:
    """Sizes of one model (target or draft)."""

    layers: int
    hidden: int
    heads: int
    vocab: int
    ffn: int

    @property
    def head_dim(self) -> int:
        """Per-head width."""
        return self.hidden // self.heads

    def check(self, world: int) -> None:
        """ValueError naming the first size that does not split over `world` ranks."""
        if min(self.layers, self.hidden, self.heads, self.vocab, self.ffn) < 1:
            raise ValueError("layers, hidden, heads, vocab and ffn must be positive")
        if self.hidden % self.heads:
            raise ValueError(f"hidden {self.hidden} is not a multiple of heads {self.heads}")
        if self.head_dim % 2:
            raise ValueError(f"head size {self.head_dim} must be even (rotary embedding)")
        for name, value in (("heads", self.heads), ("vocab", self.vocab), ("ffn", self.ffn)):
            if value % world:
                raise ValueError(f"{name} {value} is not a multiple of the world size {world}")


class Collective:
    """The allreduce of the row-parallel layers, counted; a no-op when skipped.

    `count` and `elements` accumulate over calls so the loop can report how many
    allreduces a step ran and of what size. With `skip` the data is left as it is (each
    rank keeps its partial sum): the model's output is then wrong, but the compute time
    without communication can be measured.
    """

    def __init__(self, group=None, skip: bool = False, stamp: bool = False, device=None):
        self.group = group
        self.skip = skip
        self.device = device
        self.count = 0  # every collective call: allreduces and decision broadcasts
        self.allreduces = 0
        self.broadcasts = 0
        self.elements = 0
        # (enter, exit) host times per call, for integration.commtime; only meaningful
        # where the collective is synchronous on the host (gloo on CPU)
        self.stamps: list[tuple[float, float]] | None = [] if stamp else None

    def allreduce(self, tensor: torch.Tensor) -> torch.Tensor:
        """Sum `tensor` over ranks in place (unless skipped) and count the call."""
        self.count += 1
        self.allreduces += 1
        self.elements += tensor.numel()
        enter = time.perf_counter() if self.stamps is not None else 0.0
        if not self.skip and self.group is not None:
            import torch.distributed as dist

            dist.all_reduce(tensor, group=self.group)
        if self.stamps is not None:
            self.stamps.append((enter, time.perf_counter()))
        return tensor

    def share(self, values: list[int], src: int = 0) -> list[int]:
        """Rank `src`'s `values` on every rank (one broadcast of len(values) integers,
        counted and stamped like an allreduce); this rank's own values when skipped or
        alone. Every rank must pass the same length."""
        self.count += 1
        self.broadcasts += 1
        enter = time.perf_counter() if self.stamps is not None else 0.0
        out = list(values)
        if not self.skip and self.group is not None:
            import torch.distributed as dist

            tensor = torch.tensor(values, dtype=torch.int64, device=self.device)
            dist.broadcast(tensor, src=src, group=self.group)
            out = tensor.tolist()  # waits for the device too
        if self.stamps is not None:
            self.stamps.append((enter, time.perf_counter()))
        return out


def _seed_for(seed: int, *parts) -> int:
    text = ":".join(str(p) for p in (seed, *parts))
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "little") & ((1 << 63) - 1)


CHUNK_ELEMENTS = 1 << 24  # draw big tensors in row blocks: bounded host memory


def _normal(shape, seed: int, parts: tuple, device) -> torch.Tensor:
    # Drawn in float64 on the CPU, so a given seed gives the same numbers on any device;
    # row blocks have seeds of their own, so a replicated 129k x 7168 head never needs
    # more than CHUNK_ELEMENTS doubles of host memory at a time.
    shape = tuple(shape)
    out = torch.empty(shape, dtype=torch.float64, device=device)
    rows = out.shape[0]
    per_row = max(1, out[0].numel()) if rows else 1
    block = max(1, CHUNK_ELEMENTS // per_row)
    for index, start in enumerate(range(0, rows, block)):
        gen = torch.Generator(device="cpu").manual_seed(_seed_for(seed, *parts, "rows", index))
        stop = min(rows, start + block)
        out[start:stop] = torch.randn((stop - start, *shape[1:]), generator=gen, dtype=torch.float64)
    return out


def round_to_grid(x: torch.Tensor, frac_bits: int, bound: float) -> torch.Tensor:
    """x rounded to a multiple of 2**-frac_bits and clamped to [-bound, bound] (exact ops)."""
    scale = float(2**frac_bits)
    return torch.round(x * scale).clamp_(-bound * scale, bound * scale).div_(scale)


class Arithmetic:
    """Rounding rules: the exact grid in float64, nothing in the other dtypes."""

    def __init__(self, dtype: torch.dtype):
        self.dtype = dtype
        self.exact = dtype == torch.float64

    def act(self, x: torch.Tensor) -> torch.Tensor:
        """Round an activation onto the grid (exact mode) or return it unchanged."""
        return round_to_grid(x, ACT_FRAC_BITS, ACT_BOUND) if self.exact else x

    def weight(self, w: torch.Tensor) -> torch.Tensor:
        """A float64 weight on the grid (exact mode) or cast to the dtype."""
        if self.exact:
            return round_to_grid(w, WEIGHT_FRAC_BITS, WEIGHT_BOUND)
        return w.to(self.dtype)


@dataclass
class LayerWeights:
    """One layer's shards on this rank."""

    wqkv: torch.Tensor  # [3 * local_heads * head_dim, hidden]  column-parallel
    wo: torch.Tensor  # [hidden, local_heads * head_dim]      row-parallel
    w1: torch.Tensor  # [ffn / world, hidden]                  column-parallel
    w2: torch.Tensor  # [hidden, ffn / world]                  row-parallel


def make_layer(
    shape: ModelShape,
    layer: int,
    seed: int,
    rank: int,
    world: int,
    arith: Arithmetic,
    device,
    residual_scale: float = 1.0,
) -> LayerWeights:
    """Draw this rank's shards of one layer (normal, std 1/sqrt(fan_in))."""
    local_heads, local_ffn = shape.heads // world, shape.ffn // world
    hd, h = shape.head_dim, shape.hidden
    inv = 1.0 / math.sqrt(h)

    def draw(name, rows, cols, std):
        return arith.weight(_normal((rows, cols), seed, (name, layer, rank, world), device) * std)

    return LayerWeights(
        wqkv=draw("wqkv", 3 * local_heads * hd, h, inv),
        wo=draw("wo", h, local_heads * hd, residual_scale / math.sqrt(shape.heads * hd)),
        w1=draw("w1", local_ffn, h, inv),
        w2=draw("w2", h, local_ffn, residual_scale / math.sqrt(shape.ffn)),
    )


def perturb_layer(
    layer: LayerWeights, noise: float, seed: int, index: int, rank: int, world: int, arith: Arithmetic
) -> LayerWeights:
    """A copy of `layer` with relative Gaussian noise (noise x each matrix's std) added."""
    if noise == 0:
        return layer
    out = {}
    for name in ("wqkv", "wo", "w1", "w2"):
        w = getattr(layer, name).to(torch.float64)
        std = float(w.std()) if w.numel() > 1 else 0.0
        delta = _normal(tuple(w.shape), seed, ("draft-noise", name, index, rank, world), w.device)
        out[name] = arith.weight(w + noise * std * delta)
    return LayerWeights(**out)


class KVCache:
    """Keys and values of every layer for positions [0, max_len) on this rank's heads.

    `length` is how many positions hold valid entries; rolling back after a rejected
    speculation is setting `length` back (later entries are overwritten by the next
    forward and are never attended to, since attention reads [0, position]).
    """

    def __init__(self, layers: int, max_len: int, local_heads: int, head_dim: int, dtype: torch.dtype, device):
        self.k = torch.zeros(layers, max_len, local_heads, head_dim, dtype=dtype, device=device)
        self.v = torch.zeros_like(self.k)
        self.length = 0

    @property
    def max_len(self) -> int:
        """Positions the cache can hold."""
        return self.k.shape[1]


class TPTransformer:
    """A pre-norm decoder with tensor-parallel layers, a vocab-parallel embedding and a
    replicated output head; `forward` appends to a KV cache and returns logits."""

    def __init__(
        self,
        shape: ModelShape,
        layers: list[LayerWeights],
        embedding: torch.Tensor,
        lm_head: torch.Tensor,
        collective: Collective,
        rank: int,
        world: int,
        arith: Arithmetic,
    ):
        self.shape = shape
        self.layers = layers
        self.embedding = embedding  # [vocab / world, hidden], rows of this rank's slice
        self.lm_head = lm_head  # [vocab, hidden], replicated
        self.collective = collective
        self.rank, self.world = rank, world
        self.arith = arith
        self.local_heads = shape.heads // world
        self.vocab_lo = rank * (shape.vocab // world)
        self.vocab_hi = self.vocab_lo + shape.vocab // world
        self._rope_cache: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        if arith.exact:
            ladder = torch.arange(TABLE_SIZE, dtype=torch.float64) / SCORE_STEPS
            self.table = torch.round(torch.exp(-ladder) * 2**TABLE_BITS).to(embedding.device)

    @property
    def device(self):
        """The device the weights live on."""
        return self.embedding.device

    def new_cache(self, max_len: int) -> KVCache:
        """An empty KV cache for this model."""
        return KVCache(self.shape.layers, max_len, self.local_heads, self.shape.head_dim, self.arith.dtype, self.device)

    def _rope(self, max_len: int) -> tuple[torch.Tensor, torch.Tensor]:
        # cos/sin tables computed once per length, so every call reads the same numbers.
        if max_len not in self._rope_cache:
            half = self.shape.head_dim // 2
            freqs = 1.0 / (10000.0 ** (torch.arange(half, dtype=torch.float64) / half))
            angles = torch.outer(torch.arange(max_len, dtype=torch.float64), freqs)
            self._rope_cache[max_len] = (
                angles.cos().to(self.device, self.arith.dtype),
                angles.sin().to(self.device, self.arith.dtype),
            )
        return self._rope_cache[max_len]

    def _rotate(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        # x: [n, heads, head_dim]; rotate the two halves (elementwise ops only).
        half = x.shape[-1] // 2
        a, b = x[..., :half], x[..., half:]
        c, s = cos[:, None, :], sin[:, None, :]
        return self.arith.act(torch.cat((a * c - b * s, a * s + b * c), dim=-1))

    def _norm(self, x: torch.Tensor) -> torch.Tensor:
        mean_sq = (x * x).sum(dim=-1, keepdim=True) / x.shape[-1]
        return self.arith.act(x / torch.sqrt(mean_sq + RMS_EPS))

    def _attend(self, q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, start: int) -> torch.Tensor:
        # q: [n, H, d]; keys/values: [T, H, d] with T = start + n; causal by position.
        n, total = q.shape[0], keys.shape[0]
        query_pos = torch.arange(start, start + n, device=q.device)[:, None]
        allowed = torch.arange(total, device=q.device)[None, :] <= query_pos  # [n, T]
        return self._attend_masked(q, keys, values, allowed)

    def _attend_masked(
        self, q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, allowed: torch.Tensor
    ) -> torch.Tensor:
        # q: [n, H, d]; keys/values: [T, H, d]; allowed: [n, T], which keys each query sees.
        scores = torch.einsum("nhd,thd->hnt", q, keys) * (1.0 / math.sqrt(q.shape[-1]))
        if not self.arith.exact:
            probs = torch.softmax(scores.masked_fill(~allowed, float("-inf")), dim=-1)
            return torch.einsum("hnt,thd->nhd", probs, values)
        masked = scores.masked_fill(~allowed, float("-inf"))
        gap = masked.amax(dim=-1, keepdim=True) - masked  # >= 0, inf where masked
        index = torch.round(gap.clamp(max=TABLE_SIZE) * SCORE_STEPS).clamp_(max=TABLE_SIZE - 1)
        weights = torch.where(allowed, self.table[index.long()], torch.zeros((), dtype=scores.dtype, device=q.device))
        numerator = torch.einsum("hnt,thd->nhd", weights, values)  # exact: integers x grid
        return self.arith.act(numerator / weights.sum(dim=-1).transpose(0, 1)[..., None])

    def embed(self, tokens: torch.Tensor) -> torch.Tensor:
        """Vocab-parallel embedding: local rows, zeros elsewhere, one allreduce."""
        local = (tokens >= self.vocab_lo) & (tokens < self.vocab_hi)
        rows = self.embedding[(tokens - self.vocab_lo).clamp(0, self.embedding.shape[0] - 1)]
        hidden = rows * local[:, None].to(rows.dtype)
        return self.collective.allreduce(hidden.contiguous())

    def forward(self, tokens: list[int], cache: KVCache) -> torch.Tensor:
        """Logits [len(tokens), vocab] for tokens at positions cache.length onwards.

        The cache grows by len(tokens) positions.
        """
        n, start = len(tokens), cache.length
        if start + n > cache.max_len:
            raise ValueError(f"KV cache full: {start + n} positions > {cache.max_len}")
        ids = torch.tensor(tokens, dtype=torch.long, device=self.device)
        x = self.embed(ids)
        cos, sin = self._rope(cache.max_len)
        cos, sin = cos[start : start + n], sin[start : start + n]
        hd, lh = self.shape.head_dim, self.local_heads
        for i, layer in enumerate(self.layers):
            qkv = self._norm(x) @ layer.wqkv.T  # [n, 3 * lh * hd]
            q, k, v = qkv.view(n, 3, lh, hd).unbind(dim=1)
            q, k, v = self._rotate(q, cos, sin), self._rotate(k, cos, sin), self.arith.act(v)
            cache.k[i, start : start + n] = k
            cache.v[i, start : start + n] = v
            attn = self._attend(q, cache.k[i, : start + n], cache.v[i, : start + n], start)
            out = self.collective.allreduce((attn.reshape(n, lh * hd) @ layer.wo.T).contiguous())
            x = self.arith.act(x + out)
            up = torch.relu(self._norm(x) @ layer.w1.T)
            down = self.collective.allreduce((self.arith.act(up) @ layer.w2.T).contiguous())
            x = self.arith.act(x + down)
        cache.length = start + n
        return self._norm(x) @ self.lm_head.T

    def _batch_mask(self, starts: list[int], lens: list[int]) -> torch.Tensor:
        """[sum(lens), sum(starts + lens)]: each query sees its own sequence's keys up to its
        position (the sequences' caches laid end to end)."""
        rows = []
        for j, (start, n) in enumerate(zip(starts, lens)):
            pos = torch.arange(start, start + n, device=self.device)[:, None]
            blocks = [
                torch.zeros(n, s2 + n2, dtype=torch.bool, device=self.device)
                if j2 != j
                else torch.arange(s2 + n2, device=self.device)[None, :] <= pos
                for j2, (s2, n2) in enumerate(zip(starts, lens))
            ]
            rows.append(torch.cat(blocks, dim=1))
        return torch.cat(rows)

    def forward_many(self, token_lists: list[list[int]], caches: list[KVCache]) -> list[torch.Tensor]:
        """A batch of sequences in one forward: logits [len(tokens_i), vocab] per sequence
        for its tokens at its cache's positions onwards.

        As a serving engine batches: the embedding, every GEMM and every allreduce run on
        all sequences' tokens together (sum of len(tokens_i) rows, so one allreduce of that
        many x hidden per call), and attention is one masked product over the caches laid
        end to end, each query seeing only its own sequence's keys (so the time grows with
        tokens and context, not with a loop over sequences). Row by row the arithmetic is
        `forward`'s (masked keys add exact zeros), so each sequence's logits equal forward's.
        """
        lens = [len(t) for t in token_lists]
        starts = [c.length for c in caches]
        for cache, start, n in zip(caches, starts, lens):
            if start + n > cache.max_len:
                raise ValueError(f"KV cache full: {start + n} positions > {cache.max_len}")
        total = sum(lens)
        ids = torch.tensor([t for tokens in token_lists for t in tokens], dtype=torch.long, device=self.device)
        x = self.embed(ids)
        cos_all, sin_all = self._rope(caches[0].max_len)
        cos = torch.cat([cos_all[s : s + n] for s, n in zip(starts, lens)])
        sin = torch.cat([sin_all[s : s + n] for s, n in zip(starts, lens)])
        hd, lh = self.shape.head_dim, self.local_heads
        allowed = self._batch_mask(starts, lens)
        for i, layer in enumerate(self.layers):
            qkv = self._norm(x) @ layer.wqkv.T
            q, k, v = qkv.view(total, 3, lh, hd).unbind(dim=1)
            q, k, v = self._rotate(q, cos, sin), self._rotate(k, cos, sin), self.arith.act(v)
            offset = 0
            for cache, start, n in zip(caches, starts, lens):
                cache.k[i, start : start + n] = k[offset : offset + n]
                cache.v[i, start : start + n] = v[offset : offset + n]
                offset += n
            keys = torch.cat([c.k[i, : s + n] for c, s, n in zip(caches, starts, lens)])
            values = torch.cat([c.v[i, : s + n] for c, s, n in zip(caches, starts, lens)])
            attn = self._attend_masked(q, keys, values, allowed)
            out = self.collective.allreduce((attn.reshape(total, lh * hd) @ layer.wo.T).contiguous())
            x = self.arith.act(x + out)
            up = torch.relu(self._norm(x) @ layer.w1.T)
            down = self.collective.allreduce((self.arith.act(up) @ layer.w2.T).contiguous())
            x = self.arith.act(x + down)
        for cache, start, n in zip(caches, starts, lens):
            cache.length = start + n
        return list(torch.split(self._norm(x) @ self.lm_head.T, lens))


def build_models(
    shape: ModelShape,
    draft_layers: int,
    draft_noise: float,
    seed: int,
    rank: int,
    world: int,
    dtype: torch.dtype,
    device,
    collective: Collective,
    share_embedding: bool = True,
    residual_scale: float = 1.0,
) -> tuple[TPTransformer, TPTransformer]:
    """The target model and its draft (the target's first `draft_layers` layers with
    relative weight noise `draft_noise`; embedding shared or a noisy copy; head shared)."""
    shape.check(world)
    if not 1 <= draft_layers <= shape.layers:
        raise ValueError(f"draft layers {draft_layers} must be between 1 and {shape.layers}")
    arith = Arithmetic(dtype)
    layers = [make_layer(shape, i, seed, rank, world, arith, device, residual_scale) for i in range(shape.layers)]
    rows = shape.vocab // world
    embed_raw = _normal((rows, shape.hidden), seed, ("embedding", rank, world), device)
    embedding = round_to_grid(embed_raw, ACT_FRAC_BITS, ACT_BOUND) if arith.exact else embed_raw.to(dtype)
    lm_head = arith.weight(_normal((shape.vocab, shape.hidden), seed, ("lm_head",), device) / math.sqrt(shape.hidden))
    target = TPTransformer(shape, layers, embedding, lm_head, collective, rank, world, arith)
    draft_shape = ModelShape(draft_layers, shape.hidden, shape.heads, shape.vocab, shape.ffn)
    draft_layer_list = [perturb_layer(layers[i], draft_noise, seed, i, rank, world, arith) for i in range(draft_layers)]
    draft_embedding = embedding
    if not share_embedding:
        noisy = embedding.to(torch.float64) + draft_noise * _normal(
            tuple(embedding.shape), seed, ("draft-embedding", rank, world), device
        )
        draft_embedding = round_to_grid(noisy, ACT_FRAC_BITS, ACT_BOUND) if arith.exact else noisy.to(dtype)
    draft = TPTransformer(draft_shape, draft_layer_list, draft_embedding, lm_head, collective, rank, world, arith)
    return target, draft
