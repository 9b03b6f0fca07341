"""Whether a config's bytes are right, with no I/O to a host: the schema, the DFlash invariants,
the effective config transformers loads, findings, the speculators layout, the weights' shapes
against the config, the semantic diff and the verdict cache. What a host holds is judged one
floor up, in dflash_provision.host_state."""
