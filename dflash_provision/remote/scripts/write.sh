# dflash write: replace ONE file atomically with the bytes on stdin, keeping the old one.
#
# Arguments: DEST SIZE SHA256 KEEP_BACKUPS MKDIR(0|1) FOLLOW_SYMLINKS(0|1) LOCK_TIMEOUT_S
# stdin:     exactly SIZE bytes whose sha256 is SHA256.
#
# Steps (the name is what a failure reports):
#   args      check the arguments
#   dir       the destination directory exists (created with MKDIR=1)
#   symlink   a symlinked DEST is refused unless FOLLOW_SYMLINKS=1; then the file it points to
#             is replaced and the link itself is kept (symlinked *directories* are always
#             followed: that is how model dirs are commonly laid out)
#   dest      DEST, if present, is a regular file
#   (if DEST already has SHA256: "result unchanged", nothing is written, no lock needed)
#   lock      flock on <dir>/.dflash-backups/<base>.lock if flock exists, else an mkdir lock
#             (stale when its recorded pid is gone); gives up after LOCK_TIMEOUT_S
#   tmp       create the temp file in the destination dir (same filesystem, so the rename is
#             atomic) exclusively (O_EXCL, never through a symlink), already with the old file's
#             permissions (0644 for a new file): .<base>.dflash-tmp.<pid>, else mktemp
#   write     cat stdin > tmp
#   verify    tmp has SIZE bytes and SHA256 (a connection cut mid-write leaves a short tmp)
#   attrs     chmod (when the mode did not come out right) / chown tmp like the old file
#   fsync     fsync tmp
#   backup    hard link (or copy) the old file to <dir>/.dflash-backups/<base>.<UTC stamp>
#   rename    mv tmp over DEST
#   fsync-dir fsync the directory
#   readback  sha256 of DEST read back from disk must equal SHA256
#   (prune    keep the newest KEEP_BACKUPS backups; never fails the write)
#
# Output lines "key value", then "data" and the OLD file's bytes to EOF (so the caller can show
# a diff without another round trip). On any failure: "failed STEP REASON" and "error MESSAGE",
# the temp file is removed, the old file is left as it was, and the exit status names the step.

dest=$1
want_size=$2
want_sha=$3
keep=$4
do_mkdir=$5
follow=$6
lock_timeout=$7

umask 022
tmp=
lockdir=
renamed=0
backup=
old=missing
stdin_done=0
result=failed

cleanup() {
	if [ -n "$tmp" ] && [ -e "$tmp" ]; then rm -f "$tmp"; fi
	if [ -n "$lockdir" ]; then rm -rf "$lockdir"; fi
}
trap cleanup EXIT
trap 'exit 129' HUP
trap 'exit 130' INT
trap 'exit 141' PIPE
trap 'exit 143' TERM

# Report the outcome, send the old bytes, exit (the EXIT trap cleans up).
finish() {
	say "result $result"
	# Drain unread input so the sender never blocks on a full pipe.
	[ "$stdin_done" = 1 ] || cat >/dev/null 2>&1
	say data
	if [ "$renamed" = 1 ] && [ -n "$backup" ]; then
		cat "$bdir/$backup" 2>/dev/null
		[ "$keep" -gt 0 ] || rm -f "$bdir/$backup"
	elif [ "$old" = present ] && [ "$renamed" = 0 ]; then
		cat "$dest" 2>/dev/null
	fi
	exit "$1"
}

# fail STEP REASON MESSAGE EXIT_STATUS
fail() {
	say "failed $1 $2"
	say "error $(oneline "$3")"
	result=failed
	finish "$4"
}

# fail_tool STEP EXIT_STATUS WHAT TOOL_ERROR: a tool failed to WHAT. A permission problem gets
# one plain sentence (the tool's own text only repeats the path); other errors keep the tool's
# words as evidence.
fail_tool() {
	why=$(reason_of "$4")
	if [ "$why" = permission-denied ]; then
		fail "$1" "$why" "user $(whoami_text) may not $3" "$2"
	fi
	fail "$1" "$why" "cannot $3: $4" "$2"
}

# letters DIGIT: sets $letters to the permissions of one octal digit, for a symbolic umask.
letters() {
	case $1 in
	0) letters= ;;
	1) letters=x ;;
	2) letters=w ;;
	3) letters=wx ;;
	4) letters=r ;;
	5) letters=rx ;;
	6) letters=rw ;;
	*) letters=rwx ;;
	esac
}

