"""The command line: every line printed and every exit code comes from here.

``_console`` (the console script), ``_prestop`` (the preStop hook's fast path: ``graceful drain`` up
to its request, and every speed trick of that short-lived process, the package's lazy exports among them),
``_main`` (the click group: ``drain``, ``status``, ``resume``, ``run``, ``advise``, ``soak``),
``_drain_client`` (``graceful drain`` once its request is sent: the answers, the lines printed and the
exit codes), ``_engine_drain`` (``graceful drain --engine``: engine mode's command line),
``_run`` (``graceful run``), ``_advise`` (``graceful advise``: the budget from the traffic seen) and
``_evidence`` (where it reads that traffic), ``_soak`` (``graceful soak``) and ``_params`` (what the click
commands share: the duration type, the flags made from the option fields and the usage error).

May import ``_admin``, ``_drain``, ``_engine``, ``_soak`` and ``_serve``. ``_console``,
``_prestop`` and ``_drain_client`` are the hook's path: they import neither click nor the middleware.
"""
