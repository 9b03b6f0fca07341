"""What proves a running server uses the drafter as trained: runtime-check's stages a-e
(runtime_check.py runs them; stage_disk, stage_server, stage_traffic), the acceptance gate and
its references, the long-context part, the diagnosis of a low acceptance and the fix line of
each failing link (link_fixes), the fleet's runtime-check (fleet_check) and doctor's trace."""
