# dflash state PORT: what runs on PORT, in one exec (status, launch's idempotency check, stop).
#   dflash-state 1
#   dir DIR                the port's state directory (may not exist)
#   pid N                  the pidfile's pid (absent: no pidfile)
#   pid_problem P          why the pidfile's pid is not our server (runtime.sh check_pid)
#   pid_stime N            the start time the pidfile records; pid_stime_now: the process's
#   parg VALUE ...         the pidfile's process's argv (when it exists), one line per element
#   alive 1|0              the pidfile's server runs (check_pid found nothing wrong)
#   listening 1|0          something listens on TCP PORT in this network namespace
#   listener N             the pid holding that socket, when this namespace shows it
#   listener_pgid N        its process group (a server's child holding the socket is still it)
#   listener_hidden 1      something listens, but no process this login can see holds it
#   log PATH               the server log, when it exists
#   record JSON            the launch record (one line), when it exists and is < 256 KiB
#   cmdpid N               whose command line follows
#   arg VALUE ...          that process's argv, one element per line
port=$1
state_dir "$port"
say "dflash-state 1"
say "dir $sdir"
if ! trust_state_dir look; then
	refuse_state_dir
	exit 0
fi
cmdpid=
alive=0
if [ "$trust" = ok ] && read_pid; then
	say "pid $pid"
	check_pid
	if [ -n "$pid_problem" ]; then
		say "pid_problem $pid_problem"
		[ "$pid_problem" != start-time ] || say "pid_stime_now $stime"
	else
		alive=1
		cmdpid=$pid
	fi
	[ -z "$pid_stime" ] || say "pid_stime $(oneline "$pid_stime")"
	# The pidfile's process's own command line, compared with the record's argv by the caller.
	if [ -z "$pid_problem" ]; then
		flush
		[ -r "/proc/$pid/cmdline" ] && tr '\000' '\n' <"/proc/$pid/cmdline" | while IFS= read -r a; do
			printf 'parg %s\n' "$a"
		done
	fi
fi
say "alive $alive"
if listener "$port"; then
	say "listening 1"
	owner_of "$inode" "$cmdpid"
	if [ -n "$owner" ]; then
		say "listener $owner"
		IFS= read -r line <"/proc/$owner/stat" 2>/dev/null && set -- ${line##*) } && say "listener_pgid $3"
		cmdpid=$owner
	else
		# The socket is in /proc/net/tcp but no /proc/*/fd this login may read holds it:
		# another user's process (we are not root) or one outside this PID namespace.
		say "listener_hidden 1"
	fi
else
	say "listening 0"
fi
[ -f "$sdir/server.log" ] && say "log $sdir/server.log"
if [ -f "$sdir/launch.json" ]; then
	size=$(wc -c <"$sdir/launch.json")
	if [ "$size" -lt 262144 ]; then
		IFS= read -r rec <"$sdir/launch.json" && say "record $rec"
	fi
fi
if [ -n "$cmdpid" ]; then
	say "cmdpid $cmdpid"
	say_argv "$cmdpid"
fi
exit 0
