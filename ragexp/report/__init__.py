"""``ragexp report``: an evaluation report (Markdown and one self-contained HTML file)."""
