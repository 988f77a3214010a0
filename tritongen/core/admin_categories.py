"""Triton's API categories, and which of them the sidecar keeps shut: the one table the policy's
`admin_apis.open` is validated against and the sidecar's classifier (sidecar/admin_apis.py) uses.

The categories are Triton's own, the names `--http-restricted-api` and `--grpc-restricted-protocol`
take (server src/restricted_features.h). The shut ones are the admin doors: model repository,
logging, trace and shared memory; the others always pass.
"""

from __future__ import annotations

HEALTH = "health"
METADATA = "metadata"
INFERENCE = "inference"
SHARED_MEMORY = "shared-memory"
MODEL_CONFIG = "model-config"
MODEL_REPOSITORY = "model-repository"
STATISTICS = "statistics"
TRACE = "trace"
LOGGING = "logging"

# Triton's order (RESTRICTED_CATEGORY_NAMES)
CATEGORIES = (HEALTH, METADATA, INFERENCE, SHARED_MEMORY, MODEL_CONFIG, MODEL_REPOSITORY, STATISTICS, TRACE, LOGGING)
# shut unless the admin token comes with the request or the policy opens them (AdminApisPolicy.open)
SHUT = (MODEL_REPOSITORY, LOGGING, TRACE, SHARED_MEMORY)

WHAT = {
    MODEL_REPOSITORY: "repository index, model load and unload",
    LOGGING: "log settings",
    TRACE: "trace settings",
    SHARED_MEMORY: "system and CUDA shared-memory status, register and unregister",
}
