# dflash read: report one file's state and bytes in ONE exec (used by verify, push and audit).
# Arguments: PATH [MODE, default 1] [DEADLINE_S, default 0: none]. MODE:
#   1      sha256, size, mode, uid, gid, mtime
#   0      sha256 only: no `stat` process
#   bytes  no remote hash either, just the bytes (the caller hashes them): the fleet audit, where
#          a process less per host is worth more than a second opinion on a torn read
# Output lines ("key value"), then a "data" line, then the raw bytes to EOF:
#   dflash-read 1
#   status present|missing|permission-denied|not-regular|dir-missing|too-large|error
#   symlink 1                     (only when PATH is a symlink; it is followed for reading)
#   sha256 HEX                    (present only, not in mode bytes)
#   size N / mode OCT / uid N / gid N / mtime EPOCH   (present, mode 1 only)
#   error MESSAGE                 (not present only)
#   data
#   <bytes>
# Exit status 0 whenever the state could be reported, whatever it is.
# At most max_bytes + 1 bytes are sent (head -c): the caller reports a longer file as too large
# without ever holding it. In mode 1 the size is known first: a file over the limit is reported
# "too-large" (with its size) and neither hashed nor sent.

path=$1
with_meta=${2:-1}
# A FIFO swapped in for the file after the checks below, or a frozen disk, would hold `head` or
# `sha256sum` forever: the watchdog (common.sh) ends the read at the deadline instead.
deadline=${3:-0}
dir=${path%/*}
[ -n "$dir" ] || dir=/

say "dflash-read 1"
start_watchdog
[ -L "$path" ] && say "symlink 1"

if [ ! -e "$path" ]; then
	examine_dir "$dir"
	case $dir_state in
	ok)
		say "status missing"
		say "error no such file"
		;;
	permission-denied)
		say "status permission-denied"
		say "error user $(whoami_text) cannot enter $(oneline "$dir_at")"
		;;
	not-a-directory)
		say "status dir-missing"
		say "error $(oneline "$dir_at") is not a directory"
		;;
	*)
		say "status dir-missing"
		say "error directory does not exist"
		;;
	esac
	say data
	exit 0
fi

if [ ! -f "$path" ]; then
	say "status not-regular"
	if [ -d "$path" ]; then say "error is a directory"; else say "error not a regular file"; fi
	say data
	exit 0
fi

if [ "$with_meta" = bytes ] && [ -r "$path" ]; then
	say "status present"
	say data
	flush
	exec head -c $((max_bytes + 1)) "$path"
fi

# Describe (mode 1: the size first, so that a file over the limit is neither hashed nor sent),
# hash (it also proves the file is readable), then stream the bytes. The caller re-hashes the
# bytes it receives, which catches a file that changed in between.
meta=-
if [ "$with_meta" = 1 ]; then
	meta=$(stat -c '%s %a %u %g %Y' "$path" 2>/dev/null) || meta=-
	if [ "${meta%% *}" -gt "$max_bytes" ] 2>/dev/null; then
		say "status too-large"
		say "size ${meta%% *}"
		say "error larger than $max_bytes bytes (${meta%% *} bytes)"
		say data
		exit 0
	fi
fi
hash_err=
hash_of "$path" 2>/dev/null || hash_err=$({ sha256sum <"$path"; } 2>&1)
if [ -z "$hash" ]; then
	reason=$(reason_of "$hash_err")
	if [ "$reason" = permission-denied ]; then say "status permission-denied"; else say "status error"; fi
	say "error $(oneline "$hash_err")"
	say data
	exit 0
fi
say "status present"
say "sha256 $hash"
if [ "$meta" != - ]; then
	set -- $meta
	say "size $1"
	say "mode $2"
	say "uid $3"
	say "gid $4"
	say "mtime $5"
fi
say data
flush
exec head -c $((max_bytes + 1)) "$path"
