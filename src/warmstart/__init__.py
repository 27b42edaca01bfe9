"""warmstart: vLLM on Runpod Serverless with its compile and kernel caches on the network volume."""

__version__ = "0.1.0"
