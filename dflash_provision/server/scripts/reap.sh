# dflash reap NONCE: end the bounded commands (bounded.sh) marked NONCE on this machine, the way
# their watchdog would at the deadline (common.sh end_script); the caller was interrupted.
#   dflash-reap 1
#   ended N          how many marked shells were found
say "dflash-reap 1"
found=0
for c in $(grep -l -F -e "$1" /proc/[0-9]*/cmdline 2>/dev/null); do
	p=${c#/proc/}
	p=${p%/cmdline}
	[ "$p" != $$ ] || continue
	read -r l <"/proc/$p/stat" 2>/dev/null || continue
	set -- ${l##*") "}
	group=
	[ "${3:-}" != "$p" ] || group=$p
	found=$((found + 1))
	(end_script "$p" "$group") </dev/null >/dev/null 2>&1
done
say "ended $found"
