# The push's lock on one file, shared by write.sh and settle.sh (prepended to both, after
# common.sh). Both run inside the push's own directory (<dir>/.dflash-backups) with $base, $bdir
# and $lock_timeout set.

# proc_token PID: sets $token to "PID START BOOT", what names one process for as long as the
# machine runs: its start time (field 22 of /proc/PID/stat, in clock ticks since boot) and the
# boot id, "-" where /proc cannot tell. A pid alone is not enough: a container restarted
# mid-push gives the next script the same pid.
proc_token() {
	token=$1
	pstart=
	boot=
	if read -r pstat </proc/"$1"/stat 2>/dev/null; then
		set -- ${pstat##*") "}
		pstart=${20:-}
	fi
	read -r boot </proc/sys/kernel/random/boot_id 2>/dev/null
	token="$token ${pstart:--} ${boot:--}"
}

# lock_is_stale PID [START BOOT]: the mkdir lock's holder is gone (no such pid, or that pid is
# now another process, or the machine rebooted since).
lock_is_stale() {
	kill -0 "$1" 2>/dev/null || return 0
	[ $# -ge 3 ] || return 1 # an older script's lock: the pid is all there is
	held_start=$2
	held_boot=$3
	proc_token "$1"
	set -- $token
	[ "$held_boot" = - ] || [ "$3" = - ] || [ "$held_boot" = "$3" ] || return 0
	[ "$held_start" = - ] || [ "$2" = - ] || [ "$held_start" = "$2" ] || return 0
	return 1
}

# take_lock: hold the lock on $base: flock on ./$base.lock if flock exists (released when the
# shell ends), else an mkdir lock ./$base.lockdir (stale when its recorded pid is gone or now
# names another process; $lockdir is set so that the caller's EXIT trap removes it). Sets
# $lock_method. On failure returns 1 with $lock_why ("lock-timeout", else a tool failed:
# "tool"), $lock_what (what could not be done) and $lock_err (the tool's message).
take_lock() {
	lock_err=
	if command -v flock >/dev/null; then
		lockfile=./$base.lock
		# A failed redirection on "exec" would end this shell: try it on a regular builtin first
		# (no subshell on the way that works), and only on failure ask a subshell for the message.
		if ! true 2>/dev/null 9>>"$lockfile"; then
			lock_err=$( (: >>"$lockfile") 2>&1)
			lock_why=tool lock_what="open $bdir/$base.lock"
			return 1
		fi
		exec 9>>"$lockfile"
		if ! flock -w "$lock_timeout" 9; then
			lock_why=lock-timeout
			lock_what="another push holds $bdir/$base.lock (waited ${lock_timeout}s)"
			return 1
		fi
		lock_method=flock
		return 0
	fi
	waited=0
	lockdir=
	proc_token $$
	mine=$token
	until lock_err=$(mkdir ./"$base".lockdir 2>&1); do
		case $(reason_of "$lock_err") in
		read-only | no-space | permission-denied | not-permitted)
			lock_why=tool lock_what="create lock $bdir/$base.lockdir"
			return 1
			;;
		esac
		holder=
		read -r holder <./"$base".lockdir/pid 2>/dev/null
		if [ -n "$holder" ] && lock_is_stale $holder; then
			rm -rf ./"$base".lockdir # its owner is gone
			continue
		fi
		if [ "$waited" -ge "$((lock_timeout * 10))" ]; then
			lock_why=lock-timeout
			lock_what="another push holds $bdir/$base.lockdir (waited ${lock_timeout}s; remove it if no push is running)"
			return 1
		fi
		sleep 0.1 2>/dev/null || sleep 1
		waited=$((waited + 1))
	done
	lockdir=./$base.lockdir
	echo "$mine" >"$lockdir/pid" 2>/dev/null
	lock_method=mkdir
}
