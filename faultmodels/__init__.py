"""Per-tier bit-error models (numpy only; never imports rkv)."""
