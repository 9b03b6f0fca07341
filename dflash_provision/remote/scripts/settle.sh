# dflash settle: what became of a write (write.sh) whose answer never reached its caller (the
# connection was lost, the host froze past the timeout, the user pressed Ctrl-C), decided from
# the mark the write leaves in <dir>/.dflash-backups, on a fresh connection, under the push's
# lock: the write has ended, or has not yet gone for its rename (then it never will, see below).
#
# Arguments: DEST NONCE SHA256 LOCK_TIMEOUT_S FOLLOW_SYMLINKS(0|1)
#            NONCE: the one the write was given; SHA256: the bytes it was sending.
#
# The mark <base>.mark.NONCE (see write.sh "Mark") says:
#   landed, reported     the rename happened                         -> landed
#   failed, cancelled    it did not, and the write has ended           -> not landed
#   going TMPNAME        the write was killed mid-rename: its temp file still there means the
#                        rename did not happen (the file is removed now), else it did
#   (none)               the write never went for its rename: the mark is created now,
#                        holding "cancelled", so that a write still on its way finds its name
#                        taken and refuses to rename                  -> not landed
#
# Output lines:
#   verdict landed|not-landed|unknown   (unknown: the reason follows as "error ...")
#   sha256 HEX                          what DEST holds now, under the lock (empty: no regular
#                                       file)

dest=$1
nonce=$2
want_sha=$3
lock_timeout=$4
follow=$5
lockdir=
trap 'if [ -n "$lockdir" ]; then rm -rf "$lockdir"; fi; flush' EXIT

say "dflash-settle 1"

undecided() {
	say "verdict unknown"
	say "error $(oneline "$1")"
	exit 0
}

case $nonce in '' | *[!0-9a-f]*) undecided "bad nonce" ;; esac
case $lock_timeout in '' | *[!0-9]*) undecided "lock timeout must be a number" ;; esac
if [ -L "$dest" ] && [ "$follow" = 1 ]; then
	real=$(readlink -f "$dest" 2>/dev/null) && [ -n "$real" ] && dest=$real
fi
dir=${dest%/*}
[ -n "$dir" ] || dir=/
base=${dest##*/}
bdir=$dir/.dflash-backups
cd -P -- "$dir" 2>/dev/null || undecided "cannot enter $dir"

# The push's own directory, trusted on write.sh's terms (own_dir.sh).
here=$(stat -c '%d:%i' . 2>/dev/null)
enter_own_dir create
case $? in
2) undecided "cannot create $bdir" ;;
1) undecided "$bdir: $distrust" ;;
esac

take_lock || undecided "$lock_what${lock_err:+: $lock_err}"

hash=
[ ! -f "../$base" ] || hash_of "../$base" 2>/dev/null
mark=./$base.mark.$nonce
state=
left=
read -r state left <"$mark" 2>/dev/null
case $state in
landed | reported)
	echo reported >"$mark" # the caller knows now
	say "verdict landed"
	;;
failed | cancelled)
	say "verdict not-landed"
	;;
going)
	case $left in "$base".dflash-tmp.*) ;; *) undecided "$bdir/$base.mark.$nonce names no temp file" ;; esac
	if [ -e "./$left" ]; then
		rm -f "./$left" # its write was killed before the rename (we hold the lock: it has ended)
		echo failed >"$mark"
		say "verdict not-landed"
	else
		echo reported >"$mark"
		say "verdict landed"
	fi
	;;
'')
	if [ -e "$mark" ]; then
		undecided "$bdir/$base.mark.$nonce cannot be read"
	elif (set -C && echo cancelled >"$mark") 2>/dev/null; then
		say "verdict not-landed"
	else
		undecided "cannot leave $bdir/$base.mark.$nonce"
	fi
	;;
*)
	undecided "$bdir/$base.mark.$nonce holds $state"
	;;
esac
say "sha256 $hash"
