"""One module per ``ragexp`` command, each named after it and holding one function of that name:
its options, one call into the library and the rendering of what came back.

A module here imports only typer and :mod:`ragexp.cli.options` / :mod:`ragexp.cli.console` at
its top; the library is imported inside the command, so that ``ragexp --help`` (which reads every
command's options) imports no command's work.
"""

COMMANDS = (
    "init",
    "run",
    "validate",
    "runs",
    "gate",
    "diff",
    "sweep",
    "report",
    "demo",
    "power",
    "label",
    "calibrate",
    "draft",
    "datasets",
    "shadow",
)
"""Every command, in the order ``ragexp --help`` lists them."""
