"""What the sidecar and the rest of tritongen both need, kept under both so that neither imports
the other:

  * processes.py: launching a local child process (a free port, its life tied to ours);
  * reach.py: the one message for a Triton endpoint that does not answer;
  * nvml.py: NVML through pynvml, the one wrapper for device memory and GPU counts;
  * fronts.py: who faces the sidecar's clients (`--front`), its choices and default;
  * policy_file.py: reading the sidecar's policy file, the policy's one step that does I/O.

It may import only tritongen.core and tritongen.errors (tests/unit/test_layers.py holds every
layer to its rule), so the sidecar can use it without pulling in the adapters or the CLI.
"""
