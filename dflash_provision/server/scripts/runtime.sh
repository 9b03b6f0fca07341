# Helpers for the runtime scripts, appended after remote/scripts/common.sh (oneline, say, flush,
# nl). POSIX sh for dash and busybox ash: a container that runs vLLM may still have only busybox.

# state_dir PORT: sets $sdir, the port's directory (see dflash_provision/server/records.py),
# and $sbase, the directory it lives under ($sbase/dflash-provision/vllm/PORT).
# Without HOME (lxc-attach --clear-env) root uses /root, others a per-uid directory in /tmp.
state_dir() {
	sbase=${XDG_STATE_HOME:-}
	if [ -z "$sbase" ]; then
		h=${HOME:-}
		if [ -z "$h" ]; then
			uid=$(id -u)
			if [ "$uid" = 0 ]; then h=/root; else h=/tmp/dflash-provision-$uid; fi
		fi
		sbase=$h/.local/state
	fi
	sdir=$sbase/dflash-provision/vllm/$1
}

# trust_state_dir MODE: the state directory's trust rules (README "Trust model"), the same as
# push's .dflash-backups. The components the tool creates (dflash-provision, vllm, PORT; in the
# no-HOME fallback also /tmp/dflash-provision-UID and its .local/state) must each be a real
# directory (not a symlink), owned by the login user, writable by no one else, and PORT's mode
# 0700 (all are created 0700). $sbase itself (the user's
# state directory) must not be another user's or writable by others. MODE create: missing
# components are made (mode 0700); MODE look: a missing component is fine (nothing runs).
# Sets $trust ok|missing|unsafe and $trust_why. Each component is checked from inside its parent
# (cd -P), so a link planted on the way is seen, never followed.
trust_state_dir() {
	trust=ok
	trust_why=
	mode_want=$1
	me=$(id -u)
	rest=dflash-provision/vllm/${sdir##*/}
	start=$sbase
	case $sbase in
	/tmp/dflash-provision-"$me"/.local/state)
		start=/tmp
		rest=dflash-provision-$me/.local/state/$rest
		;;
	*)
		if [ ! -d "$sbase" ]; then
			[ "$1" = create ] || {
				trust=missing
				return 0
			}
			err=$(mkdir -p -m 700 "$sbase" 2>&1) || {
				trust=unsafe
				trust_why="cannot create $sbase: $err"
				return 1
			}
		fi
		set -- "$1" $(stat -L -c '%u %a' "$sbase" 2>/dev/null)
		if [ "${2:-}" != 0 ] && [ "${2:-}" != "$me" ]; then
			trust=unsafe
			trust_why="$sbase is owned by uid ${2:-?}, neither root nor user $me"
			return 1
		fi
		case ${3:-} in *[2367]? | *[2367]) if [ ! -k "$sbase" ]; then
			trust=unsafe
			trust_why="others may write in $sbase (mode $3)"
			return 1
		fi ;; esac
		;;
	esac
	trust_why=$(
		cd -P -- "$start" 2>/dev/null || exit 3
		path=$start
		while [ -n "$rest" ]; do
			c=${rest%%/*}
			case $rest in */*) rest=${rest#*/} ;; *) rest= ;; esac
			path=$path/$c
			if [ -L "$c" ]; then
				echo "$path is a symlink"
				exit 2
			fi
			if [ ! -d "$c" ]; then
				[ "$mode_want" = create ] || exit 4
				[ ! -e "$c" ] || {
					echo "$path is not a directory"
					exit 2
				}
				mkdir -m 700 "$c" 2>/dev/null || [ -d "$c" ] || {
					echo "cannot create $path"
					exit 2
				}
			fi
			cd -P "$c" 2>/dev/null || {
				echo "$path cannot be entered"
				exit 2
			}
			set -- $(stat -c '%u %a' . 2>/dev/null)
			[ "${1:-}" = "$me" ] || {
				echo "$path is owned by uid ${1:-?}, not by the login user (uid $me)"
				exit 2
			}
			# The port's own directory holds the pidfile: 0700. Above it, no one else may
			# write (they could rename the port's directory away and plant another).
			if [ -z "$rest" ]; then
				[ "${2:-}" = 700 ] || {
					echo "$path has mode ${2:-?}, not 0700"
					exit 2
				}
			else
				case ${2:-} in *[2367]? | *[2367] | '')
					echo "others may write in $path (mode ${2:-?})"
					exit 2
					;;
				esac
			fi
		done
	)
	rc=$?
	case $rc in
	0) return 0 ;;
	4)
		trust=missing
		return 0
		;;
	3) trust_why="$start cannot be entered" ;;
	esac
	trust=unsafe
	[ -n "$trust_why" ] || trust_why="$sdir cannot be examined"
	return 1
}

