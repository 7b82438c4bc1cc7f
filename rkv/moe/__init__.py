"""Mixture-of-experts support: a MoE model built from a real dense model, routing traces, and
the interface through which the model gets its experts' weights (resident, or streamed from
rkv's tiers by :mod:`rkv.adapters.moe`).

* :mod:`rkv.moe.experts`: the :class:`ExpertProvider` protocol and its resident provider.
* :mod:`rkv.moe.model`: MoEfication of SmolLM2-135M (experts from co-activated neurons,
  fitted routers, top-k routing).
* :mod:`rkv.moe.trace`: routing traces (JSON Lines) and their reader.
"""
