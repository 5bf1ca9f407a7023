"""Metrics: the registry (names, directions, requirements) and pure scoring kernels."""

from ragexp.metrics.registry import METRICS, MetricSpec, parse_metric_names

__all__ = ["METRICS", "MetricSpec", "parse_metric_names"]
