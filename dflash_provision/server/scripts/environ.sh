# dflash environ PORT EXPECT NAME...: the values of NAME... in the environment of the port's
# running server (/proc/PID/environ: readable by the same user or root), for a restart that
# keeps them. EXPECT is "PID:START_TIME" of the server as the caller checked it: nothing is read
# from another process. Only the names asked for are printed (the rest of the environment may
# hold tokens the caller has no use for); nothing is written anywhere.
#   dflash-environ 1
#   status ok|changed|unreadable|not-running|unsafe-dir
#   why TEXT           (unreadable, changed)
#   env NAME=VALUE     one line per name found (a value holding a line break is left out:
#                      start.sh could not pass it; the caller then asks for --env)
port=$1
expect=$2
shift 2
state_dir "$port"
say "dflash-environ 1"
if ! trust_state_dir look; then
	refuse_state_dir
	exit 0
fi
if [ "$trust" = missing ] || ! read_pid; then
	say "status not-running"
	exit 0
fi
check_pid
if [ -n "$pid_problem" ] || [ "$expect" != "$pid:$pid_stime" ]; then
	say "status changed"
	say "why the pidfile names pid $pid (${pid_problem:-start time $pid_stime}), not $expect"
	exit 0
fi
# $(...) keeps the exit status of the read: a process of another user (or one that made itself
# non-dumpable) cannot be read, and an empty environment is not a readable one either.
if ! content=$(tr '\000' '\n' <"/proc/$pid/environ" 2>/dev/null) || [ -z "$content" ]; then
	say "status unreadable"
	say "why /proc/$pid/environ cannot be read by uid $(id -u)"
	exit 0
fi
say "status ok"
flush
printf '%s\n' "$content" | while IFS= read -r entry; do
	for want in "$@"; do
		[ "${entry%%=*}" != "$want" ] || printf 'env %s\n' "$entry"
	done
done
exit 0
