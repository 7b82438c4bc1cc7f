"""Where a store's files live, what identifies it, and how it is deleted.

A store is its directory: the index at ``<store>/index`` and disk tiers under
``<store>/tiers``. Memory tiers with no configured path live outside it, in a memory-backed
directory (``/dev/shm``), under ``rkv-<store id>/<tier>``. The store id is kept in the index,
so a store can be moved and still find its memory tiers.

A copy (``cp -r``) carries the same id as its original. When the original still exists at the
path the index recorded as the store's home, the copy takes a new id of its own: it must
never share (and delete from) the original's memory tiers. Its memory-tier chunks are then
missing; everything inside its directory is kept.

A new store also gets a marker file, ``<store>/rkv-store.json`` (:data:`MARKER`:
``{"format": "rkv-store", "id": ..., "home": ...}``), written when its index is created.
Deleting is the one place that must know a directory is an rkv store without trusting its
files to open, so :func:`check_store` decides it from the marker, read as a small regular
file (never through a map of a possibly damaged index); a store made before markers existed
is recognised by its index's format entry instead (which maps the index: a damaged index of
such a store is refused, to be removed by hand). A directory that is neither is refused with
:class:`~rkv.errors.StoreError` and nothing is deleted. The marker is not updated when a copy
takes a new id or a store moves: its id picks the memory directory to delete only when the
index cannot say, and then only as :func:`identify` would (a copy's marker never deletes its
original's memory tiers).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import uuid
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rkv.errors import ConfigError, CorruptStoreError, RkvError, StoreError
from rkv.store.config import EngineConfig, TierConfig
from rkv.store.envconfig import apply_env
from rkv.store.index import Index

log = logging.getLogger("rkv")

#: The file in a store's directory that says it is one (module docstring).
MARKER = "rkv-store.json"
MARKER_FORMAT = "rkv-store"
#: A marker is about 100 bytes; anything larger is not one.
MAX_MARKER_BYTES = 4096
#: What an LMDB environment directory holds (LMDB's two files, rkv.tiers.lmdbenv's writer lock,
#: rkv.tiers.reserve's space reserve): all a tier directory kept outside the store may lose when
#: the store is destroyed. A name missing here errs safely: the directory is kept, warned.
_ENV_FILES = ("data.mdb", "lock.mdb", "writer.lock", "space.reserve")


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
    if not exists:             # a store being created (never read-only): mark it as one
        identity = Identity(new_id(), here)
        write_marker(root, identity)
        return identity
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


def write_marker(root: Path, identity: Identity) -> None:
    """Write the store's marker file (atomically: a torn marker is never left behind)."""
    doc = {"format": MARKER_FORMAT, **identity.to_meta()}
    tmp = root / f".{MARKER}.{uuid.uuid4().hex[:8]}.tmp"
    try:
        tmp.write_text(json.dumps(doc, sort_keys=True) + "\n", encoding="utf-8")
        os.replace(tmp, root / MARKER)
    except OSError as exc:
        with suppress(OSError):
            tmp.unlink()
        raise StoreError(f"{root}: cannot write {MARKER}: {exc.strerror or exc}") from exc


def refresh_marker(root: Path, identity: Identity) -> None:
    """Make the marker say ``identity`` (a writable open): a store made before markers gets
    one, and a copy or a moved store stops carrying its original's id and home. A marker
    that cannot be written is a warning, not a failed open."""
    if read_marker(root) == identity.to_meta():
        return
    try:
        write_marker(root, identity)
    except StoreError as exc:
        log.warning("%s", exc)


def read_marker(root: Path) -> dict[str, str] | None:
    """The store's marker (``id`` and ``home``), or None when there is none or it is not a
    well-formed marker (a FIFO, a device or a large file there is never read)."""
    from rkv.inputs import load_json, read_bytes

    if not (root / MARKER).exists():
        return None
    try:
        doc = load_json(read_bytes(root / MARKER, "store marker", limit=MAX_MARKER_BYTES),
                        "store marker")
    except ConfigError as exc:
        log.info("%s: ignoring a damaged store marker (%s)", root, exc)
        return None
    if not (isinstance(doc, dict) and doc.get("format") == MARKER_FORMAT
            and isinstance(doc.get("id"), str) and doc["id"]
            and isinstance(doc.get("home"), str)):
        log.info("%s: ignoring a store marker that is not one", root / MARKER)
        return None
    return {"id": doc["id"], "home": doc["home"]}


