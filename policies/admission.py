"""Admission policies: whether a new object may push others out of a full cache."""

from __future__ import annotations

from collections.abc import Hashable

from policies.base import AdmissionPolicy, Item, PolicyError
from policies.table import build


class AdmitAll(AdmissionPolicy):
    """Every object is admitted (the default)."""

    name = "all"

    def admit(self, item: Item, now: float) -> bool:
        return True


class AdmitAfter(AdmissionPolicy):
    """Admit an object only from its ``n``-th sighting on (vLLM's offloading manager stores a
    block after it has been seen twice; SGLang HiCache's write-through-selective likewise).

    Sightings are counted in a history that outlives eviction and is halved once per
    ``history`` accesses (so a burst long ago does not admit forever). The caller consults
    it only when admitting would evict something: while there is room, everything enters.
    """

    name = "after"

    def __init__(self, n: int = 2, history: int = 1 << 20) -> None:
        if not isinstance(n, int) or n < 1:
            raise PolicyError(f"n must be an int >= 1, got {n!r}")
        if not isinstance(history, int) or history < 1:
            raise PolicyError(f"history must be an int >= 1, got {history!r}")
        self.n = n
        self.history = history
        self._seen: dict[Hashable, int] = {}
        self._ticks = 0

    def on_access(self, key: Hashable, hit: bool, now: float) -> None:
        self._seen[key] = self._seen.get(key, 0) + 1
        self._ticks += 1
        if self._ticks >= self.history:
            self._ticks = 0
            self._seen = {k: c >> 1 for k, c in self._seen.items() if c > 1}

    def admit(self, item: Item, now: float) -> bool:
        return self._seen.get(item.key, 0) >= self.n

    def seen(self, key: Hashable) -> int:
        return self._seen.get(key, 0)


_ADMISSION: dict[str, type[AdmissionPolicy]] = {"all": AdmitAll, "after": AdmitAfter}


def make_admission(spec: str) -> AdmissionPolicy:
    """An admission policy from its spec: ``"all"`` or ``"after(n=2)"``."""
    return build(spec, _ADMISSION, "admission")


def split_spec(spec: str) -> tuple[str, str]:
    """``"prefix+after(n=2)"`` -> ("prefix", "after(n=2)"); no ``+`` means admit all. The
    ``+`` is the first one outside parentheses: ``adaptive(candidates=lru+after(n=2))`` is
    one eviction spec whose argument carries its own admission."""
    depth = 0
    for i, ch in enumerate(spec):
        depth += (ch == "(") - (ch == ")")
        if ch == "+" and depth == 0:
            return spec[:i].strip(), (spec[i + 1:].strip() or "all")
    return spec.strip(), "all"
