"""Per-tier bit-error models: probabilities and error-pattern samplers for rkv.

Depends on numpy only (plus the standard library) and never imports rkv.

```python
import numpy as np
import faultmodels as fm

model = fm.get_model("nvme-tlc")                 # or "dram-ddr4", "dram-ddr5", "cxl", "raw-ber"
model = fm.get_model({"preset": "nvme-tlc", "pe_cycles": 1000})
model.p_any_error(1 << 20, hours=24.0)            # P(a 1 MiB buffer reads back with any error)
model.bit_error_prob(24.0)                        # marginal per-bit probability
model.events(1 << 20, 24.0)                       # the Poisson event classes (EventRate)
pat = model.sample(1 << 20, 24.0, np.random.default_rng(0))          # ErrorPattern
pat = model.sample_given_error(1 << 20, 24.0, np.random.default_rng(0))
pat.apply(buf, rng)                               # flip bits / fill erasures in a uint8 array
fm.accelerate(model, 10.0)                        # every fault event class 10x as frequent
fm.get_model("dram-ddr5").with_latent_hours(1.5)  # permanent faults hidden 1.5 h before the
                                                  # write count too (default 0: off)
```

Models: `raw-ber` (`RawBerModel`), `dram` (`DramModel`), `cxl` (`CxlModel`), `nand`
(`NandModel`), and `accelerated` (`AcceleratedModel`, from `accelerate`: any model with its
fault events more frequent, for accelerated testing). Presets are TOML files in
``faultmodels/presets`` (`list_presets`, `load_preset`); `load(path)` reads a user's copy.
See ``docs/faultmodels/``.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

from .errors import FaultModelError

if TYPE_CHECKING:
    from .base import ERASURE_KINDS, EVENT_KINDS, ErrorPattern, EventRate, FaultModel
    from .catalog import list_presets, load_preset, register_model
    from .cxl import CxlModel
    from .dram import MODE_NAMES, SC12_FIT, DramMode, DramModel
    from .nand import NandModel
    from .rawber import RawBerModel
    from .registry import (
        AcceleratedModel,
        accelerate,
        check_multiplier,
        dump,
        get_model,
        load,
        model_class,
        model_names,
    )

# The models load on first use: rkv imports faultmodels.checks (the shared value checks)
# at start-up, which must not cost the models' import (about 80 ms).
_WHERE = {
    "AcceleratedModel": "registry", "accelerate": "registry", "check_multiplier": "registry",
    "ERASURE_KINDS": "base", "EVENT_KINDS": "base", "ErrorPattern": "base",
    "EventRate": "base", "FaultModel": "base", "CxlModel": "cxl", "MODE_NAMES": "dram",
    "SC12_FIT": "dram", "DramMode": "dram", "DramModel": "dram", "NandModel": "nand",
    "RawBerModel": "rawber", "dump": "registry", "get_model": "registry",
    "list_presets": "catalog", "load": "registry", "load_preset": "catalog",
    "model_class": "registry", "model_names": "registry", "register_model": "catalog",
}


def __getattr__(name: str) -> Any:
    where = _WHERE.get(name)
    if where is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(import_module(f"{__name__}.{where}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})


__all__ = [
    "ERASURE_KINDS",
    "EVENT_KINDS",
    "MODE_NAMES",
    "SC12_FIT",
    "AcceleratedModel",
    "CxlModel",
    "DramMode",
    "DramModel",
    "ErrorPattern",
    "EventRate",
    "FaultModel",
    "FaultModelError",
    "NandModel",
    "RawBerModel",
    "accelerate",
    "check_multiplier",
    "dump",
    "get_model",
    "list_presets",
    "load",
    "load_preset",
    "model_class",
    "model_names",
    "register_model",
]
