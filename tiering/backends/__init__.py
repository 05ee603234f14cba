"""Tier backends: local filesystem, object stores through obstore, and memory (tests)."""
