"""tritongen: measured, checked Triton configurations and a runtime policy sidecar."""

__version__ = "0.1.0"
