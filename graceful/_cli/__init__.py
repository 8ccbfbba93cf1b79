"""The command line: every line printed and every exit code comes from here.

``_console`` (the console script: the preStop hook's common command lines read without click),
``_main`` (the click group: ``drain``, ``status``, ``resume``, ``run``, ``soak``), ``_drain``
(``graceful drain`` against graceful servers), ``_engine`` (``graceful drain --engine``) and
``_soak`` (``graceful soak``).

May import ``_admin``, ``_drain``, ``_engine``, ``_soak`` and ``_serve``. ``_console`` and
``_drain`` are the hook's path: they import neither click nor the middleware.
"""
