"""Live side of `tritongen tune`: confirm the simulator's best candidates on a real server."""
