"""The drain machine: its states, the ledger of work in flight, one drain's run, and its budget.

``_state`` (``Drain``: SERVING -> DRAINING -> STOPPED and back), ``_ledger`` (work in flight,
counted from admission to its last frame), ``_run`` (one drain: its phases, deadline, hooks and
expiry), ``_budget`` (``Budget``: grace period, reserve, deadline), ``_durations`` (durations
and the budget's arithmetic, light enough for the preStop hook), ``_errors`` (``ConfigError``),
``_options`` (the drain options, defined once), ``_environ`` (every option from a
``GRACEFUL_*`` variable) and ``_status`` (the states, outcomes and frozen results).

Knows nothing of ASGI, HTTP or the command line. Imports no other graceful package.
"""
