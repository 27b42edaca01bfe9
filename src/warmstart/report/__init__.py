"""The boot report: its model, how each cache layer's status and the verdict are decided, why a hit
missed, the staged, seeded and weights blocks, the report a vLLM log alone gives, the builder that
turns a boot's observation into it, and its updates while serving. Nothing here starts vLLM or
writes the volume; it imports the store and the prefetch (to record what they did), never the reverse."""
