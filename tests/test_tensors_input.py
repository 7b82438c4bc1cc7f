"""What ``as_kv_array`` (and so ``Engine.put``) accepts, and the typed error for the rest."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from rkvtest import SMALL, local_config, random_kv

from rkv import Engine, InputError, ModelSpec, ShapeError
from rkv.format.dtypes import numpy_dtype
from rkv.format.tensors import as_kv_array

N = 10


def transposed_back(kv: np.ndarray) -> np.ndarray:
    """The same values and shape as ``kv`` through a non-contiguous view."""
    out = np.ascontiguousarray(kv.transpose(4, 3, 2, 1, 0)).transpose(4, 3, 2, 1, 0)
    assert not out.flags.c_contiguous
    return out


def test_contiguous_numpy_is_not_copied() -> None:
    kv = random_kv(SMALL, N)
    assert as_kv_array(kv, SMALL, N) is kv


@pytest.mark.parametrize("view", ["transposed", "sliced", "reversed", "broadcast"])
def test_non_contiguous_numpy(view: str) -> None:
    kv = random_kv(SMALL, N)
    if view == "transposed":
        arr = transposed_back(kv)
    elif view == "sliced":
        arr = np.concatenate([kv, kv], axis=-1)[..., : SMALL.head_dim]
    elif view == "reversed":
        arr, kv = kv[:, :, ::-1], kv[:, :, ::-1].copy()
    else:
        arr = np.broadcast_to(kv[:, :, :1], kv.shape)
        kv = arr.copy()
    out = as_kv_array(arr, SMALL, N)
    assert out.flags.c_contiguous and out.dtype == kv.dtype
    assert np.array_equal(out.view(np.uint16), kv.view(np.uint16))


def test_non_contiguous_put_get_exact(tmp_path: Path) -> None:
    kv = random_kv(SMALL, 40, seed=3)
    tokens = list(range(40))
    with Engine.open(tmp_path / "s", local_config()) as e:
        e.put(tokens, transposed_back(kv), model=SMALL)
        got = e.get(tokens, model=SMALL)
    assert got.n_tokens == 40
    assert np.array_equal(got.kv.view(np.uint16), kv.view(np.uint16))


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32"])
def test_torch_non_contiguous(dtype: str) -> None:
    torch = pytest.importorskip("torch")
    spec = ModelSpec("t", n_layers=2, n_kv_heads=3, head_dim=4, dtype=dtype)
    tdtype = getattr(torch, dtype)
    kv = torch.randn(4, 3, N, 2, 2, dtype=torch.float32).to(tdtype).permute(3, 4, 2, 1, 0)
    assert not kv.is_contiguous()
    out = as_kv_array(kv, spec, N)
    assert out.flags.c_contiguous and out.dtype == numpy_dtype(dtype)
    back = torch.from_numpy(out.view(np.int16)).view(torch.bfloat16) if dtype == "bfloat16" \
        else torch.from_numpy(out)
    assert torch.equal(back, kv)


def test_torch_contiguous_shares_memory_and_grad_is_detached() -> None:
    torch = pytest.importorskip("torch")
    kv = torch.from_numpy(random_kv(SMALL, N))
    out = as_kv_array(kv, SMALL, N)
    assert np.shares_memory(out, kv.numpy())
    leaf = kv.float().requires_grad_(True).half()
    assert leaf.requires_grad
    assert np.array_equal(as_kv_array(leaf, SMALL, N), kv.numpy())


def _bad_numpy() -> list[tuple[str, Any]]:
    kv = random_kv(SMALL, N)
    obj = np.empty(kv.shape, dtype=object)
    obj[...] = 0.0
    return [
        ("list", kv.tolist()),
        ("none", None),
        ("scalar", np.float16(1)),
        ("bytes", kv.tobytes()),
        ("wrong tokens", random_kv(SMALL, N + 1)),
        ("missing axis", kv[0]),
        ("float32", kv.astype(np.float32)),
        ("byteswapped", kv.astype(kv.dtype.newbyteorder())),
        ("object", obj),
        ("masked", np.ma.masked_array(kv)),
        ("structured", np.zeros(kv.shape, dtype=[("a", np.float16)])),
    ]


@pytest.mark.parametrize(("name", "value"), _bad_numpy(), ids=[n for n, _ in _bad_numpy()])
def test_bad_input_raises_shape_error(name: str, value: Any) -> None:
    with pytest.raises(ShapeError) as info:
        as_kv_array(value, SMALL, N)
    assert isinstance(info.value, InputError)


def test_bad_torch_input_raises_shape_error() -> None:
    torch = pytest.importorskip("torch")
    kv = torch.from_numpy(random_kv(SMALL, N))
    bad = [
        kv.float(),
        kv.to(torch.int16),
        kv[:, :, :-1],
        kv.unsqueeze(0),
        torch.empty(kv.shape, dtype=torch.float16, device="meta"),
        kv.to_sparse(),
        torch.zeros(kv.shape, dtype=torch.complex64),
        torch.zeros(kv.shape, dtype=torch.float8_e4m3fn),
    ]
    for value in bad:
        with pytest.raises(ShapeError):
            as_kv_array(value, SMALL, N)


def test_put_rejects_bad_input_and_writes_nothing(tmp_path: Path) -> None:
    tokens = list(range(N))
    kv = random_kv(SMALL, N)
    with Engine.open(tmp_path / "s", local_config()) as e:
        for value in (kv.astype(np.float32), kv[:, :, :-1], kv.tolist()):
            with pytest.raises(ShapeError):
                e.put(tokens, value, model=SMALL)
        assert e.get(tokens, model=SMALL).n_tokens == 0
