"""What bytes mean: records and their MACs, chunk keys, model fingerprints, tensor dtypes and
the request-trace formats. Nothing here knows about tiers, policies or the engine."""
