"""One base for tiers that wrap another tier, and the one way to find what a wrapper wraps.

A :class:`TierWrapper` is a :class:`~rkv.tiers.base.Tier` around ``inner``: every method of
the interface, and its ``spec``, ``state``, ``damage`` and ``shared``, forward to ``inner``
(read when asked, so a wrapper sees its tier go down or be marked damaged), and a subclass
overrides only what it changes (a fault-injecting tier its reader and writes, a test's tier
the reads it holds). The conveniences ``get``, ``fetch``, ``put`` and ``delete`` are not
forwarded: they run through the wrapper's own ``reader``, ``put_many`` and ``delete_many``,
as on any tier, so a subclass that overrides those sees every read and write.

:func:`unwrap` walks the chain of wrappers: the innermost tier, or the first tier of a class
(``unwrap(tier, RedisTier)``: the remote tier under any wrappers, None when there is none).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from contextlib import AbstractContextManager
from typing import Any, TypeVar, overload

from rkv.tiers.base import Tier, TierReader, TierSpec

T = TypeVar("T", bound=Tier)


class TierWrapper(Tier):
    """A tier that forwards the tier interface to ``inner`` (see the module docstring)."""

    def __init__(self, inner: Tier) -> None:
        self.inner = inner

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.inner!r})"

    # -- what the tier is: read from inner each time ------------------------------------------
    # (read-only here: only the wrapped tier changes what it is, as RedisTier's state does)
    @property
    def spec(self) -> TierSpec:  # type: ignore[override]
        return self.inner.spec

    @property
    def state(self) -> str:  # type: ignore[override]
        return self.inner.state

    @property
    def damage(self) -> str | None:  # type: ignore[override]
        return self.inner.damage

    @property
    def shared(self) -> bool:  # type: ignore[override]
        return self.inner.shared

    @property
    def store_id(self) -> str:
        return self.inner.store_id

    # -- the interface, forwarded -------------------------------------------------------------
    def reader(self) -> AbstractContextManager[TierReader]:
        return self.inner.reader()

    def put_many(self, items: Sequence[tuple[bytes, Any]], *, reserve: int = 0) -> None:
        self.inner.put_many(items, reserve=reserve)

    def delete_many(self, keys: Iterable[bytes]) -> int:
        return self.inner.delete_many(keys)

    def iter_keys(self) -> Iterator[bytes]:
        return self.inner.iter_keys()

    def ensure_checked(self) -> None:
        self.inner.ensure_checked()

    def records(self) -> int:
        return self.inner.records()

    def clear(self) -> None:
        self.inner.clear()

    def stats(self) -> dict[str, Any]:
        return self.inner.stats()

    def close(self) -> None:
        self.inner.close()


@overload
def unwrap(tier: Tier) -> Tier: ...


@overload
def unwrap(tier: Tier, cls: type[T]) -> T | None: ...


def unwrap(tier: Tier, cls: type[Tier] | None = None) -> Tier | None:
    """Without ``cls``: the innermost tier under ``tier``'s wrappers (``tier`` itself when it
    wraps nothing). With ``cls``: the first of ``tier`` and the tiers it wraps, outermost
    first, that is a ``cls`` (None: none is)."""
    while True:
        if cls is not None and isinstance(tier, cls):
            return tier
        if not isinstance(tier, TierWrapper):
            return tier if cls is None else None
        tier = tier.inner
