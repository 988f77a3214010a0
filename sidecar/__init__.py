"""The runtime policy service (admission, headroom, proxy, metrics). Never imports tritongen.cli."""
