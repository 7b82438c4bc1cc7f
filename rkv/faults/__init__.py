"""Fault injection and reliability: injecting tiers, analytic predictions, campaigns."""
