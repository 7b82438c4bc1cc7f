"""A ``DynamicCache`` whose restored layers arrive while the model runs.

A restore with :meth:`rkv.store.engine.Engine.get` reads and verifies every layer before the
prefill of the new tokens starts. :class:`StreamedCache` instead takes the layers from a
layer stream (:meth:`Engine.get_layers`): layer ``i``'s stored KV is put into the cache
right before the model's layer ``i`` attends over it (``update(..., layer_idx=i)``), and the
stream reads and verifies the next layers in the background meanwhile, so loading overlaps
the prefill. Layer 0 is taken before the forward starts (the model sizes its masks and
positions from it). The result is the cache a full restore gives (tested: same logits).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from rkv.errors import IntegrityError
from rkv.format.hf_kv import as_torch_kv

#: ``() -> (layer, kv)``: the next layer of the stream, ``kv`` ``[2, tokens, heads, dim]``.
Pull = Callable[[], tuple[int, np.ndarray]]


def _tensor(kv: np.ndarray, dtype: Any, device: Any) -> Any:
    t = as_torch_kv(kv, dtype)
    t = t if device is None else t.to(device)
    return t.permute(0, 2, 1, 3)        # [2, T, heads, D] -> [2, heads, T, D]


def streamed_cache(config: Any, n_layers: int, pull: Pull, dtype: Any = None,
                   device: Any = None) -> Any:
    """A :class:`StreamedCache` (built lazily: transformers is imported only here); the
    layers are converted to the torch ``dtype`` and moved to ``device`` (the model's)."""
    from transformers import DynamicCache

    class StreamedCache(DynamicCache):   # type: ignore[misc]
        def __init__(self) -> None:
            super().__init__(config=config)
            self._pull, self._n, self._loaded = pull, n_layers, 0
            self._ensure(0)

        def _ensure(self, layer: int) -> None:
            while self._loaded <= min(layer, self._n - 1):
                got, kv = self._pull()
                if got != self._loaded:
                    raise IntegrityError(f"layer stream gave layer {got}, expected "
                                         f"{self._loaded}")
                t = _tensor(kv, dtype, device)
                DynamicCache.update(self, t[0].unsqueeze(0).contiguous(),
                                    t[1].unsqueeze(0).contiguous(), got)
                self._loaded += 1

        def update(self, key_states: Any, value_states: Any, layer_idx: int, *args: Any,
                   **kwargs: Any) -> Any:
            self._ensure(layer_idx)
            return super().update(key_states, value_states, layer_idx, *args, **kwargs)

        def get_seq_length(self, layer_idx: int = 0) -> int:
            self._ensure(layer_idx)
            return int(super().get_seq_length(layer_idx))

        def finish(self) -> None:
            """Take the layers the forward did not ask for (none for a full model)."""
            self._ensure(self._n - 1)

    return StreamedCache()
