# dflash read: report one file's state and bytes in ONE exec (used by verify, push and audit).
# Argument: PATH.  Output lines ("key value"), then a "data" line, then the raw bytes to EOF:
#   dflash-read 1
#   status present|missing|permission-denied|not-regular|dir-missing|error
#   symlink 1                     (only when PATH is a symlink; it is followed for reading)
#   size N / sha256 HEX / mode OCT / uid N / gid N / mtime EPOCH   (present only)
#   error MESSAGE                 (not present only)
#   data
#   <bytes>
# Exit status 0 whenever the state could be reported, whatever it is.

path=$1
dir=${path%/*}
[ -n "$dir" ] || dir=/

say "dflash-read 1"
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

# Hash first (it also proves the file is readable), then describe, then stream the bytes. The
# caller re-hashes the bytes it receives, which catches a file that changed in between.
if ! hash_out=$({ sha256sum <"$path"; } 2>&1); then
	reason=$(reason_of "$hash_out")
	if [ "$reason" = permission-denied ]; then say "status permission-denied"; else say "status error"; fi
	say "error $(oneline "$hash_out")"
	say data
	exit 0
fi
stat_out=$(stat -c '%s %a %u %g %Y' "$path" 2>/dev/null) || stat_out=""
set -- $stat_out
say "status present"
say "sha256 $(printf '%s' "$hash_out" | cut -c1-64)"
[ -n "$stat_out" ] && {
	say "size $1"
	say "mode $2"
	say "uid $3"
	say "gid $4"
	say "mtime $5"
}
say data
exec cat "$path"
