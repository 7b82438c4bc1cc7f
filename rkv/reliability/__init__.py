"""Analytic reliability: pure functions of (protection, fault model, time) - P(corrected),
P(DUE), P(SDC) of one block, which fault patterns defeat a record, when faults arrive, and the
scrub schedule. Nothing here opens a store or runs a campaign."""
