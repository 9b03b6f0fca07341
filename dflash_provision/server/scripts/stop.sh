# dflash stop PORT TIMEOUT EXPECT: end every process of our server: TERM, KILL after TIMEOUT
# seconds, wait until none is left, remove the pidfile.
# EXPECT is "PID:START_TIME" of the pidfile's server as the caller checked it (its command line
# against the launch record), or "gone" when the caller saw that the server itself exited.
# Nothing is signalled unless the pidfile still names that very process (check_pid), or, with
# the server gone, only processes that carry its marker. Which processes: see collect (the
# server's process group and session, every descendant, every process with its marker).
#   dflash-stop 1
#   status not-running|stopped|refused|unsafe-dir|error
#   pid N              the pidfile's
#   why PROBLEM        refused: check_pid's problem, or "changed" (not what the caller checked)
#   signal TERM|KILL   KILL: something outlived TIMEOUT
#   ended PIDS         every process that was signalled
#   how group N session N marker N descendant N      how each was found
#   leader gone        the server itself had exited; what it left was ended
#   left PIDS          still there after KILL (error)
port=$1
timeout=$2
expect=${3:-}
state_dir "$port"
say "dflash-stop 1"
if ! trust_state_dir look; then
	refuse_state_dir
	exit 0
fi
if [ "$trust" = missing ] || ! read_pid; then
	say "status not-running"
	exit 0
fi
say "pid $pid"
check_pid
refuse() {
	say "status refused"
	say "why $1"
	exit 0
}
leader=
case $pid_problem in
'')
	[ "$expect" = "$pid:$pid_stime" ] || refuse changed
	leader=$pid
	;;
gone) say "leader gone" ;;
*) refuse "$pid_problem" ;;
esac

# merge: adds $found's entries that $all lacks to $all; sets $fresh to their pids.
all=
merge() {
	fresh=
	for entry in $found; do
		case "$all " in *" ${entry%%:*}:"*) continue ;; esac
		all="$all $entry"
		fresh="$fresh ${entry%%:*}"
	done
}
found=
collect "$leader" "$pid_marker"
merge
if [ -z "$all" ]; then
	rm -f "$sdir/pid"
	say "status not-running"
	exit 0
fi
kill -TERM $fresh 2>/dev/null
[ -z "$leader" ] || kill -TERM -"$leader" 2>/dev/null
signal=TERM
end=$(($(date +%s) + timeout))
while :; do
	sleep 0.2 2>/dev/null || sleep 1
	collect "$leader" "$pid_marker"
	merge
	[ -n "$found" ] || break
	if [ "$(date +%s)" -lt "$end" ]; then
		# Newly seen processes get their TERM; the others are not sent it again (a second
		# TERM makes some servers skip their orderly shutdown).
		[ -z "$fresh" ] || kill -"$signal" $fresh 2>/dev/null
		continue
	fi
	[ "$signal" = TERM ] || break
	signal=KILL
	pids_of
	kill -KILL $pids 2>/dev/null
	[ -z "$leader" ] || kill -KILL -"$leader" 2>/dev/null
	end=$(($(date +%s) + 5))
done
say "signal $signal"
left=
[ -z "$found" ] || {
	pids_of
	left=$pids
}
found=$all
pids_of
say "ended$pids"
say "how $how"
if [ -n "$left" ]; then
	say "status error"
	say "left$left"
	exit 0
fi
rm -f "$sdir/pid"
say "status stopped"
exit 0
