# dflash weights: the safetensors headers of a model directory, in ONE exec (validate of a target,
# launch's pre-flight, runtime-check stage a). Only headers travel, never the weights.
# Arguments: DIR MAX_FILES MAX_HEADER MAX_TOTAL MAX_INDEX DEADLINE_S
# Output lines ("key value"), then a "data" line, then the bytes:
#   dflash-weights 1
#   dir ok|missing|permission-denied|not-a-directory
#   too-many N                 (more than MAX_FILES *.safetensors: none is read)
#   file SIZE LEN NAME         (a header of LEN bytes; its bytes are sent only when 8 + LEN <= SIZE)
#   skip REASON NAME           (not read: symlink-outside not-regular unreadable short too-large
#                               total-too-large bad-name; a header length over MAX_HEADER is
#                               "too-large LEN")
#   index SIZE                 (model.safetensors.index.json: its SIZE bytes follow the headers)
#   skip-index REASON
#   data
#   <each sent header's bytes, in the order of the file lines, then the index's bytes>
# Trust: the directory may belong to another user. A symlink is followed only when it resolves
# inside the directory; only regular files are read; every read is bounded by the limits (a file
# swapped for a FIFO after these checks is ended by the watchdog at the deadline).

dir=$1
max_files=$2
max_header=$3
max_total=$4
max_index=$5
deadline=${6:-0}
cr=$(printf '\r')

say "dflash-weights 1"
start_watchdog
examine_dir "$dir"
say "dir $dir_state"
if [ "$dir_state" != ok ]; then
	say data
	exit 0
fi
real=$(cd -P -- "$dir" && pwd -P) || real=$dir

# usable FILE NAME: the checks every file read here passes; says "skip REASON NAME" if not.
usable() {
	case $2 in *"$nl"* | *"$cr"*)
		say "skip bad-name -"
		return 1
		;;
	esac
	if ! inside "$1"; then
		say "skip symlink-outside $2"
		return 1
	fi
	if [ ! -f "$1" ]; then
		say "skip not-regular $2"
		return 1
	fi
	if [ ! -r "$1" ]; then
		say "skip unreadable $2"
		return 1
	fi
}

count=0
for f in "$dir"/*.safetensors; do
	[ -e "$f" ] || [ -L "$f" ] || continue
	count=$((count + 1))
done
if [ "$count" -gt "$max_files" ]; then
	say "too-many $count"
	say data
	exit 0
fi

total=0
send=
for f in "$dir"/*.safetensors; do
	[ -e "$f" ] || [ -L "$f" ] || continue
	name=${f##*/}
	usable "$f" "$name" || continue
	size=$(stat -L -c %s -- "$f" 2>/dev/null) || size=
	# The 8-byte little-endian length, as 8 decimal bytes (od's own byte order is the host's).
	set -- $(od -An -tu1 -N8 -- "$f" 2>/dev/null)
	if [ -z "$size" ] || [ $# -ne 8 ]; then
		say "skip short $name"
		continue
	fi
	if [ "$5$6$7$8" != 0000 ]; then
		say "skip too-large $name"
		continue
	fi
	len=$(($1 + $2 * 256 + $3 * 65536 + $4 * 16777216))
	if [ "$len" -gt "$max_header" ]; then
		say "skip too-large-$len $name"
		continue
	fi
	if [ $((8 + len)) -gt "$size" ]; then
		say "file $size $len $name"
		continue
	fi
	if [ $((total + len)) -gt "$max_total" ]; then
		say "skip total-too-large $name"
		continue
	fi
	total=$((total + len))
	say "file $size $len $name"
	send=$send$len/$name$nl
done

index="$dir/model.safetensors.index.json"
index_size=
if [ -e "$index" ] || [ -L "$index" ]; then
	if ! inside "$index"; then
		say "skip-index symlink-outside"
	elif [ ! -f "$index" ] || [ ! -r "$index" ]; then
		say "skip-index not-regular-or-unreadable"
	else
		index_size=$(stat -L -c %s -- "$index" 2>/dev/null) || index_size=
		if [ -z "$index_size" ] || [ "$index_size" -gt "$max_index" ]; then
			say "skip-index too-large"
			index_size=
		else
			say "index $index_size"
		fi
	fi
fi

say data
flush
# One open per file: dd skips the length (8 bytes) on the descriptor head then reads from.
old_ifs=$IFS
IFS=$nl
set -f
for item in $send; do
	IFS=$old_ifs
	len=${item%%/*}
	{
		dd bs=8 count=1 of=/dev/null 2>/dev/null
		head -c "$len"
	} <"$dir/${item#*/}"
done
IFS=$old_ifs
set +f
[ -z "$index_size" ] || head -c "$index_size" -- "$index"
