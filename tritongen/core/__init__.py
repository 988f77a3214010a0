"""Pure computation: no network, no GPU, no filesystem, no Jinja2. Nothing here imports an adapter."""
