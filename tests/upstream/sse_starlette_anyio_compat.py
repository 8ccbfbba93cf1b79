"""``tests/anyio_compat.py`` for sse-starlette's own tests, which its sdist leaves out.

``scripts/upstream-suites`` copies it into the extracted sdist before both runs:
``tests/test_sse.py`` and ``tests/test_issue167.py`` import ``collapse_excgroups`` from it,
the helper sse-starlette itself keeps in ``sse_starlette._utils``.
"""

from sse_starlette._utils import collapse_excgroups

__all__ = ["collapse_excgroups"]
