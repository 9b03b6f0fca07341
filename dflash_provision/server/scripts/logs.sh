# dflash logs WHERE LINES MAXBYTES [OFFSET]: the last LINES lines (at most MAXBYTES bytes) of a
# server log. WHERE is a port (its state directory's server.log) or an absolute log path. OFFSET:
# only what was written after that byte (this launch's lines).
#   dflash-logs 1
#   log PATH / status present|missing / size N / alive 1|0 (WHERE a port)
#   data
#   <bytes>
where=$1
lines=$2
maxbytes=$3
offset=${4:-0}
say "dflash-logs 1"
case $where in
/*) log=$where ;;
*)
	state_dir "$where"
	if ! trust_state_dir look; then
		refuse_state_dir
		exit 0
	fi
	log=$sdir/server.log
	alive=0
	read_pid && server_alive && alive=1
	say "alive $alive"
	;;
esac
say "log $log"
if [ ! -f "$log" ]; then
	say "status missing"
	say data
	exit 0
fi
say "status present"
size=$(wc -c <"$log")
say "size $size"
# Only the log's last bytes are ever read (tail seeks on a file): at most MAXBYTES, and none
# from before OFFSET (a log shorter than OFFSET was truncated: all of it is new).
[ "$offset" -le "$size" ] || offset=0
n=$((size - offset))
[ "$n" -le "$maxbytes" ] || n=$maxbytes
say data
flush
[ "$n" -gt 0 ] || exit 0
tail -c "$n" "$log" | tail -n "$lines"
