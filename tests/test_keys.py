from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from rkv import InputError, ModelSpec
from rkv.errors import ConfigError
from rkv.format.keys import as_token_array, block_key, chunk_keys, split_block_key

FP = ModelSpec("m", 2, 2, 4).fingerprint()


@given(st.lists(st.integers(0, 2**32 - 1), max_size=100), st.integers(1, 17))
def test_keys_are_prefix_consistent(tokens: list[int], chunk: int) -> None:
    arr = as_token_array(tokens)
    keys = chunk_keys(arr, FP, chunk)
    assert len(keys) == -(-len(tokens) // chunk)
    full = len(tokens) // chunk
    # A longer sequence shares every full-chunk key of its prefix.
    longer = chunk_keys(as_token_array([*tokens, 5, 6, 7]), FP, chunk)
    assert longer[:full] == keys[:full]
    assert len(set(keys)) == len(keys)


def test_partial_chunk_differs_from_full_and_is_optional() -> None:
    a = chunk_keys(as_token_array(range(10)), FP, 8)
    b = chunk_keys(as_token_array(range(16)), FP, 8)
    assert a[0] == b[0] and a[1] != b[1]
    assert chunk_keys(as_token_array(range(10)), FP, 8, partial=False) == a[:1]


def test_key_depends_on_everything_before() -> None:
    a = chunk_keys(as_token_array([1] * 8 + [2] * 8), FP, 8)
    b = chunk_keys(as_token_array([3] * 8 + [2] * 8), FP, 8)
    assert a[1] != b[1]


@pytest.mark.parametrize(
    "change",
    [{"dtype": "bfloat16"}, {"n_layers": 3}, {"n_kv_heads": 4}, {"head_dim": 8},
     {"layout": "other"}, {"tp_rank": 1, "tp_size": 2}, {"revision": "r2"},
     {"model_id": "m2"}, {"extra": {"rope": "yarn"}}],
)
def test_fingerprint_covers_every_field(change: dict[str, object]) -> None:
    base = ModelSpec("m", 2, 2, 4).to_dict()
    other = ModelSpec.from_dict({**base, **change})
    assert other.fingerprint() != FP
    assert ModelSpec.from_dict(other.to_dict()) == other


@pytest.mark.parametrize(
    "bad", [[-1], [2**32], [[1, 2]], [1.5], ["a"], np.zeros((2, 2), dtype=int)]
)
def test_bad_tokens_rejected(bad: object) -> None:
    with pytest.raises(InputError):
        as_token_array(bad)


def test_torch_tokens() -> None:
    torch = pytest.importorskip("torch")
    assert as_token_array(torch.arange(5)).tolist() == [0, 1, 2, 3, 4]


@pytest.mark.parametrize(
    "kw",
    [{"n_layers": 0}, {"head_dim": -1}, {"dtype": "int8"}, {"tp_rank": 2},
     {"model_id": ""}, {"n_kv_heads": True}],
)
def test_bad_model_spec(kw: dict[str, object]) -> None:
    args = {"model_id": "m", "n_layers": 2, "n_kv_heads": 2, "head_dim": 4, **kw}
    with pytest.raises(ConfigError):
        ModelSpec(**args)  # type: ignore[arg-type]


def test_block_key_round_trip() -> None:
    k = chunk_keys(as_token_array([1, 2, 3]), FP, 2)[0]
    assert split_block_key(block_key(k, 513)) == (k, 513)
