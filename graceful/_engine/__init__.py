"""Engine mode: drain an engine graceful cannot wrap by reading its Prometheus page.

``_presets`` (the engines' metrics and rules, as data), ``_page`` (the page parser and metric
selectors), ``_config`` (``EngineConfig`` and the frozen results), ``_wait`` (the poll loop,
bounded by the budget) and ``_histogram`` (the engine's request durations, for ``graceful advise``).

May import ``_drain``: its budget rule (``_durations``, the drain's limit), ``ConfigError`` and the
duration histogram (``_observed``).
Prints nothing: ``_cli`` does.
"""
