"""A block's protection: the pipeline (quantizer, then code) that encodes, verifies, decodes
and sizes one KV block's record payload, and the read path's fast check of clean records."""
