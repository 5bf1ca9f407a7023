"""Loading and validating evaluation sets (JSONL and the MindSDK/ragas column format)."""

from ragexp.datasets.loader import Dataset, load_dataset, resolve_path

__all__ = ["Dataset", "load_dataset", "resolve_path"]
