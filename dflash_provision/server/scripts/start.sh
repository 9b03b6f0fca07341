# dflash start PORT CMD [ARG...]: start CMD detached for PORT, unless our server runs there.
# stdin: line 1 the launch record (JSON, one line), then NAME=VALUE lines to export: env values
# travel on stdin, never on a command line that `ps` shows.
#   dflash-start 1
#   dir DIR
#   status started|running|busy|error|unsafe-dir
#   pid N                 (started: the new server, its own session and process group; the
#                         pidfile says "PID START_TIME MARKER", DFLASH_PROVISION_SERVER=MARKER
#                         is in the environment of the server and all it starts)
#   log PATH              offset N: the log's size before this start (its lines come after)
#   error MESSAGE
# The server: setsid (new session and process group, no controlling terminal, so it outlives
# the SSH session), nohup, stdin /dev/null, stdout and stderr appended to the log.
port=$1
shift
state_dir "$port"
say "dflash-start 1"
say "dir $sdir"
umask 077
# The state directory is created (mode 0700) or refused when it is not the login user's own.
if ! trust_state_dir create; then
	refuse_state_dir
	exit 0
fi
# One start at a time per port: a lock directory holding the starting shell's pid. A lock whose
# holder is gone (killed mid-start) is taken over; one without a pid yet counts as held.
lock=$sdir/starting
if ! mkdir "$lock" 2>/dev/null; then
	holder=
	IFS= read -r holder <"$lock/pid" 2>/dev/null || true
	if [ -z "$holder" ] || kill -0 "$holder" 2>/dev/null; then
		say "status busy"
		say "error another launch is starting a server on this port right now (lock $(oneline "$lock"), pid ${holder:-?})"
		exit 0
	fi
	rm -rf "$lock"
	if ! mkdir "$lock" 2>/dev/null; then
		say "status busy"
		say "error another launch is starting a server on this port right now"
		exit 0
	fi
fi
printf '%s\n' "$$" >"$lock/pid"
trap 'rm -rf "$lock"; flush' EXIT
if read_pid && server_alive; then
	say "status running"
	say "pid $pid"
	exit 0
fi
if ! command -v setsid >/dev/null 2>&1; then
	say "status error"
	say "error setsid is not installed on this machine"
	exit 0
fi
IFS= read -r record || true
printf '%s\n' "$record" >"$sdir/launch.json.tmp" && mv -f "$sdir/launch.json.tmp" "$sdir/launch.json"
while IFS= read -r assignment; do
	[ -n "$assignment" ] && export "$assignment"
done
log=$sdir/server.log
# The log is appended across launches; past 64 MiB the old part moves to server.log.1.
if [ -f "$log" ] && [ "$(wc -c <"$log")" -gt 67108864 ]; then
	mv -f "$log" "$log.1"
fi
printf '==== dflash-provision launch on port %s at %s\n' "$port" "$(date -u +%Y-%m-%dT%H:%M:%SZ)" >>"$log"
offset=$(wc -c <"$log")
# nohup when there is one (busybox containers may lack it): setsid alone already leaves no
# controlling terminal that could send SIGHUP.
# The marker: every process the server starts inherits it in its environment, also one that
# leaves the server's session (setsid) or is double-forked away from it; stop finds them by it.
marker=
IFS= read -r marker </proc/sys/kernel/random/uuid 2>/dev/null || marker=
[ "${#marker}" -ge 32 ] || marker=$(od -An -N16 -tx1 /dev/urandom 2>/dev/null | tr -d ' \n')
if command -v nohup >/dev/null 2>&1; then
	DFLASH_PROVISION_SERVER=$marker setsid nohup "$@" </dev/null >>"$log" 2>&1 &
else
	DFLASH_PROVISION_SERVER=$marker setsid "$@" </dev/null >>"$log" 2>&1 &
fi
pid=$!
start_time "$pid" || stime=
printf '%s %s %s\n' "$pid" "$stime" "$marker" >"$sdir/pid.tmp" && mv -f "$sdir/pid.tmp" "$sdir/pid"
say "status started"
say "pid $pid"
say "log $log"
say "offset $offset"
exit 0
