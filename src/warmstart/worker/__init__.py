"""The Runpod worker: `warmstart serve` and the job handler."""
