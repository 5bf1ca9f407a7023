"""Comparing a candidate run with a baseline: statistics, diff and release gate."""
