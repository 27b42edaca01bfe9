"""What vLLM is: its command line, flag types, compile hash, log formats, releases and installation.

Pure knowledge of vLLM, below the wrapper: it imports only ground-floor helpers. Running vLLM with the
wrapper's settings is `warmstart.engine`.
"""
