"""vLLM as a child process: how it is started, what its logs say, what its caches prove."""
