"""Stand-in pipelines that ``system=python`` imports in the tests: plain and async functions,
a LangChain retrieval chain and a LlamaIndex-shaped query engine, over one tiny corpus."""
