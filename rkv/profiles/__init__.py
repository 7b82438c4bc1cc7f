"""Quality profiles shipped with rkv (JSON, one per model): see ``rkv.eval.calibrate``."""
