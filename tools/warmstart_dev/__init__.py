"""What the image does not install: the test model, the slow mock volume, the benchmarks.

A distribution of its own (tools/pyproject.toml, console script `warmstart-dev`), installed
only into the development environment. gpucheck runs from a bare checkout too
(`PYTHONPATH=src:tools`), so nothing here may be imported at package import time.
"""
