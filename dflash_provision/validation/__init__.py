"""Whether a config is right: strict JSON, the schema, the DFlash invariants, the effective
config transformers loads, findings, the weights against the config, the semantic diff, the
verdict cache, and the one judge of a host's file against the authority (file_status)."""
