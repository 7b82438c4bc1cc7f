"""Where a token's K and V live in vLLM's paged KV cache, and the canary that checks it.

vLLM keeps each attention layer's KV in blocks of ``block_size`` tokens, in a layout that
depends on the attention backend. rkv stores ``[2, tokens, kv_heads, head_dim]`` per layer.
A :class:`PagedLayout` turns a layer's cache tensor into a *view* with the axes
``[blocks, 2, block_size, kv_heads, head_dim]`` (no copy), so gathering a request's blocks
into rkv's layout and scattering them back are one indexed copy per layer, whatever the
backend's strides.

Reading a cache with the wrong layout is the failure peers' users hit after a backend
change: the K/V of one token read from the bytes of others, silently. The shapes alone do
not catch it: vLLM's CPU cache is ``[blocks, heads, block_size, 2 * head_dim]``, its Python
code reads it as keys then values per (block, head), and its ``vec`` kernel in fact stores
the keys transposed (found here by the canary, not by reading). So :func:`run_canary`
checks a layout against vLLM's own cache writer (the kernel a prefill writes KV with):
known K/V written by vLLM must gather to exactly themselves, survive a round trip through
the store, and scatter into other blocks exactly where vLLM's writer puts them. Any
difference disables the connector's loads and saves (docs/vllm.md).

torch is imported lazily; vLLM is not imported here at all (the canary takes the writer).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from rkv.errors import ConfigError, ShapeError

if TYPE_CHECKING:
    from rkv.format.model import ModelSpec
    from rkv.store.engine import Engine


@dataclass(frozen=True)
class PagedLayout:
    """One way a backend lays a layer's KV out in blocks.

    ``shape(blocks, heads, block_size, head_dim)`` is the layer tensor's shape, with the
    blocks on axis ``block_axis``; ``views(layer, heads, head_dim, block_size)`` returns
    two views of it, K and V, each ``[blocks, block_size, heads, head_dim]`` (no copy)."""

    name: str
    description: str
    shape: Callable[[int, int, int, int], tuple[int, ...]]
    views: Callable[[Any, int, int, int], tuple[Any, Any]]
    block_axis: int = 0

    def kv_views(self, layer: Any, heads: int, head_dim: int, block_size: int
                 ) -> tuple[Any, Any]:
        """K and V of ``layer`` as ``[blocks, block_size, heads, head_dim]`` views; a
        tensor of another shape is a :class:`ShapeError`."""
        nb = int(layer.shape[self.block_axis])
        want = self.shape(nb, heads, block_size, head_dim)
        if tuple(layer.shape) != want:
            raise ShapeError(f"vLLM's KV cache layer has shape {tuple(layer.shape)}; layout "
                             f"{self.name!r} expects {want}")
        return self.views(layer, heads, head_dim, block_size)

    @staticmethod
    def gather(views: tuple[Any, Any], block_ids: Any) -> Any:
        """The KV of ``block_ids`` (a long tensor) as a new contiguous ``[2, len(block_ids)
        * block_size, heads, head_dim]`` tensor."""
        import torch

        k, v = (x.index_select(0, block_ids) for x in views)     # [n, bs, H, D] each
        n, bs, h, d = k.shape
        return torch.stack([k, v]).reshape(2, n * bs, h, d)

    @staticmethod
    def gather_into(views: tuple[Any, Any], block_ids: Any, out: Any) -> None:
        """:meth:`gather` into ``out`` (a contiguous ``[2, len(block_ids) * block_size,
        heads, head_dim]`` tensor), one copy."""
        import torch

        n = int(block_ids.numel())
        for x, o in zip(views, out, strict=True):
            torch.index_select(x, 0, block_ids, out=o.view(n, -1, *o.shape[1:]))

    @staticmethod
    def scatter(views: tuple[Any, Any], block_ids: Any, kv: Any) -> None:
        """Write ``kv`` (``[2, len(block_ids) * block_size, heads, head_dim]``) into the
        blocks ``block_ids`` (so into vLLM's cache)."""
        n = int(block_ids.numel())
        _, t, h, d = kv.shape
        for x, part in zip(views, kv, strict=True):
            x[block_ids] = part.reshape(n, t // n, h, d)


def _packed_shape(nb: int, h: int, bs: int, d: int) -> tuple[int, ...]:
    return (nb, h, bs, 2 * d)


def _cpu_vec(layer: Any, h: int, d: int, bs: int) -> tuple[Any, Any]:
    # Per block and head: the keys transposed ([head_dim, block_size]), then the values
    # ([block_size, head_dim]); found with vLLM's writer (cpu_attn_reshape_and_cache).
    t = layer.reshape(layer.shape[0], h, 2, bs * d)
    k = t[:, :, 0].unflatten(-1, (d, bs)).permute(0, 3, 1, 2)
    v = t[:, :, 1].unflatten(-1, (bs, d)).permute(0, 2, 1, 3)
    return k, v


def _heads_kv_tokens(layer: Any, h: int, d: int, bs: int) -> tuple[Any, Any]:
    t = layer.reshape(layer.shape[0], h, 2, bs, d)
    return t[:, :, 0].permute(0, 2, 1, 3), t[:, :, 1].permute(0, 2, 1, 3)


def _heads_tokens_kv(layer: Any, h: int, d: int, bs: int) -> tuple[Any, Any]:
    t = layer.reshape(layer.shape[0], h, bs, 2, d)
    return t[:, :, :, 0].permute(0, 2, 1, 3), t[:, :, :, 1].permute(0, 2, 1, 3)


def _kv_blocks(layer: Any, h: int, d: int, bs: int) -> tuple[Any, Any]:
    return layer[0], layer[1]


#: Layouts by name. ``cpu-vec`` is vLLM's CPU backend (CPU_ATTN) with its ``vec`` kernels
#: (x86 without AMX, fp32/fp16 or bf16): the tensor is ``[blocks, heads, block_size,
#: 2 * head_dim]`` and each (block, head) holds its keys *transposed* (``[head_dim,
#: block_size]``) then its values (``[block_size, head_dim]``). ``blocks-heads-kv-tokens``
#: is what the backend's Python code suggests (keys not transposed) and
#: ``blocks-heads-tokens-kv`` the naive reading of ``2 * head_dim`` as K|V per token: both
#: wrong for ``cpu-vec`` (the canary catches them; kept to show it).
#: ``kv-blocks-tokens-heads`` is ``[2, blocks, block_size, heads, head_dim]``, the NHD
#: layout of GPU backends (not tested here: the canary decides).
LAYOUTS: dict[str, PagedLayout] = {
    "cpu-vec": PagedLayout("cpu-vec", "CPU_ATTN (vec): [blocks, heads, K^T|V]",
                           _packed_shape, _cpu_vec),
    "blocks-heads-kv-tokens": PagedLayout(
        "blocks-heads-kv-tokens", "[blocks, heads, 2 (K then V), tokens, dim]",
        _packed_shape, _heads_kv_tokens),
    "blocks-heads-tokens-kv": PagedLayout(
        "blocks-heads-tokens-kv", "[blocks, heads, tokens, 2 (K|V), dim]",
        _packed_shape, _heads_tokens_kv),
    "kv-blocks-tokens-heads": PagedLayout(
        "kv-blocks-tokens-heads", "[2, blocks, tokens, heads, dim]",
        lambda nb, h, bs, d: (2, nb, bs, h, d), _kv_blocks, block_axis=1),
}

#: The layout each known attention backend (and CPU kernel ISA) uses (``layout="auto"``).
BACKEND_LAYOUTS = {"CPU_ATTN/vec": "cpu-vec"}


def resolve_layout(name: str, backend: str) -> PagedLayout:
    """The layout called ``name``, or for ``"auto"`` the backend's; an unknown one is a
    :class:`ConfigError` (the connector cannot read that cache)."""
    if name == "auto":
        if backend not in BACKEND_LAYOUTS:
            raise ConfigError(f"RkvConnector does not know the KV layout of attention backend "
                              f"{backend!r} (known: {sorted(BACKEND_LAYOUTS)}); name one with "
                              f"layout= ({sorted(LAYOUTS)}): the start-up canary checks it")
        name = BACKEND_LAYOUTS[backend]
    if name not in LAYOUTS:
        raise ConfigError(f"RkvConnector: unknown layout {name!r} (known: {sorted(LAYOUTS)})")
    return LAYOUTS[name]


#: ``writer(key, value, layer_tensor, slot_mapping)``: vLLM's own cache write of
#: ``[tokens, heads, head_dim]`` keys and values into a layer tensor at the given slots.
Writer = Callable[[Any, Any, Any, Any], None]


def run_canary(engine: Engine, spec: ModelSpec, layout: PagedLayout, writer: Writer,
               like: Any, *, block_size: int, chunk_tokens: int, seed: int = 0) -> str | None:
    """Check ``layout`` against vLLM's ``writer`` on scratch tensors shaped like ``like``
    (one layer of vLLM's cache), through a put and a verified get of ``engine`` under
    ``spec`` (a one-layer spec of its own, never a model's). Returns None when every
    value landed where vLLM puts it, else what differed."""
    import torch

    h, d = spec.n_kv_heads, spec.head_dim
    nblk = max(1, chunk_tokens // block_size)
    n = nblk * block_size
    nb = 2 * nblk + 1
    gen = torch.Generator().manual_seed(seed)
    dtype = like.dtype
    # Values that tell every position apart: random, so a permutation cannot match.
    key = torch.randn((n, h, d), generator=gen).to(dtype)
    value = torch.randn((n, h, d), generator=gen).to(dtype)
    shape = list(like.shape)
    shape[layout.block_axis] = nb

    def slots(blocks: list[int]) -> Any:
        b = torch.tensor(blocks, dtype=torch.long)
        return (b[:, None] * block_size + torch.arange(block_size)[None, :]).reshape(-1)

    src_blocks = list(range(1, nblk + 1))
    dst_blocks = list(range(nb - 1, nblk, -1))          # other blocks, in reverse order
    a = torch.zeros(shape, dtype=dtype)
    writer(key, value, a, slots(src_blocks))
    got = layout.gather(layout.kv_views(a, h, d, block_size), torch.tensor(src_blocks))
    want = torch.stack([key, value])
    if not torch.equal(got, want):
        bad = int((got != want).sum())
        return (f"gathering vLLM-written KV with layout {layout.name!r} gives other values "
                f"at {bad} of {want.numel()} positions")
    tokens = list(range(n))
    engine.put(tokens, got.unsqueeze(0), model=spec)
    try:
        read = engine.get(tokens, model=spec, as_torch=True)
    finally:
        engine.delete(tokens, model=spec)
    if read.n_tokens != n or not torch.equal(read.kv[0], want):
        return f"the store's round trip of the canary chunk failed ({read.counts})"
    b = torch.zeros(shape, dtype=dtype)
    layout.scatter(layout.kv_views(b, h, d, block_size), torch.tensor(dst_blocks), read.kv[0])
    c = torch.zeros(shape, dtype=dtype)
    writer(key, value, c, slots(dst_blocks))
    if not torch.equal(b, c):
        bad = int((b != c).sum())
        return (f"scattering with layout {layout.name!r} puts {bad} values where vLLM's "
                "writer does not")
    return None
