"""The load generator behind ``graceful soak`` and the rollout demo, and its report.

``_runner`` (``SoakConfig``, ``run_soak``: clients under a duration), ``_attempt`` (one try of a
request: its answer and how it ended) and ``_report`` (tallies, end reasons, tables and plots).

May import ``_drain`` (durations) and ``_resume`` (the resuming clients). Prints nothing.
"""
