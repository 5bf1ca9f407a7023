"""What each command does, one module per command named after it (``ragexp gate`` ->
:mod:`ragexp.workflows.gate`), under its thin CLI module in ``ragexp/cli/commands/``; the modes of
``ragexp run`` (``-m``: :mod:`~ragexp.workflows.multirun`, ``--until-decided``:
:mod:`~ragexp.workflows.sequential`, traces as cases: :mod:`~ragexp.workflows.traffic`) and of
``ragexp diff`` (``--attribute``: :mod:`~ragexp.workflows.attribution`) have modules of their own."""
