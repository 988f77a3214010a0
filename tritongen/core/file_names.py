"""The names of the files `render` writes beside the models and other parts read back: one
definition each, so the renderer, the sidecar, the Kubernetes manifests and the server launcher
cannot drift apart on a bare string."""

SERVER_FLAGS_FILE = "server_flags.txt"  # tritonserver flags (rate-limiter resources), tritongen.server_flags
POLICY_FILE = "sidecar_policy.json"  # the sidecar's policy, schema tritongen/core/sidecar_policy/schema.py
