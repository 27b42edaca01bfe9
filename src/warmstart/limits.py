"""Numbers that several floors share, named once.

The lease TTL is the default of `WARMSTART_LEASE_TTL_S` and the expiry the store and its
garbage collector assume when no setting reaches them; Runpod's init limit is what the boot
warns against and what `warmstart predict` compares with; the store deadlines bound one tier's
restore and publish against it. They sit on the ground floor, so that settings, the store and
the commands can import them without importing each other.
"""

from __future__ import annotations

# Staged store: a publish lease (and an abandoned temporary file) expires after this many seconds.
LEASE_TTL_S = 600.0

# Runpod Serverless marks a worker unhealthy when its cold start takes longer than this
# (7 minutes) and `RUNPOD_INIT_TIMEOUT` does not say otherwise.
RUNPOD_INIT_TIMEOUT_S = 420.0

# A tier's whole restore (store/deadline.py). Two tiers that both stall cost 240 s before vLLM
# starts cold, which leaves a cold vLLM 180 s of the 420 s; a restore that works reads GBs in
# seconds to a minute (docs/BENCHMARKS.md: 491 MB from S3 in 3.6 s).
RESTORE_DEADLINE_S = 120.0

# A tier's whole publish, garbage collection included: after ready, in the background, so it may
# take long (a first upload of GBs), but never for ever.
PUBLISH_DEADLINE_S = 900.0
