"""The local history: the SQLite store of every push, repair, rollback, audit and runtime-check
(store.py), how it names a host (host_key.py) and the key of an acceptance reference
(references.py)."""
