"""``rollout``: a new drafter config across a serving fleet in gated batches, with an automatic
rollback that is proved, as a durable state machine (see engine.py)."""
