"""A vLLM server's lifecycle on a target: launch (also in docker), restart, stop, status,
readiness, the launch record, the port's process, and the pre-flight before a start. Remote work
is POSIX sh in ``scripts/``; every module returns values, only ``dflash_provision.cli`` prints."""
