"""LLM-judge metrics: the twelve ragas metrics of the MindSDK evaluation module.

Everything here imports ragas, so the package is imported only by runs that ask for a judge
metric (``RAGAS_DO_NOT_TRACK`` is set before that: ragas otherwise phones home after every call).
"""

import os

os.environ.setdefault("RAGAS_DO_NOT_TRACK", "true")
