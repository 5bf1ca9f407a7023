"""The HTML and Markdown evaluation report: the pages of ``ragexp report`` (:mod:`ragexp.workflows.report`)."""
