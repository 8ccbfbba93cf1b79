"""The drain machine: its states, the ledger of work in flight, one drain's run, and its budget.

- ``_state``: ``Drain``, the public face: SERVING -> DRAINING -> STOPPED and back, and FAILED.
- ``_core``: ``Core``, a drain's internal face (``_state.core(drain)``): admission during a drain,
  the run, the listeners, and the one place the state changes.
- ``_ledger``: work in flight, counted from admission to its last frame.
- ``_run``: one drain: its phases, deadline, hooks and expiry.
- ``_budget``: ``Budget``, the grace period, reserve and deadline, and the budget's options.
- ``_options``: ``DrainConfig``, the drain's other options, and a drain's ``Overrides``.
- ``_environ``: how an option is declared (default, variable, reader, doc) and read from a mapping.
- ``_names``: how an option's ``GRACEFUL_*`` variable is named (light: the preStop hook reads it).
- ``_durations``: durations and the budget's arithmetic and rule, light enough for the preStop hook.
- ``_observed``: the request-duration histograms, counted off the hot path.
- ``_advice``: ``graceful advise``'s arithmetic: the budget judged by the durations seen.
- ``_admission``: the ``admission`` option's modes and the estimate ``admission="fits"`` judges by.
- ``_status``: the states, outcomes, counters and frozen results.
- ``_errors``: ``ConfigError``.

Knows nothing of ASGI, HTTP or the command line. Imports no other graceful package.
"""
