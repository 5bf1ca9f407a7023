"""ragexp: declarative, config-driven RAG evaluation tracked in MLflow."""

__version__ = "0.1.0"
