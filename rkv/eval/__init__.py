"""What measures rkv: fault campaigns (:mod:`rkv.eval.faults`), quality and calibration,
policy replays (:mod:`rkv.eval.replay`), sweeps (:mod:`rkv.eval.sweep`) and the demo.

Everything here sits above the store; nothing in the store, placement, reliability, codec,
format or tiers imports it."""
