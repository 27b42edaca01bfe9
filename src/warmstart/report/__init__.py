"""The boot report: its model, how each cache layer's status and the verdict are decided, why a hit
missed, the seeded view, the report a vLLM log alone gives, and the builder that turns a boot's
observation into it. Nothing here starts vLLM or writes the volume."""
