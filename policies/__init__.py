"""Caching, prefetch and placement policies over opaque keys (shared by the KV engine and the MoE adapter)."""
