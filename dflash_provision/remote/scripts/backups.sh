# dflash backups: list the backups that write.sh keeps for PATH, oldest first, or send one of
# them for a rollback.
# Arguments: PATH [NAME].  Output without NAME:
#   dflash-backups 1
#   backup SIZE MTIME SHA256 NAME     (one line per backup; NAME is the rest of the line)
#   result ok
# With NAME (a backup's name): the checks a restore needs, then its bytes:
#   result ok / uid N / data / <bytes>
# or, when the backups cannot be looked at (a directory on the way may not be entered), the
# backup directory is not the push's own (see write.sh "trust"), or NAME is not a backup fit to
# restore:
#   failed REASON / error MESSAGE / result failed
# Backups live in <dir>/.dflash-backups/<basename>.<UTC timestamp>[.<n>]. Only regular files
# are backups: a symlink or anything else there is never followed, listed or sent.

path=$1
name=${2:-}
dir=${path%/*}
[ -n "$dir" ] || dir=/
base=${path##*/}
bdir=$dir/.dflash-backups

say "dflash-backups 1"

refuse() {
	say "failed $1"
	say "error $(oneline "$2")"
	say "result failed"
	exit 0
}

# No backup directory is "no backups" only when we could have seen one: a directory we may not
# enter (or read) would otherwise look empty.
examine_dir "$bdir"
denied=
if [ "$dir_state" = permission-denied ]; then
	denied="cannot enter $dir_at"
elif [ "$dir_state" = ok ] && [ ! -r "$bdir" ]; then
	denied="cannot list $bdir"
fi
[ -z "$denied" ] || refuse permission-denied "user $(whoami_text) $denied"
if [ ! -d "$bdir" ]; then
	[ -z "$name" ] || refuse missing "no backup named $name"
	say "result ok"
	exit 0
fi

# The push's own directory, trusted on write.sh's terms (own_dir.sh), from inside.
cd -P -- "$dir" 2>/dev/null || refuse permission-denied "user $(whoami_text) cannot enter $dir"
here=$(stat -c '%d:%i' . 2>/dev/null)
enter_own_dir existing ||
	refuse unsafe-dir "refusing $bdir: $distrust; another user could have planted links in it (remove it: the next push creates its own, mode 0700)"

if [ -z "$name" ]; then
	for f in ./*; do
		n=${f##*/}
		case $n in
		"$base".[0-9]*) ;;
		*) continue ;;
		esac
		[ -f "$f" ] && [ ! -L "$f" ] || continue
		meta=$(stat -c '%s %Y' "$f" 2>/dev/null) || continue
		hash_of "$f" 2>/dev/null || continue
		say "backup $meta $hash $n"
	done
	say "result ok"
	exit 0
fi

# --- one backup, to restore -------------------------------------------------------------------
# Nobody but root (or us) can change the names in this directory, so what is checked here is
# what is read. Its owner must be one that a backup can have: ours (a copy), or the owner of
# the config or of its directory (a hard link of the config keeps the file's owner), and it must
# have no other name (a hard link of some other file, e.g. one made by a config.json that was a
# hard link to a file elsewhere when it was backed up).
case $name in */* | "" | . | ..) refuse bad-argument "not a backup name: $name" ;; esac
case $name in "$base".[0-9]*) ;; *) refuse bad-argument "not a backup of $base: $name" ;; esac
b=./$name
if [ -L "$b" ]; then
	refuse not-regular "backup $name is not a regular file (a symlink): refusing to restore it"
fi
[ -e "$b" ] || refuse missing "no backup named $name"
[ -f "$b" ] || refuse not-regular "backup $name is not a regular file: refusing to restore it"
# uid and link count of the backup, then the owner of the directory and of the config.
set -- $(stat -c '%u %h' "$b" .. 2>/dev/null) $(stat -c %u "../$base" 2>/dev/null)
[ $# -ge 4 ] || refuse error "cannot examine backup $name"
owner=$1
[ "$owner" = 0 ] || [ -O "$b" ] || [ "$owner" = "$3" ] || [ "$owner" = "${5:-}" ] ||
	refuse untrusted-owner "backup $name is owned by uid $owner, not by root, user $(whoami_text) or the owner of $dir or $base: refusing to restore it"
[ "$2" = 1 ] ||
	refuse linked "backup $name has $2 links (the same file has other names elsewhere): refusing to restore it"
say "result ok"
say "uid $owner"
say data
flush
exec cat "$b"
