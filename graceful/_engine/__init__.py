"""Engine mode: drain an engine graceful cannot wrap by reading its Prometheus page.

``_presets`` (the engines' metrics and rules, as data), ``_page`` (the page parser and metric
selectors), ``_config`` (``EngineConfig`` and the frozen results) and ``_wait`` (the poll loop,
bounded by the budget).

May import ``_drain``: its budget rule (``_durations``, the drain's limit) and ``ConfigError``.
Prints nothing: ``_cli`` does.
"""