# refuse_state_dir: reports an unsafe state directory (the caller exits): Python maps it to
# exit 7, like push's unsafe .dflash-backups.
refuse_state_dir() {
	say "status unsafe-dir"
	say "error refusing the state directory $(oneline "$sdir"): $(oneline "$trust_why"); another user could plant a pidfile there to make stop signal their choice of process (remove it: the next launch creates its own, mode 0700)"
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

# start_state PID: like start_time, and sets $pstate to PID's state letter (Z: a zombie).
start_state() {
	stime=
	pstate=
	line=
	IFS= read -r line <"/proc/$1/stat" 2>/dev/null || return 1
	set -- ${line##*) }
	[ $# -ge 20 ] || return 1
	pstate=$1
	shift 19
	stime=$1
}

# read_pid: sets $pid, $pid_stime (the start time recorded with it) and $pid_marker (the
# DFLASH_PROVISION_SERVER value the server was started with, when valid) from the pidfile
# "PID START_TIME MARKER"; false when there is none. Then check_pid judges it.
read_pid() {
	pid=
	pid_stime=
	pid_marker=
	[ -f "$sdir/pid" ] || return 1
	IFS=' ' read -r pid pid_stime pid_marker _ <"$sdir/pid" || true
	case $pid_marker in
	*[!0-9a-f-]*) pid_marker= ;;
	esac
	[ "${#pid_marker}" -ge 32 ] || pid_marker=
	return 0
}

# check_pid: sets $pid_problem to why the pidfile's process must not be signalled, or empty
# when it is the server the pidfile was written for (same pid AND same start time: the pidfile
# sits in $HOME and outlives a reboot, after which the pid may be another program's):
#   malformed      the pid is not a number
#   low            pid 0 or 1: `kill -TERM -0` would signal our own process group, 1 is init
#   no-start-time  no start time recorded: the pid cannot be told from a reused one
#   gone           no such process (or only its zombie): the server exited
#   start-time     that pid now names a process started at another time ($stime)
# The command line is compared with the launch record by the caller (process.py).
check_pid() {
	pid_problem=
	case $pid in
	'' | *[!0-9]*)
		pid_problem=malformed
		return 0
		;;
	esac
	case $pid_stime in
	'' | *[!0-9]*) pid_problem=no-start-time ;;
	esac
	if [ "$pid" -le 1 ]; then
		pid_problem=low
	elif [ -n "$pid_problem" ]; then
		:
	elif ! start_state "$pid" || [ "$pstate" = Z ] || [ "$pstate" = X ]; then
		pid_problem=gone
	elif [ "$stime" != "$pid_stime" ]; then
		pid_problem=start-time
	fi
	return 0
}

# server_alive: the pidfile's server still runs (check_pid found nothing wrong).
server_alive() {
	check_pid
	[ -z "$pid_problem" ]
}

