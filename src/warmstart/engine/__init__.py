"""The wrapper's engine: vLLM run as a child process (process.py) and fitted to the worker (concurrency.py).

What vLLM itself is (its argv, flag types, hashing, log formats) is `warmstart.vllm`, which knows nothing
of the wrapper's settings; this package applies the settings to it.
"""
