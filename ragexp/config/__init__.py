"""Composing the Hydra config tree and validating it once into typed models."""

from ragexp.config.models import RagexpConfig

__all__ = ["RagexpConfig"]
