"""How a block's data becomes a record payload and back: the per-block codec stage.

A block without codecs stores its raw bytes (``codecs`` empty in the header). A block with an
error-correcting code stores ``codec.encode(data)`` and lists the codec's config in its header,
so any reader can decode it whatever the tier's current configuration says.

Reading checks the end-to-end checksum first, on the data read straight out of the payload
(systematic codes need no decoding for that), and runs the decoder only when it fails; the
decoded data must then match the checksum too, so a miscorrection beyond the code's capability
is reported as an error, never returned.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import replace
from functools import lru_cache
from typing import TYPE_CHECKING, Any

import numpy as np

from rkv.errors import (
    ChecksumError,
    ConfigError,
    CorruptRecordError,
    UncorrectableError,
    UnknownFormatError,
)
from rkv.record import (
    DecodedRecord,
    RecordHeader,
    array_record_size,
    data_checksum,
    encode_array_record,
    encode_record,
)

if TYPE_CHECKING:
    from rkv.ecc.base import Codec

NO_ECC = "none"


@lru_cache(maxsize=64)
def codec_for(spec: str) -> Codec | None:
    """The codec for a tier's ``ecc`` spec; None for ``"none"`` (raw payload)."""
    if spec.strip().lower() == NO_ECC:
        return None
    from rkv.ecc import get_codec

    return get_codec(spec)


@lru_cache(maxsize=256)
def _codec_from_json(text: str) -> Codec:
    from rkv.ecc import get_codec

    try:
        return get_codec(json.loads(text))
    except ConfigError as exc:
        raise UnknownFormatError(f"record uses a codec this build cannot decode: {exc}") from exc


def header_codec(header: RecordHeader) -> Codec | None:
    """The codec a record was written with (v1 records carry at most one)."""
    if not header.codecs:
        return None
    if len(header.codecs) != 1:
        raise UnknownFormatError(f"record lists {len(header.codecs)} codecs; v1 supports one")
    return _codec_from_json(json.dumps(header.codecs[0], sort_keys=True))


def record_size(header: RecordHeader, nbytes: int, codec: Codec | None) -> int:
    """Bytes of the record :func:`encode_block` makes for ``nbytes`` of data."""
    if codec is None:
        return array_record_size(header, nbytes)
    plen = codec.encoded_size(nbytes)
    return array_record_size(replace(header, codecs=(codec.get_config(),)), plen)


def encode_block(header: RecordHeader, data: np.ndarray, codec: Codec | None,
                 alloc: Callable[[int], np.ndarray] | None = None) -> Any:
    """The record of one block: raw (``codec`` None) or ECC-protected."""
    if codec is None:
        return encode_array_record(header, data, alloc)
    raw = np.ascontiguousarray(data).view(np.uint8).reshape(-1)
    payload = codec.encode(raw)
    final = replace(header, data_len=raw.nbytes, payload_len=len(payload),
                    checksum=data_checksum(raw), codecs=(codec.get_config(),))
    return encode_record(final, payload)


def read_block(dec: DecodedRecord, dest: np.ndarray | None) -> int:
    """Verify a decoded record's data and copy it into ``dest`` (when given).

    Returns the number of symbols (RS) or bits (BCH) the ECC corrected. Raises
    :class:`ChecksumError`, :class:`UncorrectableError` or another IntegrityError.
    """
    h = dec.header
    codec = header_codec(h)
    if codec is None:
        if h.data_len != h.payload_len:
            raise CorruptRecordError("record lengths are inconsistent")
        # Verify before copying: a caller's buffer never receives unverified data.
        if data_checksum(dec.payload) != h.checksum:
            raise ChecksumError("block data does not match its end-to-end checksum")
        if dest is not None:
            dest[...] = np.frombuffer(dec.payload, dtype=dest.dtype).reshape(dest.shape)
        return 0
    # Some layouts (shardrs) pad, so data_size(len) is an upper bound: compare the data's
    # actual length with the header's.
    fast = codec.systematic_data(dec.payload)
    if fast is not None and fast.size == h.data_len and data_checksum(fast) == h.checksum:
        data: Any = fast
        corrected = 0
    else:
        res = codec.decode(dec.payload)
        if not res.ok:
            raise UncorrectableError(f"{codec.spec}: {res.detail or 'uncorrectable'}")
        if len(res.data) != h.data_len or data_checksum(res.data) != h.checksum:
            raise ChecksumError(
                f"{codec.spec} decoded to data that fails the end-to-end checksum "
                "(errors beyond the code's capability)"
            )
        data = res.data
        corrected = res.n_corrected
    if dest is not None:
        dest[...] = np.frombuffer(data, dtype=dest.dtype).reshape(dest.shape)
    return corrected


def reencode(record: Any, dec: DecodedRecord, codec: Codec | None) -> Any:
    """The same block re-encoded with ``codec`` (verified first; raises IntegrityError)."""
    if header_codec(dec.header) == codec:
        return record
    h = dec.header
    data = np.empty(h.data_len, dtype=np.uint8)
    read_block(dec, data)
    header = replace(h, codecs=(), checksum=bytes(16))
    return encode_block(header, data, codec)