# collect LEADER MARKER: sets $found to " PID:HOW:STIME" entries, every live process of the
# server: HOW is group (LEADER's process group; LEADER itself too), session (LEADER's session:
# a child that made its own group), marker (its environment holds
# DFLASH_PROVISION_SERVER=MARKER, which every process the server starts inherits: a child that
# called setsid(), a double-forked daemon), descendant (by parent pid from any of those), or
# kept (found by an earlier collect and still the same process: $found is carried over).
# LEADER empty: only the marker and what was kept. Zombies and this shell are left out.
collect() {
	c_leader=$1
	c_mark=$2
	kept=
	for entry in $found; do
		c_pid=${entry%%:*}
		if start_state "$c_pid" && [ "$pstate" != Z ] && [ ":$stime" = ":${entry##*:}" ]; then
			kept="$kept $c_pid:${entry#*:}"
		fi
	done
	found=$kept
	table=
	for st in /proc/[0-9]*/stat; do
		line=
		IFS= read -r line <"$st" 2>/dev/null || continue
		c_pid=${st#/proc/}
		c_pid=${c_pid%/stat}
		[ "$c_pid" != "$$" ] || continue
		set -- ${line##*) }
		[ $# -ge 20 ] || continue
		[ "$1" != Z ] && [ "$1" != X ] || continue
		c_ppid=$2 c_pgid=$3 c_sid=$4
		shift 19
		table="$table $c_pid/$c_ppid/$1"
		case "$found " in *" $c_pid:"*) continue ;; esac
		[ -n "$c_leader" ] || continue
		if [ "$c_pid" = "$c_leader" ] || [ "$c_pgid" = "$c_leader" ]; then
			found="$found $c_pid:group:$1"
		elif [ "$c_sid" = "$c_leader" ]; then
			found="$found $c_pid:session:$1"
		fi
	done
	if [ -n "$c_mark" ]; then
		# environ is NUL-separated: grep -z (GNU grep, busybox >= 1.30) reads it entry by entry;
		# without -z busybox grep would only see each file's first entry.
		if [ -z "${grep_z:-}" ]; then
			grep_z=no
			printf 'a\000b\000' | grep -q -z -x -F -e b 2>/dev/null && grep_z=yes
		fi
		if [ "$grep_z" = yes ]; then
			c_files=$(grep -l -z -x -F -e "DFLASH_PROVISION_SERVER=$c_mark" /proc/[0-9]*/environ 2>/dev/null)
		else
			c_files=
			for f in /proc/[0-9]*/environ; do
				tr '\000' '\n' <"$f" 2>/dev/null | grep -q -x -F -e "DFLASH_PROVISION_SERVER=$c_mark" &&
					c_files="$c_files $f"
			done
		fi
		for f in $c_files; do
			c_pid=${f#/proc/}
			c_pid=${c_pid%/environ}
			case "$found " in *" $c_pid:"*) continue ;; esac
			case "$table " in *" $c_pid/"*) ;; *) continue ;; esac
			c_st=${table#*" $c_pid/"}
			c_st=${c_st%%" "*}
			found="$found $c_pid:marker:${c_st#*/}"
		done
	fi
	# Descendants: one pass per generation, until a pass adds nothing.
	c_more=1
	while [ -n "$c_more" ]; do
		c_more=
		for entry in $table; do
			c_pid=${entry%%/*}
			c_rest=${entry#*/}
			case "$found " in *" $c_pid:"*) continue ;; esac
			case "$found " in *" ${c_rest%%/*}:"*)
				found="$found $c_pid:descendant:${c_rest#*/}"
				c_more=1
				;;
			esac
		done
	done
}

# pids_of: sets $pids to the pids of $found; $how to "group N session N ..." counts.
pids_of() {
	pids=
	n_group=0 n_session=0 n_marker=0 n_descendant=0 n_kept=0
	for entry in $found; do
		pids="$pids ${entry%%:*}"
		h=${entry#*:}
		case ${h%%:*} in
		group) n_group=$((n_group + 1)) ;;
		session) n_session=$((n_session + 1)) ;;
		marker) n_marker=$((n_marker + 1)) ;;
		descendant) n_descendant=$((n_descendant + 1)) ;;
		*) n_kept=$((n_kept + 1)) ;;
		esac
	done
	how="group $n_group session $n_session marker $n_marker descendant $n_descendant"
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
