# dflash backups: list the backups that write.sh keeps for PATH, oldest first.
# Argument: PATH.  Output:
#   dflash-backups 1
#   backup SIZE MTIME SHA256 NAME     (one line per backup; NAME is the rest of the line)
#   result ok
# Backups live in <dir>/.dflash-backups/<basename>.<UTC timestamp>[.<n>].

path=$1
dir=${path%/*}
[ -n "$dir" ] || dir=/
base=${path##*/}
bdir=$dir/.dflash-backups

say "dflash-backups 1"
if [ -d "$bdir" ]; then
	for f in "$bdir"/*; do
		name=${f##*/}
		case $name in
		"$base".[0-9]*) ;;
		*) continue ;;
		esac
		[ -f "$f" ] || continue
		meta=$(stat -c '%s %Y' "$f" 2>/dev/null) || continue
		hash=$(sha256_of "$f" 2>/dev/null) || continue
		say "backup $meta $hash $name"
	done
fi
say "result ok"
