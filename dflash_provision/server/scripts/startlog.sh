# dflash startlog LOG MAXBYTES: this launch's part of a server log, from its start: the lines
# from the last "==== dflash-provision launch" line (start.sh writes one before each start) on,
# at most MAXBYTES bytes. The log is appended across launches and grows with every request the
# server logs: its start-up records are at the beginning of the last launch's part, not at the
# end of the file.
#   dflash-startlog 1
#   log PATH / status present|missing / size N (the whole log) / from N (the launch line's number)
#   data
#   <bytes>
log=$1
maxbytes=$2
say "dflash-startlog 1"
say "log $log"
if [ ! -f "$log" ]; then
	say "status missing"
	say data
	exit 0
fi
say "status present"
say "size $(wc -c <"$log")"
# sed, not grep -n: grep prints "Binary file matches" for a log that holds a NUL byte.
from=$(sed -n '/^==== dflash-provision launch on port /=' "$log" | tail -n 1)
say "from ${from:-1}"
say data
flush
tail -n "+${from:-1}" "$log" | head -c "$maxbytes"
