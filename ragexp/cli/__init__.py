"""The ``ragexp`` command line."""
