"""What a protection is: a codec spec or a :class:`~rkv.codec.pipeline.Pipeline`, or ``raw``
(no record at all), and the decoding units it lays over a block's data - the one place the
reliability model interprets a codec spec (:mod:`rkv.reliability.analytic` and
:mod:`rkv.reliability.fatality` both start from it)."""

from __future__ import annotations

from rkv.codec.pipeline import Pipeline
from rkv.codec.stages import codec_for
from rkv.ecc.base import Units

#: Stored as raw bytes: no header, no checksum (what peers store).
RAW = "raw"

Protection = str | Pipeline


def as_pipeline(protection: Protection) -> Pipeline | None:
    """The pipeline a protection names (``None`` for ``raw``: no record at all). A string
    is a codec spec (``"none"``: the end-to-end checksum alone)."""
    if isinstance(protection, Pipeline):
        return protection
    if protection == RAW:
        return None
    return Pipeline(None, codec_for(protection))


def geometry(protection: Protection, data_bytes: int) -> Units:
    """The decoding units of ``protection`` over ``data_bytes`` (the data after any
    quantizer): the codec describes them (:meth:`rkv.ecc.base.Codec.units`); ``raw`` and
    ``none`` have no code of their own."""
    pipe = as_pipeline(protection)
    if pipe is None:
        return Units("raw", 1, data_bytes, 0, 8, data_bytes)
    codec = pipe.codec
    if codec is None:
        return Units("detect", 1, data_bytes, 0, 8, data_bytes)
    return codec.units(data_bytes)
