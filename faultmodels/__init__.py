"""Per-tier bit-error models: probabilities and error-pattern samplers.

Depends on numpy only and never imports rkv. The DRAM, CXL and NVMe presets land here.
"""
