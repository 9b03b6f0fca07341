# Shared helpers, prepended to every dflash script. POSIX sh only: runs under dash, bash and
# busybox ash, with coreutils or busybox applets (no python, no bash, no GNU-only options).
# Every variable part arrives as a positional argument; nothing is ever interpolated into code.

LC_ALL=C
export LC_ALL

# The most bytes of a file any script sends (= ops.MAX_CONFIG_BYTES, 1 MiB; a config is ~2 KB).
# One byte more is sent (head -c) so that the caller can tell a file that is too large.
max_bytes=1048576


# A message on one line: protocol lines are newline-delimited.
oneline() {
	printf '%s' "$1" | tr '\n\r' '  '
}

# Map an error message from a tool to a stable reason token.
reason_of() {
	case $1 in
	*"No space left"*) echo no-space ;;
	*"Read-only file system"*) echo read-only ;;
	*"Permission denied"*) echo permission-denied ;;
	*"Operation not permitted"*) echo not-permitted ;;
	*"No such file"*) echo missing ;;
	*"Disk quota"*) echo quota ;;
	*) echo error ;;
	esac
}

# Cost matters: these scripts run once per host per command, on hosts that may be busy, so the
# hot paths spawn as few processes as they can (shell builtins and parameter expansion rather than
# cut/tr/grep/date; one command substitution per group of facts).

nl='
'

# Protocol lines are collected and sent together: each write would be an SSH packet, which costs
# both ends CPU. `flush` sends them: before streaming bytes, before waiting for input, and on exit.
said=
say() {
	said=$said$*$nl
}
flush() {
	[ -z "$said" ] || printf '%s' "$said"
	said=
}
trap flush EXIT

# hash_of FILE: sets $hash to the sha256 (hex) of FILE's bytes; false when it cannot be read.
# One process: the shell cuts sha256sum's "HEX  -" (coreutils and busybox print the same).
hash_of() {
	hash=$(sha256sum <"$1") || {
		hash=
		return 1
	}
	hash=${hash%% *}
}

# Why DIR cannot be used, for a login that is not root. Sets dir_state to ok, permission-denied,
# not-a-directory or missing, and dir_at to the directory concerned. `[ -d DIR ]` alone is false
# both when DIR is missing and when an ancestor cannot be entered (/root is 0700 and we are not
# root), so walk up to the nearest ancestor that can be seen and judge from there.
examine_dir() {
	dir_at=$1
	if [ -d "$dir_at" ]; then
		if [ -x "$dir_at" ]; then dir_state=ok; else dir_state=permission-denied; fi
		return 0
	fi
	while [ ! -e "$dir_at" ]; do
		dir_at=${dir_at%/*}
		[ -n "$dir_at" ] || dir_at=/
	done
	if [ ! -d "$dir_at" ]; then
		dir_state=not-a-directory
	elif [ ! -x "$dir_at" ]; then
		dir_state=permission-denied
	else
		dir_state=missing
		dir_at=$1
	fi
}

# Who we run as, for messages ("user alice").
whoami_text() {
	id -un 2>/dev/null || id -u
}

# start_watchdog: a process that ends this script, and whatever it started, once $deadline
# seconds (the caller's DEADLINE_S argument; empty or 0: never) have passed, so that a step that hangs (a tool stuck on a frozen disk, a FIFO) never outlives
# the caller's timeout (write.sh's traps then remove its temp file and lock; a read has none). When the script leads
# its own process group (a login shell that execs the command, setsid) that whole group is
# ended; otherwise (sshd's login shell usually forks it, and a local caller's group is not ours
# to end) the shell's children, including a stuck one that still holds the flock descriptor,
# and the shell. It checks once a second whether the script is still there (one `sleep 1` at a
# time: it outlives the script by a second at most), with its output closed so that it never
# holds the channel open.
start_watchdog() {
	case $deadline in '' | 0 | *[!0-9]*) return 0 ;; esac
	group=
	if read -r pstat </proc/$$/stat 2>/dev/null; then
		set -- ${pstat##*") "}
		[ "${3:-}" != "$$" ] || group=$$
	fi
	(
		trap - EXIT HUP INT PIPE
		trap '' TERM # it is in the group it ends
		waited=0
		while [ "$waited" -lt "$deadline" ]; do
			sleep 1
			kill -0 $$ 2>/dev/null || exit 0
			waited=$((waited + 1))
		done
		end_script $$ "$group"
	) </dev/null >/dev/null 2>&1 &
}

# end_script PID [GROUP]: what the watchdog does at the deadline (server/scripts/reap.sh does
# the same on the caller's Ctrl-C): the process group GROUP when PID leads one (TERM, a second,
# KILL), then PID itself and its children (TERM), the caller's own process excepted.
end_script() {
	target=$1
	if [ -n "${2:-}" ]; then
		kill -TERM "-$2"
		sleep 1
		kill -KILL "-$2"
	fi
	kill -TERM "$target"
	read -r me </proc/self/stat
	me=${me%% *}
	for s in /proc/[0-9]*/stat; do
		read -r l <"$s" || continue
		set -- ${l##*") "}
		p=${s#/proc/}
		p=${p%/stat}
		[ "$2" != "$target" ] || [ "$p" = "$me" ] || kill -TERM "$p"
	done
}
