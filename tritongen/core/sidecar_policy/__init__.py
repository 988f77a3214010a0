"""The sidecar's policy in one package: the document's schema and the builder that writes it, so the
two change together and the version is stated once (`schema.POLICY_VERSION`).

    schema.py    SidecarPolicy (the whole document), its cross-checks, parse_policy
    sections.py  classes, models, devices, the limits, tenants, admin APIs
    kv_cost.py   an LLM request's memory cost (KVCost)
    tuning.py    the admission and lane knobs a deployer may move (defaults: core/*_tuning.py)
    build.py     build_sidecar_policy: the document from a spec, its plan and profiles
    from_profiles.py  policy_from_profiles: the document from profiles alone (a server run without a spec)

Pure: validating a decoded document is computation; reading the file is not, and lives in
`tritongen.shared.policy_file`.
"""
