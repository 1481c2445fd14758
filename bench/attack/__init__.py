"""Attack campaigns against memkern's edges, one module per class (``CLASS``, ``campaign``).

``bench/attack/run.py`` runs them all (``tests/project/test_attack_short.py`` runs a short version).
Every class module defines::

    CLASS = "<name>"
    def campaign(rng: random.Random, n: int, workdir: pathlib.Path) -> dict

returning ``{"cases", "non_memkern_exceptions", "http_500", "hangs", "cross_scope", "lost",
"examples": [str, ...]}`` (:func:`attack.common.Tally.result`). Shared pieces:
:mod:`attack.common` (case runner with a hang deadline, tallies, a hash embedder) and
:mod:`attack.values` (random accepted and hostile values, also used by the bounds property
tests). Modules are imported as ``attack.<name>`` with ``bench/`` on ``sys.path`` (never
``bench/attack/`` itself: ``http.py`` / ``mcp.py`` would shadow the packages of those names).
"""
