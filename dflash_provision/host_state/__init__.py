"""Judges of what a host holds, against the authority: THE judge of a host's config file
(file_status: HostStatus and the one table of what each command makes of it), the pinned files'
verdicts (files_status, pinned_check) and the weights' headers against the config
(weights_check). They read the host through dflash_provision.remote and decide nothing else."""
