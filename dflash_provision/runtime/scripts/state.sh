# dflash state PORT: what runs on PORT, in one exec (status, launch's idempotency check, stop).
#   dflash-state 1
#   dir DIR                the port's state directory (may not exist)
#   pid N                  the pidfile's pid (absent: no pidfile)
#   alive 1|0              that process group still has live (non-zombie) members
#   listening 1|0          something listens on TCP PORT in this network namespace
#   listener N             the pid holding that socket, when this namespace shows it
#   listener_pgid N        its process group (a server's child holding the socket is still it)
#   log PATH               the server log, when it exists
#   record JSON            the launch record (one line), when it exists and is < 256 KiB
#   cmdpid N               whose command line follows
#   arg VALUE ...          that process's argv, one element per line
port=$1
state_dir "$port"
say "dflash-state 1"
say "dir $sdir"
cmdpid=
alive=0
if read_pid; then
	say "pid $pid"
	if server_alive; then
		alive=1
		cmdpid=$pid
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
