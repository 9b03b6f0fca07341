# dflash stop PORT TIMEOUT: TERM our server's process group, KILL it after TIMEOUT seconds,
# wait until no member is left, remove the pidfile. Only the pidfile's group is signalled.
#   dflash-stop 1
#   status not-running|stopped|error
#   pid N / signal TERM|KILL / left PIDS (members still there after KILL: error)
port=$1
timeout=$2
state_dir "$port"
say "dflash-stop 1"
if ! read_pid; then
	say "status not-running"
	exit 0
fi
say "pid $pid"
if ! server_alive; then
	rm -f "$sdir/pid"
	say "status not-running"
	exit 0
fi
kill -TERM -"$pid" 2>/dev/null
end=$(($(date +%s) + timeout))
signal=TERM
while group_alive "$pid"; do
	if [ "$(date +%s)" -ge "$end" ]; then
		signal=KILL
		kill -KILL -"$pid" 2>/dev/null
		break
	fi
	sleep 0.2 2>/dev/null || sleep 1
done
if [ "$signal" = KILL ]; then
	tries=0
	while group_alive "$pid" && [ "$tries" -lt 25 ]; do
		sleep 0.2 2>/dev/null || sleep 1
		tries=$((tries + 1))
	done
fi
say "signal $signal"
if group_alive "$pid"; then
	say "status error"
	say "left$members"
	exit 0
fi
rm -f "$sdir/pid"
say "status stopped"
exit 0
