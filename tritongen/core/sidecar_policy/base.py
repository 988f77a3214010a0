"""What every section of the policy shares: strict validation and the rules for names."""

from __future__ import annotations

import re
from typing import Annotated

from pydantic import ConfigDict, Field

from tritongen.core.strict import Strict

NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.-]*$"
NAME_MAX_LENGTH = 128
Name = Annotated[str, Field(pattern=NAME_PATTERN, max_length=NAME_MAX_LENGTH)]
DEFAULT_TENANT = "default"  # the tenant of requests that name none
OTHER_TENANTS = "other"  # the metrics label of every tenant the policy does not list
DEVICE_ID = re.compile(r"^(cpu|gpu[0-9]+)$")


class PolicyModel(Strict):
    """Strict, and defaults validated too: a policy is a file."""

    model_config = ConfigDict(validate_default=True)
