"""The base of every pydantic model in tritongen: frozen (a plan, a curve or a spec is a value,
never edited in place) and `extra="forbid"` (a misspelt key in a user's file is an error that
names it, not a silently ignored field).

Variants add to it, they never loosen it: `core.spec.StrictModel` also validates defaults (files
users write), `core.llm_interface` also refuses coercion (types read from a server's config)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
