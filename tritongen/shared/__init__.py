"""What the sidecar and the rest of tritongen both need (process helpers, messages, adapters and
configuration both sides read), kept under both so that neither imports the other.

It may import only tritongen.core and tritongen.errors (tests/unit/test_layers.py holds every
layer to its rule), so the sidecar can use it without pulling in the adapters or the CLI.
"""
