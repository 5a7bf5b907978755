"""The peers of ``raysoft bench`` (Flower, pfl-research): their harnesses, kept by the repository
and not installed with raysoft (``pyproject.toml`` packages ``raysoft`` only).

Each peer runs in a virtual environment of its own (Flower pins another Ray, pfl an older
``packaging``): :mod:`.venvs` makes a venv and runs a script in it, :mod:`.flower_env` and
:mod:`.pfl_env` are Flower's and pfl's venvs and runners (imported by ``raysoft bench``, in
raysoft's interpreter), and ``flower.py`` and the package :mod:`.pfl` are what those venvs' python
runs (they import neither raysoft nor the modules above). ``raysoft bench`` finds this folder
beside the ``raysoft`` it imports (a checkout), or at ``$RAYSOFT_BENCHMARKS``
(:mod:`raysoft.bench.peers`). Nothing is imported here: the pfl venv imports this package too.
"""
