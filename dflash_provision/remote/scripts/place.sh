# dflash place: one chunk of one pinned file put in place (push --all-files), in ONE exec.
# The file is written beside its final name, in the push's own directory DIR/.dflash-backups
# (as write.sh: created 0700, checked before use), as NAME.dflash-part; the last chunk fsyncs
# it, proves its hash on the host and renames it over DIR/NAME (mv -T: a planted link at the
# name is replaced, never followed), then fsyncs the directory. A reader never sees a part.
# An interrupted placement leaves the part: the next one asks its size (OFFSET -1) and goes on.
# Arguments: DIR NAME SIZE ALGO DIGEST OFFSET END LAST LOCK_TIMEOUT DEADLINE_S
#   OFFSET -1: only report the part's size; else stdin holds the bytes OFFSET..END of the file
#   (OFFSET 0 starts a new part), LAST 1 when END is SIZE.
# Output lines:
#   dflash-place 1
#   part SIZE                  (OFFSET -1: the bytes a part holds, 0 when there is none)
#   appended END
#   mode MODE FROM             (LAST: the placed file's mode, octal, and whose it is: replaced,
#                              config.json or default)
#   placed NAME                (LAST: hash proved, renamed, directory fsynced)
#   sync fsync|global          (how the file and the directory were made durable)
#   error STEP REASON MESSAGE  (dir trust lock part write hash rename)

dir=$1
base=$2
size=$3
algo=$4
digest=$5
offset=$6
end=$7
last=$8
lock_timeout=$9
deadline=${10:-0}
bdir=$dir/.dflash-backups
lockdir=
# A new part is readable by all (0644), as the Hub's files are, whatever the login's umask (the
# server may run as another user); the last chunk gives it the mode the directory's owner chose
# (see "mode" below).
umask 022

say "dflash-place 1"
trap 'flush; [ -z "$lockdir" ] || rm -rf "$lockdir"' EXIT
start_watchdog

fail() {
	say "error $1 $2 $(oneline "$3")"
	exit 1
}

examine_dir "$dir"
[ "$dir_state" = ok ] || fail dir "$dir_state" "$dir_at: $dir_state"
case $base in */* | . | .. | '') fail dir bad-name "not a file name: $base" ;; esac
cd -P -- "$dir" 2>/dev/null || fail dir permission-denied "cannot enter $dir"
here=$(stat -c '%d:%i' . 2>/dev/null) || fail dir error "cannot examine $dir"

# --- trust: the push's own directory (own_dir.sh) -------------------------------------------
enter_own_dir create
case $? in
2) fail dir "$(reason_of "$err")" "cannot create $bdir: $err" ;;
1) fail trust unsafe-dir "refusing $bdir: $distrust; another user could plant links in it (remove it: the next push creates its own, mode 0700)" ;;
esac

# --- lock (lock.sh): one placement of NAME at a time -------------------------------------------
base=$base.place
if ! take_lock; then
	fail lock "$lock_why" "$lock_what${lock_err:+: $lock_err}"
fi
base=${base%.place}
part=./$base.dflash-part

part_size() {
	if [ -L "$part" ] || { [ -e "$part" ] && [ ! -f "$part" ]; }; then
		rm -rf -- "$part" # not ours to keep: only this script makes parts, as regular files
	fi
	have=$(stat -c %s -- "$part" 2>/dev/null) || have=0
}

if [ "$offset" = -1 ]; then
	part_size
	say "part $have"
	exit 0
fi

# --- write ----------------------------------------------------------------------------------
if [ "$offset" = 0 ]; then
	rm -f -- "$part"
	set -C
	err=$( { : >"$part"; } 2>&1) || fail part "$(reason_of "$err")" "cannot create $bdir/$base.dflash-part: $err"
	set +C
fi
part_size
[ "$have" = "$offset" ] || fail part resume-mismatch "$bdir/$base.dflash-part holds $have bytes, not $offset"
err=$(cat 2>&1 >>"$part") || fail write "$(reason_of "$err")" "writing $bdir/$base.dflash-part failed: $err"
part_size
[ "$have" = "$end" ] || fail write short "$bdir/$base.dflash-part holds $have bytes after the write, not $end"
say "appended $end"
[ "$last" = 1 ] || exit 0

# --- last chunk: durable, proved, renamed ----------------------------------------------------
synced=fsync
sync -- "$part" 2>/dev/null || {
	sync
	synced=global
}
case $algo in
sha256) got=$(sha256sum <"$part") ;;
git-blob-sha1) got=$({
	printf 'blob %s\0' "$size"
	cat <"$part"
} | sha1sum) ;;
*) got= ;;
esac
got=${got%% *}
if [ "$got" != "$digest" ]; then
	rm -f -- "$part"
	fail hash mismatch "$base: $algo ${got:-?} on the host, pinned $digest (the part was removed)"
fi
# The mode of the regular file it replaces (a directory kept 0640 for a service group stays
# so; a link is not followed for it), else config.json's, else 0644. Permission bits only:
# a set-id or sticky bit is not carried onto a weight file.
mode= mode_from=default
if [ -f "../$base" ] && [ ! -L "../$base" ]; then
	mode=$(stat -c %a -- "../$base" 2>/dev/null) && mode_from=replaced
elif [ -f ../config.json ] && [ ! -L ../config.json ]; then
	mode=$(stat -c %a -- ../config.json 2>/dev/null) && mode_from=config.json
fi
case $mode in '' | *[!0-7]*) mode=644 mode_from=default ;; esac
mode=$(printf '%o' $((0$mode & 0777)))
err=$(chmod "$mode" "$part" 2>&1) || fail rename "$(reason_of "$err")" "cannot set mode $mode on $bdir/$base.dflash-part: $err"
say "mode $mode $mode_from"
err=$(mv -f -T -- "$part" "../$base" 2>&1) || fail rename "$(reason_of "$err")" "cannot rename onto $dir/$base: $err"
if ! sync -- .. 2>/dev/null; then
	sync
	synced=global
fi
say "placed $base"
say "sync $synced"
