"""Engine settings from ``RKV_*`` environment variables (docs/configuration.md).

Variables override the configuration a store opens with when the caller passes none (the
stored config, or the embedded default for a new store), so an operator can change a
deployment without editing code or TOML:

- ``RKV_CONFIG=FILE``: an engine TOML config used instead of the stored/default one;
- ``RKV_<FIELD>``: an engine field, e.g. ``RKV_CODEC_THREADS=4``, ``RKV_PROMOTE=never``,
  ``RKV_SCRUB='{enabled = true}'`` (tables as TOML inline tables);
- ``RKV_TIER_<NAME>_<FIELD>``: a tier's field, e.g. ``RKV_TIER_NVME_PATH=/mnt/nvme/kv``,
  ``RKV_TIER_DRAM_CAPACITY_BYTES=4GiB``.

Values are parsed by the field's type (ints accept ``KiB``..``TiB`` and ``KB``..``TB``
suffixes and are computed exactly, bools ``1/0/true/false/yes/no/on/off``; a value is at most
64 Ki characters, ``RKV_CONFIG`` is read as any config file is: :mod:`rkv.inputs`). A value
that does not parse or is out of its field's range, a tier that
does not exist or a field that is not one is a :class:`~rkv.errors.ConfigError` naming the
variable: a typo never passes silently. ``RKV_`` names that are not settings (such as a
credential variable a config names) are left alone.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from dataclasses import MISSING, Field, fields, replace
from typing import Any

from rkv.errors import ConfigError
from rkv.store.config import EngineConfig, TierConfig
from rkv.ui.sizes import parse_size

log = logging.getLogger(__name__)

PREFIX = "RKV_"
CONFIG_VAR = "RKV_CONFIG"
TIER_PREFIX = "RKV_TIER_"

#: Longest value a setting variable may have (an inline table of a [scrub] config is
#: under 200 bytes; Linux caps one environment string at 128 KiB).
MAX_VALUE_CHARS = 64 << 10
_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}


def _default(f: Field[Any]) -> Any:
    if f.default is not MISSING:
        return f.default
    if f.default_factory is not MISSING:
        return f.default_factory()
    return None


def _parse(var: str, raw: str, example: Any) -> Any:
    """``raw`` as a value of ``example``'s type (the field's default)."""
    if len(raw) > MAX_VALUE_CHARS:
        raise ConfigError(f"{var}: a value of {len(raw)} characters (at most "
                          f"{MAX_VALUE_CHARS})")
    text = raw.strip()
    if isinstance(example, bool):
        if text.lower() in _TRUE:
            return True
        if text.lower() in _FALSE:
            return False
        raise ConfigError(f"{var}={raw!r}: expected a bool (true/false, 1/0, yes/no, on/off)")
    if isinstance(example, int):
        return parse_size(raw, var)
    if isinstance(example, float):
        try:
            return float(text)
        except ValueError:
            raise ConfigError(f"{var}={_show(raw)}: expected a number") from None
    if isinstance(example, dict):
        from rkv.inputs import load_toml

        try:
            return load_toml(f"v = {text}", var)["v"] if text else {}
        except ConfigError as exc:
            raise ConfigError(f"{var}: expected a TOML inline table such as "
                              f"'{{enabled = true}}': {exc}") from None
    return raw


def _show(raw: str) -> str:
    """``raw`` quoted for a message, cut short: a value may be 128 KiB long."""
    return repr(raw) if len(raw) <= 60 else repr(raw[:57]) + "..."


def _fields(cls: type) -> dict[str, Field[Any]]:
    return {f.name.upper(): f for f in fields(cls)}


def overrides(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The ``RKV_*`` variables that name settings (``RKV_CONFIG`` included)."""
    env = os.environ if environ is None else environ
    engine = _fields(EngineConfig)
    return {k: v for k, v in env.items()
            if k == CONFIG_VAR or k.startswith(TIER_PREFIX)
            or (k.startswith(PREFIX) and k[len(PREFIX):] in engine and k != "RKV_TIERS")}


def apply_env(config: EngineConfig | None,
              environ: Mapping[str, str] | None = None) -> EngineConfig | None:
    """``config`` (None: the caller's default) with the environment's settings applied.

    Returns ``config`` itself when no variable is set, so stores opened without any keep
    exactly their stored configuration."""
    env = overrides(environ)
    if not env:
        return config
    if CONFIG_VAR in env:
        config = EngineConfig.load(env[CONFIG_VAR])
    base = config if config is not None else EngineConfig()
    changes: dict[str, Any] = {}
    engine = _fields(EngineConfig)
    for var, raw in sorted(env.items()):
        if var == CONFIG_VAR or var.startswith(TIER_PREFIX):
            continue
        f = engine[var[len(PREFIX):]]
        changes[f.name] = _parse(var, raw, _default(f))
    tiers = list(base.tiers)
    by_name = {t.name.upper(): i for i, t in enumerate(tiers)}
    tier_fields = _fields(TierConfig)
    for var, raw in sorted(env.items()):
        if not var.startswith(TIER_PREFIX):
            continue
        rest = var[len(TIER_PREFIX):]
        # Tier names may contain underscores: take the longest tier name that prefixes it.
        name = max((n for n in by_name if rest.startswith(n + "_")), key=len, default=None)
        if name is None:
            raise ConfigError(f"{var}: no tier named like {rest.split('_')[0].lower()!r} "
                              f"(tiers: {[t.name for t in tiers]})")
        key = rest[len(name) + 1:]
        if key not in tier_fields or key == "NAME":
            raise ConfigError(f"{var}: {key.lower()!r} is not a tier setting (settings: "
                              f"{sorted(k.lower() for k in tier_fields if k != 'NAME')})")
        f = tier_fields[key]
        i = by_name[name]
        value = _parse(var, raw, _default(f))      # its errors name the variable already
        try:
            tiers[i] = replace(tiers[i], **{f.name: value})
        except ConfigError as exc:
            raise ConfigError(f"{var}: {exc}") from exc
    changes["tiers"] = tuple(tiers)
    log.info("engine settings from the environment: %s", ", ".join(sorted(env)))
    try:
        return replace(base, **changes)
    except ConfigError as exc:
        raise ConfigError(f"settings from {', '.join(sorted(env))}: {exc}") from exc
