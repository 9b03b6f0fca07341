"""Running vLLM with the provisioned drafter: launch, status, stop, logs (LIFECYCLE), and the
checks that prove what runs (CHECKS). Remote work is POSIX sh in ``scripts/``; every module here
returns values, only ``dflash_provision.cli`` prints."""
