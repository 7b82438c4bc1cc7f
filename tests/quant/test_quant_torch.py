"""Differential test: KIVI re-implemented plainly in torch gives the same scales, zero points,
codes and dequantized values as rkv's numba kernels."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from quant_helpers import DT, KINDS, make_block, parse

from rkv.quant import KiviQuantizer

torch = pytest.importorskip("torch")

TORCH_DT = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32}
INT_DT = {"float16": torch.int16, "bfloat16": torch.int16, "float32": torch.int32}


def round_up_to(s64: Any, dtype: str) -> Any:
    """The smallest ``dtype`` value >= each float64 in ``s64`` (all >= 0), as float64."""
    tdt, idt = TORCH_DT[dtype], INT_DT[dtype]
    cand = s64.to(tdt)
    step_up = (cand.view(idt) + 1).view(tdt)
    cand = torch.where(cand.double() < s64, step_up, cand)
    step_down = (cand.view(idt) - 1).view(tdt)
    ok_down = (cand.view(idt) > 0) & (step_down.double() >= s64)
    return torch.where(ok_down, step_down, cand).double()


def kivi_torch(x: Any, bits: int, group: int, dtype: str) -> tuple[Any, ...]:
    """Naive KIVI: returns (key scales, key zeros, value scales, value zeros, codes, x^)."""
    levels = (1 << bits) - 1
    _, t, h, d = x.shape
    keys, vals = x[0], x[1]
    # keys: per channel, groups of `group` tokens (pad the ragged group with +-inf)
    nkt = -(-t // group)
    pad = nkt * group - t
    kpad_lo = torch.cat([keys, torch.full((pad, h, d), float("inf"))]).view(nkt, group, h, d)
    kpad_hi = torch.cat([keys, torch.full((pad, h, d), float("-inf"))]).view(nkt, group, h, d)
    kmin, kmax = kpad_lo.amin(dim=1), kpad_hi.amax(dim=1)
    # values: per token, groups of min(group, d) elements along head_dim
    gv = min(group, d)
    nvd = -(-d // gv)
    pad = nvd * gv - d
    vpad_lo = torch.cat([vals, torch.full((t, h, pad), float("inf"))], dim=2)
    vpad_hi = torch.cat([vals, torch.full((t, h, pad), float("-inf"))], dim=2)
    vmin = vpad_lo.view(t, h, nvd, gv).amin(dim=3)
    vmax = vpad_hi.view(t, h, nvd, gv).amax(dim=3)

    ks = round_up_to((kmax.double() - kmin.double()) / levels, dtype)
    vs = round_up_to((vmax.double() - vmin.double()) / levels, dtype)
    kz, vz = kmin + 0.0, vmin + 0.0  # a zero minimum is +0.0

    tok = torch.arange(t) // group
    dim = torch.arange(d) // gv
    s = torch.stack([ks[tok], vs[:, :, dim]]).float()
    z = torch.stack([kz[tok], vz[:, :, dim]]).float()
    div = torch.where(s == 0, torch.ones_like(s), s)
    codes = torch.round((x - z) / div).clamp(0, levels)
    xhat = z + codes * s
    if dtype == "float16":
        xhat = xhat.clamp(-65504, 65504)
    return ks, kz, vs, vz, codes.to(torch.uint8), xhat.to(TORCH_DT[dtype])


def to_torch(x: np.ndarray) -> Any:
    return torch.from_numpy(x.astype(np.float32))


def torch_block_bits(t: Any, dtype: str) -> np.ndarray:
    return t.view(INT_DT[dtype]).numpy().view(DT[dtype])


@settings(max_examples=60)
@given(
    st.integers(1, 70), st.integers(1, 3), st.sampled_from([1, 4, 8, 64]),
    st.sampled_from(["float16", "bfloat16", "float32"]), st.sampled_from([2, 4, 8]),
    st.sampled_from([1, 3, 8, 32, 64]), st.sampled_from(KINDS), st.integers(0, 2**32 - 1),
)
def test_matches_plain_torch(t: int, h: int, d: int, dtype: str, bits: int, group: int,
                             kind: str, seed: int) -> None:
    shape = (2, t, h, d)
    x = make_block(seed, shape, dtype, kind)
    q = KiviQuantizer(bits, group)
    enc = q.encode(x)
    p = parse(enc, bits, group, shape, dtype)
    ks, kz, vs, vz, codes, xhat = kivi_torch(to_torch(x), bits, group, dtype)
    assert np.array_equal(p.ks, ks.numpy())
    assert np.array_equal(p.vs, vs.numpy())
    assert np.array_equal(p.kz, kz.double().numpy())
    assert np.array_equal(p.vz, vz.double().numpy())
    assert np.array_equal(p.codes, codes.numpy())
    y = q.decode(enc, shape, dtype)
    ref = torch_block_bits(xhat, dtype)
    # same float32 operations: equal to the bit (float tolerance would be the fallback)
    assert y.tobytes() == ref.tobytes()


@pytest.mark.slow
@settings(max_examples=1500)
@given(
    st.integers(1, 300), st.integers(1, 8), st.sampled_from([1, 3, 8, 64, 128]),
    st.sampled_from(["float16", "bfloat16", "float32"]), st.sampled_from([2, 4, 8]),
    st.integers(1, 160), st.sampled_from(KINDS), st.integers(0, 2**32 - 1),
)
def test_matches_plain_torch_many(t: int, h: int, d: int, dtype: str, bits: int, group: int,
                                  kind: str, seed: int) -> None:
    test_matches_plain_torch.hypothesis.inner_test(  # type: ignore[attr-defined]
        t, h, d, dtype, bits, group, kind, seed)
