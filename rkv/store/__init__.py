"""The store: the engine facade (:mod:`rkv.store.engine`) and the parts it runs on.

Configuration, the index, the mutation protocol, the one decision site, the write and read
paths, batches, layer streaming, promotion, remote sharing, upkeep, scrub and block ages.
Nothing here imports :mod:`rkv.eval`, :mod:`rkv.moe`, :mod:`rkv.adapters` or :mod:`rkv.cli`.
"""
