# dflash backups: list the backups that write.sh keeps for PATH, oldest first.
# Argument: PATH.  Output:
#   dflash-backups 1
#   backup SIZE MTIME SHA256 NAME     (one line per backup; NAME is the rest of the line)
#   result ok
# or, when the backups cannot be looked at (a directory on the way may not be entered):
#   failed permission-denied / error MESSAGE / result failed
# Backups live in <dir>/.dflash-backups/<basename>.<UTC timestamp>[.<n>].

path=$1
dir=${path%/*}
[ -n "$dir" ] || dir=/
base=${path##*/}
bdir=$dir/.dflash-backups

say "dflash-backups 1"
# No backup directory is "no backups" only when we could have seen one: a directory we may not
# enter (or read) would otherwise look empty.
examine_dir "$bdir"
denied=
if [ "$dir_state" = permission-denied ]; then
	denied="cannot enter $dir_at"
elif [ "$dir_state" = ok ] && [ ! -r "$bdir" ]; then
	denied="cannot list $bdir"
fi
if [ -n "$denied" ]; then
	say "failed permission-denied"
	say "error user $(whoami_text) $(oneline "$denied")"
	say "result failed"
	exit 0
fi
if [ -d "$bdir" ]; then
	for f in "$bdir"/*; do
		name=${f##*/}
		case $name in
		"$base".[0-9]*) ;;
		*) continue ;;
		esac
		[ -f "$f" ] || continue
		meta=$(stat -c '%s %Y' "$f" 2>/dev/null) || continue
		hash_of "$f" 2>/dev/null || continue
		say "backup $meta $hash $name"
	done
fi
say "result ok"
