"""Fault injection and campaigns: the harness, campaigns through the real engine (plain,
importance-sampled, over time, planned) and the validation matrix. The tier that injects the
faults is :mod:`rkv.tiers.faulty`; the analytic predictions they are checked against live in
:mod:`rkv.reliability`."""
