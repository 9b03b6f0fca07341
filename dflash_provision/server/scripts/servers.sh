# dflash servers: every port that has a launch record in this login's state directory, in one
# exec (status, stop, logs and runtime-check find TARGET's server by its drafter directory).
#   dflash-servers 1
#   base DIR                       the directory that holds one directory per port
#   server PORT ALIVE RECORD       ALIVE 1: that port's pidfile names a live server; x: it
#                                  names one that is gone (crashed, killed, a reboot: `stop`
#                                  removes the pidfile); 0: no pidfile; RECORD
#                                  the launch record (one JSON line); at most 200 ports, records
#                                  of 64 KiB at most (ours are a few KiB)
state_dir ""
base=${sdir%/}
say "dflash-servers 1"
say "base $base"
n=0
for d in "$base"/*/; do
	port=${d%/}
	port=${port##*/}
	case $port in
	'' | *[!0-9]*) continue ;;
	esac
	sdir=$base/$port
	[ -f "$sdir/launch.json" ] || continue
	size=$(wc -c <"$sdir/launch.json")
	[ "$size" -le 65536 ] || continue
	alive=0
	if read_pid; then
		alive=x
		server_alive && alive=1
	fi
	rec=
	IFS= read -r rec <"$sdir/launch.json" || true
	[ -n "$rec" ] || continue
	say "server $port $alive $rec"
	n=$((n + 1))
	[ "$n" -lt 200 ] || break
done
exit 0
