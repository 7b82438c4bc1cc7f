"""Fault injection and campaigns: injecting tiers, the harness, campaigns through the real
engine (plain, importance-sampled, over time, planned) and the validation matrix. The analytic
predictions they are checked against live in :mod:`rkv.reliability`."""
