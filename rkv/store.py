"""Where a store's files live, what identifies it, and how it is deleted.

A store is its directory: the index at ``<store>/index`` and disk tiers under
``<store>/tiers``. Memory tiers with no configured path live outside it, in a memory-backed
directory (``/dev/shm``), under ``rkv-<store id>/<tier>``. The store id is kept in the index,
so a store can be moved and still find its memory tiers.

A copy (``cp -r``) carries the same id as its original. When the original still exists at the
path the index recorded as the store's home, the copy takes a new id of its own: it must
never share (and delete from) the original's memory tiers. Its memory-tier chunks are then
missing; everything inside its directory is kept.
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import uuid
from contextlib import suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rkv.config import EngineConfig, TierConfig
from rkv.envconfig import apply_env
from rkv.errors import ConfigError, CorruptStoreError, RkvError
from rkv.index import Index

log = logging.getLogger("rkv")


def memory_dir() -> Path | None:
    """A memory-backed directory for the memory tiers, or None when the machine has none."""
    shm = Path("/dev/shm")
    if shm.is_dir() and os.access(shm, os.W_OK | os.X_OK):
        return shm
    return None


def legacy_id(root: Path) -> str:
    """The id of a store made before ids existed: its memory tiers hang on its path."""
    return hashlib.blake2b(str(root.resolve()).encode(), digest_size=8).hexdigest()


def new_id() -> str:
    return uuid.uuid4().hex


def resolve_tier_path(root: Path, tier: TierConfig, store_id: str) -> Path:
    """The directory of ``tier``'s LMDB environment for the store at ``root``."""
    if tier.path:
        p = Path(tier.path).expanduser()
        return p if p.is_absolute() else root / p
    shm = memory_dir()
    if tier.medium == "memory" and shm is not None:
        return shm / f"rkv-{store_id}" / tier.name
    return root / "tiers" / tier.name


def outside_dirs(root: Path, tiers: tuple[TierConfig, ...], store_id: str) -> list[Path]:
    """Tier directories of the store that lie outside its directory."""
    out = []
    for t in tiers:
        p = resolve_tier_path(root, t, store_id)
        with suppress(ValueError):
            p.resolve().relative_to(root.resolve())
            continue
        out.append(p)
    return out


@dataclass(frozen=True)
class Identity:
    """Who a store is: its id, and whether this open found it copied from another store."""

    id: str
    home: str          # the resolved path the store was last opened at
    copied_from: str | None = None
    moved_from: str | None = None

    def to_meta(self) -> dict[str, Any]:
        return {"id": self.id, "home": self.home}


def identify(root: Path, stored: Any, exists: bool, stored_id_of: Any) -> Identity:
    """The identity of the store at ``root``.

    ``stored`` is the index's ``store`` metadata (None in a new or pre-id store);
    ``stored_id_of(path)`` reads the store id of another store (None when there is none).
    """
    here = str(root.resolve())
    if not exists:
        return Identity(new_id(), here)
    if not isinstance(stored, dict) or not isinstance(stored.get("id"), str):
        return Identity(legacy_id(root), here)
    sid, home = stored["id"], str(stored.get("home", ""))
    if home == here:
        return Identity(sid, here)
    other = Path(home)
    same_dir = False
    with suppress(OSError):
        same_dir = other.exists() and other.samefile(root)
    if same_dir:
        return Identity(sid, here)
    if home and other.exists() and stored_id_of(other) == sid:
        return Identity(new_id(), here, copied_from=home)
    return Identity(sid, here, moved_from=home or None)


def destroy_store(engine_cls: Any, root: Path) -> None:
    """Delete the store at ``root``, including tiers kept outside it (memory tiers)."""
    if not root.exists():
        return
    try:
        with engine_cls.open(root, readonly=True) as engine:
            remove_outside(root, engine.config.tiers, engine.identity.id)
    except RkvError as exc:
        log.warning("destroying %s without reading its config (%s)", root, exc)
        sid, shm = store_id_at(root), memory_dir()
        if sid and shm is not None:          # its default memory tiers, at least
            shutil.rmtree(shm / f"rkv-{sid}", ignore_errors=True)
    shutil.rmtree(root, ignore_errors=True)


def remove_outside(root: Path, tiers: tuple[TierConfig, ...], store_id: str) -> None:
    """Delete the store's tier directories kept outside it (and their rkv-<id> parents), and
    its whole ``rkv-<store id>`` memory directory: a memory tier that a later config moved
    elsewhere left its old environment there, and nothing else may use that name."""
    for d in outside_dirs(root, tiers, store_id):
        shutil.rmtree(d, ignore_errors=True)
        parent = d.parent
        if parent.name.startswith("rkv-") and parent.parent == memory_dir():
            with suppress(OSError):
                parent.rmdir()
    shm = memory_dir()
    if shm is not None and store_id:
        shutil.rmtree(shm / f"rkv-{store_id}", ignore_errors=True)


def store_id_at(path: Path) -> str | None:
    """The store id of the store at ``path`` (None when there is none or it is unreadable)."""
    try:
        ix = Index(path / "index", sync=False, readonly=True, create=False)
    except RkvError:
        return None
    try:
        with ix.env.read() as txn:
            if not ix.check_format(txn):
                return None
            meta = ix.get_meta(txn, "store")
        return meta.get("id") if isinstance(meta, dict) else None
    except RkvError:
        return None
    finally:
        ix.close()


def resolve_config(index: Index, txn: Any, config: EngineConfig | None,
                   root: Path) -> EngineConfig:
    """The config an existing store opens with: the stored one unless ``config`` is given
    (``chunk_tokens`` may not change); a damaged stored config needs an explicit one."""
    try:
        stored = index.get_meta(txn, "config")
        stored_cfg = EngineConfig.from_dict(stored) if stored is not None else None
    except (CorruptStoreError, ConfigError) as exc:
        if config is None:
            raise CorruptStoreError(f"the stored config of {root} is damaged ({exc}); open "
                                    "it with an explicit config to rewrite it") from exc
        return config
    if config is None:    # the stored config, with the environment's settings (RKV_*)
        config = apply_env(stored_cfg)
        if config is None or config is stored_cfg:
            return config or EngineConfig()
    if stored_cfg is None:
        return config
    if config.chunk_tokens != stored_cfg.chunk_tokens:
        raise ConfigError(f"store {root} uses chunk_tokens={stored_cfg.chunk_tokens}; "
                          f"cannot reopen it with {config.chunk_tokens}")
    return config
