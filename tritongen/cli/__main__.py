"""`python -m tritongen.cli ...`: the `tritongen` console script without its wrapper. The sidecar
image's entrypoint (tritongen/sidecar_image.py) execs this with the interpreter it runs on, so
nothing depends on where pip put the script."""

from tritongen.cli.main import run

run()
