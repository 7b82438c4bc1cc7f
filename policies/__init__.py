"""Caching, prefetch and placement policies over opaque keys.

Shared by the KV engine and the MoE expert-offloading adapter; never imports rkv. The engine
currently evicts and demotes in least-recently-used order from a persistent index
(``rkv.index``); the policy interfaces that replace it land here.
"""