# utc_stamp EPOCH: sets $stamp to YYYYmmddTHHMMSSZ (UTC) with shell arithmetic only (the civil
# calendar from a day count, as in H. Hinnant's days_from_civil inverse).
utc_stamp() {
	days=$(($1 / 86400))
	secs=$(($1 % 86400))
	z=$((days + 719468))
	era=$((z / 146097))
	doe=$((z - era * 146097))
	yoe=$(((doe - doe / 1460 + doe / 36524 - doe / 146096) / 365))
	doy=$((doe - (365 * yoe + yoe / 4 - yoe / 100)))
	mp=$(((5 * doy + 2) / 153))
	day=$((doy - (153 * mp + 2) / 5 + 1))
	if [ "$mp" -lt 10 ]; then month=$((mp + 3)); else month=$((mp - 9)); fi
	year=$((yoe + era * 400))
	[ "$month" -gt 2 ] || year=$((year + 1))
	stamp=$year
	for part in "$month" "$day" "$((secs / 3600))" "$((secs % 3600 / 60))" "$((secs % 60))"; do
		[ "$part" -lt 10 ] && part=0$part
		stamp=$stamp$part
	done
	stamp=${stamp%??????}T${stamp#????????}Z
}

say "dflash-write 1"

# --- args -------------------------------------------------------------------------------------
case $want_size in '' | *[!0-9]*) fail args bad-argument "size must be a number" 10 ;; esac
case $keep in '' | *[!0-9]*) fail args bad-argument "keep must be a number" 10 ;; esac
case $lock_timeout in '' | *[!0-9]*) fail args bad-argument "lock timeout must be a number" 10 ;; esac
case $want_sha in *[!0-9a-f]*) fail args bad-argument "sha256 must be lowercase hex" 10 ;; esac
[ ${#want_sha} -eq 64 ] || fail args bad-argument "sha256 must have 64 hex digits" 10
case $dest in /*) ;; *) fail args bad-argument "destination must be an absolute path" 10 ;; esac

dir=${dest%/*}
[ -n "$dir" ] || dir=/
base=${dest##*/}
[ -n "$base" ] || fail args bad-argument "destination must name a file" 10

# --- dir --------------------------------------------------------------------------------------
examine_dir "$dir"
case $dir_state in
ok) ;;
permission-denied) fail dir permission-denied "user $(whoami_text) cannot enter $dir_at" 12 ;;
not-a-directory) fail dir not-a-directory "$dir_at exists but is not a directory" 12 ;;
*)
	[ "$do_mkdir" = 1 ] || fail dir dir-missing "directory $dir does not exist (--mkdir creates it)" 12
	err=$(mkdir -p "$dir" 2>&1) || fail_tool dir 12 "create $dir" "$err"
	say "created-dir 1"
	;;
esac

# --- symlink ----------------------------------------------------------------------------------
if [ -L "$dest" ]; then
	[ "$follow" = 1 ] ||
		fail symlink symlink-refused "$dest is a symlink; refusing to replace it (--follow-symlinks writes the file it points to)" 13
	real=$(readlink -f "$dest" 2>/dev/null)
	[ -n "$real" ] && [ -d "${real%/*}/" ] || fail symlink dangling "$dest is a symlink whose target directory does not exist" 13
	say "followed-symlink 1"
	dest=$real
	dir=${dest%/*}
	[ -n "$dir" ] || dir=/
	base=${dest##*/}
fi
bdir=$dir/.dflash-backups

# --- dest -------------------------------------------------------------------------------------
if [ -e "$dest" ] && [ ! -f "$dest" ]; then
	fail dest not-regular "$dest exists and is not a regular file" 14
fi

# Already right? Then write nothing (and need no lock: the check is a single read).
if [ -f "$dest" ] && hash_of "$dest" 2>/dev/null && [ "$hash" = "$want_sha" ]; then
	old=present
	say "old present"
	say "sha256_after $want_sha"
	result=unchanged
	finish 0
fi

# --- lock -------------------------------------------------------------------------------------
if [ ! -d "$bdir" ]; then
	err=$(mkdir "$bdir" 2>&1) || [ -d "$bdir" ] || fail_tool lock 11 "create $bdir" "$err"
