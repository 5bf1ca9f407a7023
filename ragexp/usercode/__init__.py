"""A team's own code, imported and called: the objects ``package.module:attr`` names and what
identifies their source (:mod:`~ragexp.usercode.imports`), and many cheap calls of a function under
a deadline each (:mod:`~ragexp.usercode.calls`). A Python system (``providers/python.py``) and a
custom metric (``metrics/custom.py``) both go through it."""
