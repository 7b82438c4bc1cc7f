"""Replaying request traces through eviction policies: store-less (one tier or several) and
through a real store, with the command line's tables and plots."""
