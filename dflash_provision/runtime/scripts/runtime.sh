# Helpers for the runtime scripts, appended after remote/scripts/common.sh (oneline, say, flush,
# nl). POSIX sh for dash and busybox ash: a container that runs vLLM may still have only busybox.

# state_dir PORT: sets $sdir, the port's directory (see dflash_provision/runtime/records.py).
# Without HOME (lxc-attach --clear-env) root uses /root, others a per-uid directory in /tmp.
state_dir() {
	base=${XDG_STATE_HOME:-}
	if [ -z "$base" ]; then
		h=${HOME:-}
		if [ -z "$h" ]; then
			uid=$(id -u)
			if [ "$uid" = 0 ]; then h=/root; else h=/tmp/dflash-provision-$uid; fi
		fi
		base=$h/.local/state
	fi
	sdir=$base/dflash-provision/vllm/$1
}

# start_time PID: sets $stime to PID's start time (clock ticks since boot, /proc/PID/stat field
# 22), or empty when PID does not exist.
start_time() {
	stime=
	line=
	IFS= read -r line <"/proc/$1/stat" 2>/dev/null || return 1
	set -- ${line##*) }
	[ $# -ge 20 ] || return 1
	shift 19
	stime=$1
}

# read_pid: sets $pid (and $pid_stime, the start time recorded with it) from the pidfile; false
# when there is none or it does not hold a number.
read_pid() {
	pid=
	pid_stime=
	[ -f "$sdir/pid" ] || return 1
	IFS=' ' read -r pid pid_stime _ <"$sdir/pid" || true
	case $pid in
	'' | *[!0-9]*)
		pid=
		return 1
		;;
	esac
}

# server_alive: the pidfile's server still runs. Its process group has live members AND, when
# its leader is still there, the leader started when the pidfile says: the pidfile sits in
# $HOME and outlives a reboot, after which the same pid may be another program's.
server_alive() {
	group_alive "$pid" || return 1
	[ -n "$pid_stime" ] || return 0
	start_time "$pid" || return 0
	[ "$stime" = "$pid_stime" ]
}

# members PGID: sets $members to the pids of process group PGID that are not zombies. kill -0
# alone would count zombies, and a killed server's zombie is not a running server. Reads
# /proc/*/stat with the shell's own read: no process per pid.
members() {
	members=
	for st in /proc/[0-9]*/stat; do
		line=
		IFS= read -r line <"$st" 2>/dev/null || continue
		# Fields after the command name, which may hold spaces and parentheses: the last ") ".
		rest=${line##*) }
		set -- $rest
		if [ "$3" = "$pgid_want" ] && [ "$1" != Z ]; then
			p=${st#/proc/}
			members="$members ${p%/stat}"
		fi
	done
}
group_alive() {
	pgid_want=$1
	members
	[ -n "$members" ]
}

# listener PORT: sets $inode to the socket inode listening on TCP PORT in this network namespace
# at an address that 127.0.0.1 reaches (127.0.0.1, 0.0.0.0, ::, ::ffff:127.0.0.1), or empty.
# Other addresses do not count: the fake hosts of the test bed, for one, share a namespace.
listener() {
	want=$(printf '%04X' "$1")
	inode=
	for table in /proc/net/tcp /proc/net/tcp6; do
		[ -r "$table" ] || continue
		while read -r _sl local _rem st _q _t _r _u _to ino _rest; do
			[ "$st" = 0A ] || continue
			[ "${local##*:}" = "$want" ] || continue
			case ${local%:*} in
			0100007F | 00000000 | 00000000000000000000000000000000) ;;
			0000000000000000FFFF00000100007F) ;;
			*) continue ;;
			esac
			inode=$ino
			return 0
		done <"$table"
	done
	return 1
}

# owner_of INODE [PID]: sets $owner to a pid holding socket INODE, or empty. PID (our server)
# is looked at first; otherwise every process this namespace shows (one `ls` for all of them).
owner_of() {
	if [ -n "${2:-}" ]; then
		case $(ls -l "/proc/$2/fd/" 2>/dev/null) in
		*"socket:[$1]"*)
			owner=$2
			return 0
			;;
		esac
	fi
	owner=$(
		ls -l /proc/[0-9]*/fd/ 2>/dev/null | while IFS= read -r entry; do
			case $entry in
			/proc/*/fd: | /proc/*/fd/:)
				dir=${entry#/proc/}
				dir=${dir%%/*}
				;;
			*"socket:[$1]")
				echo "$dir"
				break
				;;
			esac
		done
	)
}

# say_argv PID: flushes, then prints one "arg VALUE" line per element of /proc/PID/cmdline.
say_argv() {
	flush
	[ -r "/proc/$1/cmdline" ] || return 0
	tr '\000' '\n' <"/proc/$1/cmdline" | while IFS= read -r a; do
		printf 'arg %s\n' "$a"
	done
}
