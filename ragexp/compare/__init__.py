"""Comparing a candidate run with a baseline: diff, gate rules, promotion, power (the statistics
they rest on are in :mod:`ragexp.stats`)."""
