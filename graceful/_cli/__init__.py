"""The command line: every line printed and every exit code comes from here.

``_console`` (the console script: the preStop hook's common command lines read without click),
``_main`` (the click group: ``drain``, ``status``, ``resume``, ``run``, ``advise``, ``soak``),
``_servers`` (``graceful drain`` against graceful servers), ``_engine`` (``graceful drain --engine``),
``_run`` (``graceful run``), ``_advise`` (``graceful advise``: the budget from the traffic seen),
``_soak`` (``graceful soak``) and ``_params`` (what the click commands share: the duration type and
the usage error).

May import ``_admin``, ``_drain``, ``_engine``, ``_soak`` and ``_serve``. ``_console`` and
``_servers`` are the hook's path: they import neither click nor the middleware.
"""
