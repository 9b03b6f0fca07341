# dflash settle: what became of a write (write.sh) whose result never reached its caller (the
# connection was lost, the host froze past the timeout, the user pressed Ctrl-C), decided from
# the evidence the write leaves in <dir>/.dflash-backups, on a fresh connection.
#
# Arguments: DEST NONCE SHA256 LOCK_TIMEOUT_S FOLLOW_SYMLINKS(0|1) [MODE]
#            NONCE: the one the write was given; SHA256: the bytes it was sending.
#            MODE settle (default): take the push's lock first, so that the write has ended (or
#            not yet started its rename: then it never will, see below).
#            MODE probe: only "writer", read under the lock too, and nothing created (for a
#            write that did report, whose read-back found other bytes: replaced by a later
#            write, or not taking effect?).
#
# Output lines:
#   verdict landed       the write's rename happened: its mark <base>.landed.NONCE was there
#                        (removed now), or it was the last writer and DEST holds its bytes
#   verdict not-landed   it did not happen and never will: <base>.cancel.NONCE is left, and a
#                        write still on its way refuses to rename when it finds it
#   verdict unknown      could not tell (the reason follows as "error ...")
#   writer NONCE         the last write that went for its rename (empty: none recorded)
#   sha256 HEX           what DEST holds now, under the lock (empty: no regular file)

dest=$1
nonce=$2
want_sha=$3
lock_timeout=$4
follow=$5
mode=${6:-settle}
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

if [ "$mode" = probe ] && [ ! -d .dflash-backups ]; then
	say "writer "
	exit 0
fi

# The push's own directory, trusted on the same terms as write.sh's (see its "trust" step).
if [ ! -d .dflash-backups ]; then
	mkdir -m 700 .dflash-backups 2>/dev/null || [ -d .dflash-backups ] || undecided "cannot create $bdir"
fi
cd -P .dflash-backups 2>/dev/null || undecided "cannot enter $bdir"
set -- $(stat -c '%u %a' . 2>/dev/null)
[ $# -eq 2 ] || undecided "cannot examine $bdir"
[ "$1" = 0 ] || [ -O . ] || undecided "$bdir is owned by uid $1"
case $2 in *[2367]? | *[2367]) undecided "others may write in $bdir (mode $2)" ;; esac

# Under the lock even for a probe: a write rewrites the record (truncate, then write) under it.
take_lock || undecided "$lock_what${lock_err:+: $lock_err}"

writer=
read -r writer <"./$base.writer" 2>/dev/null
if [ "$mode" = probe ]; then
	say "writer $writer"
	exit 0
fi
hash=
[ ! -f "../$base" ] || hash_of "../$base" 2>/dev/null
if [ -e "./$base.landed.$nonce" ]; then
	rm -f "./$base.landed.$nonce"
	say "verdict landed"
elif [ "$writer" = "$nonce" ] && [ "$hash" = "$want_sha" ]; then
	say "verdict landed"
elif (set -C && : >"./$base.cancel.$nonce") 2>/dev/null || [ -e "./$base.cancel.$nonce" ]; then
	say "verdict not-landed"
else
	undecided "cannot leave $bdir/$base.cancel.$nonce"
fi
say "writer $writer"
say "sha256 $hash"
