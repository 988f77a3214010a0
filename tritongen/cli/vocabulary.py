"""The words the commands share: each flag that means the same thing on more than one command,
what it means, and which commands take it; and the old spellings still accepted for one release.

Stated once, here, because spelling the same thing differently per command is how the CLI drifted
(`--upstream` on one command and `--url` on the next for a Triton address; `--format json` here and
`--json` there). tests/unit/test_cli_vocabulary.py holds every registered command to this table:
a command that takes a shared flag must be listed under it, a listed command must take it, and
every old spelling must still be accepted, hidden from --help. The README's flag table is this one.
"""

from __future__ import annotations

from dataclasses import dataclass

SPEC = "SPEC"  # the deployment spec as the first positional argument, not an option


@dataclass(frozen=True)
class SharedFlag:
    """One spelling with one meaning across `commands`. `flag` is an option's long form (its short
    form in `short`), or SPEC for the first positional argument."""

    flag: str
    meaning: str
    commands: tuple[str, ...]
    short: str | None = None


@dataclass(frozen=True)
class OldSpelling:
    """`old` on `command` means what `new` means now; accepted (hidden) until the next release."""

    command: str
    old: str
    new: str


SHARED_FLAGS: tuple[SharedFlag, ...] = (
    SharedFlag(SPEC, "the deployment spec (YAML), first positional; optional where the command works without one",
               ("check", "dashboard", "demo", "deploy", "doctor", "plan", "profile", "render", "simulate", "tune")),
    SharedFlag("--url", "Triton's HTTP endpoint HOST:PORT (doctor: repeat for replicas)", ("doctor", "profile", "sidecar")),
    SharedFlag("--grpc-url", "Triton's gRPC endpoint HOST:PORT (default: port 8001 on the --url host)", ("profile", "sidecar")),
    SharedFlag("--metrics-url", "Triton's metrics URL (default: http://<--url host>:8002/metrics)",
               ("doctor", "profile", "sidecar")),
    SharedFlag("--json", "machine output: one JSON document on stdout, the human output left out or on stderr",
               ("check", "doctor", "kv", "plan", "simulate", "tune")),
    SharedFlag("--repo", "a model repository (the models' code) given as an option", ("demo", "profile", "tune")),
    SharedFlag("--profiles", "a directory of `tritongen profile` JSON files, one per model",
               ("check", "demo", "deploy", "plan", "render", "simulate", "tune")),
    SharedFlag("--traffic", "a traffic file (examples/traffic/*.yaml)", ("demo", "simulate", "tune")),
    SharedFlag("--model", "a model entry to act on; repeat for several", ("profile", "tune"), short="-m"),
    SharedFlag("--out", "where the command writes (a directory; dashboard: a file, '-' for stdout)",
               ("dashboard", "demo", "deploy", "profile", "render", "tune"), short="-o"),
    SharedFlag("--seed", "seed of the generated arrivals or inputs", ("profile", "simulate", "tune")),
    SharedFlag("--triton-release", "the Triton release the repository runs on: a container release (25.12) or a "
               "server version (2.64.0); default the embedded 24.10 (2.51.0)", ("check", "render")),
)

OLD_SPELLINGS: tuple[OldSpelling, ...] = (
    OldSpelling("sidecar", "--upstream", "--url"),
    OldSpelling("sidecar", "--grpc-upstream", "--grpc-url"),
    OldSpelling("sidecar", "--triton-metrics", "--metrics-url"),
    OldSpelling("check", "--spec", SPEC),
    OldSpelling("check", "--format", "--json"),  # `--format github` became --github
    OldSpelling("check", "-f", "--json"),
    OldSpelling("dashboard", "--spec", SPEC),
    OldSpelling("demo", "--spec", SPEC),
    OldSpelling("demo", "--code", "--repo"),
    OldSpelling("doctor", "--targets", SPEC),
    OldSpelling("doctor", "--format", "--json"),
    OldSpelling("doctor", "-f", "--json"),
    OldSpelling("tune", "--repository", "--repo"),
)