fi
if command -v flock >/dev/null; then
	lockfile=$bdir/$base.lock
	# Probe in a subshell first: a failed redirection on "exec" would end this shell.
	err=$( (: >>"$lockfile") 2>&1) || fail_tool lock 11 "open $lockfile" "$err"
	exec 9>>"$lockfile"
	flock -w "$lock_timeout" 9 ||
		fail lock lock-timeout "another push holds $lockfile (waited ${lock_timeout}s)" 11
	say "lock flock"
else
	waited=0
	until err=$(mkdir "$bdir/$base.lockdir" 2>&1); do
		case $(reason_of "$err") in
		read-only | no-space | permission-denied | not-permitted)
			fail_tool lock 11 "create lock $bdir/$base.lockdir" "$err"
			;;
		esac
		holder=$(cat "$bdir/$base.lockdir/pid" 2>/dev/null)
		if [ -n "$holder" ] && ! kill -0 "$holder" 2>/dev/null; then
			rm -rf "$bdir/$base.lockdir" # its owner is gone
			continue
		fi
		[ "$waited" -lt "$((lock_timeout * 10))" ] ||
			fail lock lock-timeout "another push holds $bdir/$base.lockdir (waited ${lock_timeout}s; remove it if no push is running)" 11
		sleep 0.1 2>/dev/null || sleep 1
		waited=$((waited + 1))
	done
	lockdir=$bdir/$base.lockdir
	echo "$$" >"$lockdir/pid" 2>/dev/null
	say "lock mkdir"
fi

# --- old file (re-checked under the lock) ------------------------------------------------------
old_mode=
old_owner=
if [ -f "$dest" ]; then
	old=present
	stat_and_hash "$dest" '%a %u:%g'
	if [ "$meta" != - ]; then
		old_mode=${meta%% *}
		old_owner=${meta#* }
	fi
	if [ "$hash" = "$want_sha" ]; then
		say "old present"
		say "sha256_after $want_sha"
		result=unchanged
		finish 0
	fi
fi
say "old $old"

# --- tmp --------------------------------------------------------------------------------------
# The shell creates it, exclusively: noclobber opens with O_EXCL, which also refuses a symlink
# planted under that name. The umask gives it the old file's permission bits from the start
# (0644 for a new file), so it is never readable by more users than the old file while it fills
# and usually needs no chmod (bits a umask cannot give, x and set-id, are set in the attrs step).
# Under the lock a file of that name can only be left over from a killed run whose pid came round
# again; for that (and any other failure) mktemp tries a random name before the step fails.
want_mode=${old_mode:-644}
create_mask=u=rw,g=,o=
case $want_mode in
[0-7][0-7][0-7])
	group_digit=${want_mode#?}
	letters "${want_mode%??}"
	create_mask=u=$letters
	letters "${group_digit%?}"
	create_mask=$create_mask,g=$letters
	letters "${want_mode#??}"
	create_mask=$create_mask,o=$letters
	;;
esac
tmp_name=$dir/.$base.dflash-tmp.$$
if err=$( {
	umask "$create_mask" && set -C && true >"$tmp_name"
} 2>&1); then
	tmp=$tmp_name
elif ! tmp=$(mktemp "$dir/.$base.dflash-tmp.XXXXXX" 2>&1); then
	err=$tmp
	tmp=
	fail_tool tmp 15 "create a temp file in $dir" "$err"
fi

# --- write ------------------------------------------------------------------------------------
err=$(cat 2>&1 >"$tmp")
status=$?
stdin_done=1
[ "$status" -eq 0 ] || fail write "$(reason_of "$err")" "writing $tmp failed: $err" 16

# --- verify -----------------------------------------------------------------------------------
# One stat for size, mode, owner and mtime (the backup's timestamp), one sha256sum.
stat_and_hash "$tmp" '%s %a %u:%g %Y'
set -- $meta
if [ "$hash" != "$want_sha" ]; then
	[ "$meta" = - ] || [ "$1" = "$want_size" ] ||
		fail verify short-write "received $1 of $want_size bytes (connection lost mid-write?)" 17
	fail verify hash-mismatch "received bytes do not have the expected sha256" 17
fi
tmp_mode=${2:-}
tmp_owner=${3:-}
tmp_mtime=${4:-}

# --- attrs ------------------------------------------------------------------------------------
if [ "$tmp_mode" != "$want_mode" ]; then
	err=$(chmod "$want_mode" "$tmp" 2>&1) || fail_tool attrs 18 "chmod the new file" "$err"
fi
if [ -n "$old_owner" ] && [ "$old_owner" != "$tmp_owner" ]; then
	err=$(chown "$old_owner" "$tmp" 2>&1) || fail attrs "$(reason_of "$err")" "chown $old_owner failed: $err" 18
fi

# --- fsync ------------------------------------------------------------------------------------
# "sync FILE" fsyncs one file with coreutils >= 8.24 and busybox builds that list FILE in their
# usage; older ones ignore or reject arguments, so fall back to dd conv=fsync, then global sync.
case $(sync --help 2>&1) in
*FILE*) sync_files=1 ;;
*) sync_files=0 ;;
esac
if [ "$sync_files" = 1 ] && sync "$tmp" 2>/dev/null; then
	file_sync=fsync
