"""Providers answer the dataset's questions: looked up by ``provider.system.kind``."""

from ragexp.providers.base import PROVIDERS, Provider, build_provider

__all__ = ["PROVIDERS", "Provider", "build_provider"]
