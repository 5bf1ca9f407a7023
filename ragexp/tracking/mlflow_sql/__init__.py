"""The one door to MLflow's private contract: its SQL schema and the revisions ragexp knows
(:mod:`.schema`, with the compatibility check of every direct path), the reader and writer of a
SQLite store (:mod:`.reader`, :mod:`.writer`), the rows of a trace (:mod:`.trace_rows`) and the
private MLflow symbols ragexp uses (:mod:`.internals`). Nothing else in ragexp touches a private
MLflow symbol or an MLflow table (``tests/test_tracking_structure.py``)."""
