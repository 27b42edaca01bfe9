"""Two numbers that several floors share, named once.

The lease TTL is the default of `WARMSTART_LEASE_TTL_S` and the expiry the store and its
garbage collector assume when no setting reaches them; Runpod's init limit is what the boot
warns against and what `warmstart predict` compares with. Both sit on the ground floor, so
that settings, the store and the commands can import them without importing each other.
"""

from __future__ import annotations

# Staged store: a publish lease (and an abandoned temporary file) expires after this many seconds.
LEASE_TTL_S = 600.0

# Runpod Serverless marks a worker unhealthy when its cold start takes longer than this
# (7 minutes) and `RUNPOD_INIT_TIMEOUT` does not say otherwise.
RUNPOD_INIT_TIMEOUT_S = 420.0