elif dd if="$tmp" of="$tmp" conv=notrunc,fsync 2>/dev/null; then
	file_sync=fsync
else
	sync
	file_sync=global
fi

# --- backup -----------------------------------------------------------------------------------
if [ "$old" = present ]; then
	# The new file's mtime is "now" on this host's clock (no `date` process); date only when
	# stat could not say.
	case $tmp_mtime in
	'' | *[!0-9]*) stamp=$(date -u +%Y%m%dT%H%M%SZ) ;;
	*) utc_stamp "$tmp_mtime" ;;
	esac
	backup=$base.$stamp
	# Same second as an earlier backup: number it after the highest one still there, so names
	# keep sorting in the order the backups were taken (pruning relies on that order).
	n=0
	for f in "$bdir/$backup".[0-9][0-9][0-9]; do
		[ -e "$f" ] || continue
		m=${f##*.}
		m=${m#0}
		m=${m#0}
		[ "$m" -gt "$n" ] && n=$m
	done
	if [ -e "$bdir/$backup" ] || [ "$n" -gt 0 ]; then
		n=$((n + 1))
		while [ ${#n} -lt 3 ]; do n=0$n; done
		backup=$base.$stamp.$n
	fi
	if ! err=$(ln "$dest" "$bdir/$backup" 2>&1); then
		err=$(cp -p "$dest" "$bdir/$backup" 2>&1) || {
			rm -f "$bdir/$backup"
			backup=
			fail_tool backup 20 "keep a backup of $dest in $bdir" "$err"
		}
	fi
	say "backup $backup"
fi

# --- rename -----------------------------------------------------------------------------------
err=$(mv -f "$tmp" "$dest" 2>&1) || fail_tool rename 21 "rename the new file over $dest" "$err"
renamed=1

# --- fsync-dir --------------------------------------------------------------------------------
if [ "$sync_files" = 1 ] && sync "$dir" 2>/dev/null; then
	dir_sync=fsync
else
	sync
	dir_sync=global
fi
if [ "$file_sync" = fsync ] && [ "$dir_sync" = fsync ]; then
	say "durability fsync-file+dir"
elif [ "$file_sync" = fsync ]; then
	say "durability fsync-file+global-sync"
else
	say "durability global-sync"
fi

# --- readback ---------------------------------------------------------------------------------
hash_of "$dest" 2>/dev/null
say "sha256_after $hash"
[ "$hash" = "$want_sha" ] ||
	fail readback not-applied "write did not take effect: $dest does not have the new sha256 after the rename" 22

# --- prune (best effort) ----------------------------------------------------------------------
limit=$keep
[ "$limit" -gt 0 ] || limit=1 # our own backup is removed after its bytes are sent
count=0
for f in "$bdir"/*; do
	case ${f##*/} in "$base".[0-9]*) [ -f "$f" ] && count=$((count + 1)) ;; esac
done
excess=$((count - limit))
pruned=0
for f in "$bdir"/*; do
	[ "$excess" -gt 0 ] || break
	case ${f##*/} in
	"$base".[0-9]*)
		if [ -f "$f" ] && rm -f "$f"; then
			excess=$((excess - 1))
			pruned=$((pruned + 1))
		fi
		;;
	esac
done
say "pruned $pruned"

result=written
finish 0