def check_store(root: Path) -> dict[str, str] | None:
    """Raise :class:`StoreError` unless ``root`` is an rkv store (module docstring); returns
    its marker (None: a store from before markers, recognised by its index)."""
    if not root.is_dir():
        what = "does not exist" if not root.exists() else "is not a directory"
        raise StoreError(f"{root} {what}: not an rkv store; nothing was destroyed")
    marker = read_marker(root)
    if marker is not None:
        return marker
    if not (root / "index" / "data.mdb").is_file():
        raise StoreError(f"{root} is not an rkv store (no valid {MARKER}, no index); nothing was "
                         "destroyed")
    try:
        ix = Index(root / "index", sync=False, readonly=True, create=False)
    except RkvError as exc:
        raise StoreError(f"cannot tell that {root} is an rkv store: it has no valid {MARKER} and "
                         f"its index cannot be read ({exc}); nothing was destroyed (delete it "
                         "by hand if it is one)") from exc
    try:
        with ix.env.read() as txn:
            ours = ix.check_format(txn)
    except RkvError as exc:
        raise StoreError(f"cannot tell that {root} is an rkv store: it has no valid {MARKER} and "
                         f"its index has no readable rkv format ({exc}); nothing was "
                         "destroyed") from exc
    finally:
        ix.close()
    if not ours:
        raise StoreError(f"{root} is not an rkv store (its index/ is an LMDB environment "
                         f"without rkv's format entry, and there is no valid {MARKER}); nothing "
                         "was destroyed")
    return None


def destroy_store(engine_cls: Any, root: Path) -> None:
    """Delete the store at ``root``, including tiers kept outside it (memory tiers). Nothing
    at all is deleted unless :func:`check_store` finds an rkv store there (a missing
    ``root`` is already destroyed)."""
    if not root.exists() and not root.is_symlink():
        return
    marker = check_store(root)
    try:
        with engine_cls.open(root, readonly=True) as engine:
            tiers, sid = engine.config.tiers, engine.identity.id
    except RkvError as exc:
        log.warning("destroying %s without reading its config (%s)", root, exc)
        tiers, sid = (), _fallback_id(root, marker)
    remove_outside(root, tiers, sid)   # after the close: no environment is open any more
    shutil.rmtree(root, ignore_errors=True)


def _fallback_id(root: Path, marker: dict[str, str] | None) -> str:
    """The id of a store whose index cannot be opened: its marker's, as :func:`identify`
    reads it (a copy's marker names its original's id: then none), else the index's."""
    if marker is None:
        return store_id_at(root) or ""
    ident = identify(root, marker, True, _id_at)
    return "" if ident.copied_from else ident.id


def _id_at(path: Path) -> str | None:
    """The store id of the store at ``path``: its marker's, else its index's."""
    marker = read_marker(path)
    return marker["id"] if marker is not None else store_id_at(path)


def remove_outside(root: Path, tiers: tuple[TierConfig, ...], store_id: str) -> None:
    """Delete the store's tier environments kept outside it (and their rkv-<id> parents), and
    its whole ``rkv-<store id>`` memory directory: a memory tier that a later config moved
    elsewhere left its old environment there, and nothing else may use that name. A tier
    directory a config named outside the store loses only its LMDB files: whatever else is
    in it is not the store's, and stays (with a warning)."""
    shm = memory_dir()
    for d in outside_dirs(root, tiers, store_id):
        parent = d.parent
        if parent.name.startswith("rkv-") and shm is not None and parent.parent == shm:
            shutil.rmtree(d, ignore_errors=True)
            with suppress(OSError):
                parent.rmdir()
            continue
        for name in _ENV_FILES:
            with suppress(OSError):
                (d / name).unlink()
        try:
            d.rmdir()
        except FileNotFoundError:
            pass
        except OSError:
            log.warning("kept %s: it holds files that are not the tier's", d)
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


def _new_top(path: Path) -> Path | None:
    """The highest directory that creating ``path`` would make (None: it exists)."""
    p, top = path.absolute(), None
    while not p.exists() and not p.is_symlink():
        top = p
        if p.parent == p:
            break
        p = p.parent
    return top


@contextmanager
def undo_on_failure(root: Path, config: EngineConfig) -> Iterator[None]:
    """Around the creation of a store at ``root``: if it fails, remove everything it made
    (the store directory, or what it put in one that existed; missing parents; tier
    directories outside it; its ``rkv-<id>`` memory directory) and re-raise. What existed
    before is never touched."""
    made = [_new_top(root)]
    for t in config.tiers:      # explicit tier paths: the others live in root or rkv-<id>
        if t.kind == "lmdb" and t.path:
            made.append(_new_top(resolve_tier_path(root, t, "")))
    existed = root.is_dir()
    before = set(root.iterdir()) if existed else set()
    try:
        yield
    except BaseException:
        marker = read_marker(root) if root.is_dir() else None
        shm = memory_dir()
        if marker is not None and shm is not None:
            shutil.rmtree(shm / f"rkv-{marker['id']}", ignore_errors=True)
        for top in made:
            if top is not None:
                shutil.rmtree(top, ignore_errors=True)
        if existed and root.is_dir():
            for child in set(root.iterdir()) - before:
                if child.is_dir() and not child.is_symlink():
                    shutil.rmtree(child, ignore_errors=True)
                else:
                    with suppress(OSError):
                        child.unlink()
        raise
