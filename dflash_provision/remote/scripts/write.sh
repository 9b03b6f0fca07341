# dflash write: replace ONE file atomically with the bytes on stdin, keeping the old one, and
# read it back: the whole write-and-prove protocol in one exec.
#
# Arguments: DEST SIZE SHA256 KEEP_BACKUPS MKDIR(0|1) FOLLOW_SYMLINKS(0|1) LOCK_TIMEOUT_S
#            [STAMP [DEADLINE_S [NONCE [READABLE(0|1)]]]]
#            STAMP: YYYYmmddTHHMMSSZ, the caller's UTC time, for the backup's name.
#            DEADLINE_S: after so many seconds (0: never) a watchdog ends the script and what it
#            started, and the traps remove the temp file and the lock (see start_watchdog).
#            NONCE: [0-9a-f]{24,64}, its first 8 digits the caller's clock (hex epoch seconds):
#            names this write in the mark it leaves for settle.sh, so that a caller cut off
#            before the result arrived can learn what happened (see "mark" below).
#            READABLE=1: a DEST this login cannot read is refused (step dest, permission-denied)
#            before anything is created: a file that cannot be judged is not replaced (repair
#            writes without reading first: fleet/repairing.py).
# stdin:     exactly SIZE bytes whose sha256 is SHA256.
#
# Steps (the name is what a failure reports):
#   args      check the arguments
#   dir       the destination directory exists (created with MKDIR=1)
#   symlink   a symlinked DEST is refused unless FOLLOW_SYMLINKS=1; then the file it points to
#             is replaced and the link itself is kept (symlinked *directories* are always
#             followed: that is how model dirs are commonly laid out)
#   dest      DEST, if present, is a regular file; if it already has SHA256 (same size, then
#             same hash): "result unchanged", and nothing is written, locked or created
#   trust     <dir>/.dflash-backups, the push's own directory (created 0700), must be a
#             directory owned by root or by us, writable by no one else, right inside the
#             destination directory (not a symlink to elsewhere) and on its filesystem. Every
#             name the write creates (lock, temp file, backups, marks) lives
#             there, and the script works from inside it (cd), so the destination directory's
#             owner, who may be someone else, can plant nothing on the way (see README "Trust
#             model")
#   lock      flock on .dflash-backups/<base>.lock if flock exists, else an mkdir lock (stale
#             when its recorded pid is gone or now names another process: pid + start time +
#             boot id); gives up after LOCK_TIMEOUT_S. Held until the script ends, read-back
#             included: no other push can come between this rename and its proof
#   tmp       mktemp the temp file in .dflash-backups (same filesystem, so the rename is
#             atomic), exclusively (O_EXCL), mode 0600: <base>.dflash-tmp.XXXXXX
#   attrs     chown the still empty temp file like the old file; after the write, chmod it to
#             the old file's mode (0644 for a new file)
#   write     stdin > tmp with dd conv=fsync: the bytes and their fsync in one process
#   verify    tmp has SHA256 (a connection cut mid-write leaves a short tmp); the same
#             sha256sum hashes the old file under the lock (written meanwhile by someone else
#             with SHA256: "result unchanged", nothing is replaced); a DEST that was missing
#             before the lock and is there now (another write created it) is such an old file
#   backup    hard link (or copy) the old file to <dir>/.dflash-backups/<base>.<UTC stamp>
#   rename    (the mark first, see below: refused when settle.sh already left one for this
#             NONCE, i.e. the caller reported this write as not done) mv -T tmp over DEST
#             (rename(2): a link planted at DEST is replaced, never followed); a temp file
#             still there afterwards means the rename did not happen ("readback": the write did
#             not take effect)
#   fsync-dir fsync the directory
#   (prune    keep the newest KEEP_BACKUPS backups, remove marks no caller needs any more and
#             temp files a killed write left (we hold the lock: no live write owns them), in
#             one rm; never fails the write)
#   read-back DEST read again by the path the caller gave, after the rename and the fsyncs,
#             as any reader (vLLM) opens it; the old bytes follow, from the backup
#
# Mark (one file per write that goes for its rename, in .dflash-backups, written by shell
# redirections: no process): <base>.mark.NONCE, created exclusively right before the rename
# holding "going TMPNAME", then "landed" after it (or "failed"), then "reported" once the
# script's whole answer was handed to the caller. settle.sh reads it for a caller whose
# connection was lost, frozen or interrupted; when there is none it creates it, holding
# "cancelled", and a write still on its way then finds its name taken and refuses to rename. A
# "going" mark is one whose write was killed (SIGKILL) mid-rename: its temp file still there
# says the rename did not happen. Later writes remove reported and failed marks, and any mark
# a day older than their own NONCE.
#
# Output lines "key value", then the bytes as framed parts: one line "part NAME LENGTH" for
# each, then "data", then the parts' bytes in that order and nothing after them (see send_parts;
# remote/ops.py parses it strictly, and a reply that does not add up is reported as cut off or
# malformed, never split by guessing). After a rename: "readback", DEST's bytes as read back by
# the caller's path, and "old", the OLD file's (from its backup); for an unchanged file,
# "readback", its bytes as read now; after a failure before the rename, "old", the old file's
# bytes, to show what the host holds. Each part is at most max_bytes + 1 bytes ("old_size" says
# how many the old file had when the script looked). The caller compares the read-back with
# what it sent (a mismatch is read again, described). On any failure: "failed STEP REASON" and
# "error MESSAGE", the temp file is removed, the old file is left as it was, and the exit status
# names the step.
#
# Cost: a drifted file costs sh, the watchdog (a subshell and its sleep), two stats (the
# destination directory and the old file; the push's own directory and its parent), flock,
# mktemp, dd, chmod, sha256sum, ln, mv, sync, wc (the parts' lengths) and head (the read-back and
# the old bytes in one), plus one rm when there is something to prune (the mark of the write
# before, mostly) and, for the first push into a directory, mkdir; an unchanged one a stat,
# sha256sum (when the size matches), wc and head.

dest=$1
asked=$1 # the path as the caller gave it: what the read-back opens, as a reader would
want_size=$2
want_sha=$3
keep=$4
do_mkdir=$5
follow=$6
lock_timeout=$7
stamp=${8:-}
deadline=${9:-0}
nonce=${10:-}
readable=${11:-0}

umask 022
tmp=
lockdir=
file= # DEST as seen from the current directory (set once the script has cd'ed in)
renamed=0
mark=     # this write's mark, once created (see "Mark")
renaming= # set right before mv: from then on the temp file's absence means it was renamed
backup=
old=missing
stdin_done=0
result=failed

# On the way out, whatever ended the script: a rename that happened is recorded as such in the
# mark, one that did not is recorded as failed, and the temp file and the lock go.
cleanup() {
	if [ -n "$tmp" ] && [ -e "$tmp" ]; then
		[ -z "$mark" ] || echo failed >"$mark"
		rm -f "$tmp"
	elif [ -n "$renaming" ] && [ "$renamed" = 0 ]; then
		renamed=1 # ended right after mv (a signal's trap runs once it returns)
		[ -z "$mark" ] || echo landed >"$mark"
	fi
	if [ -n "$lockdir" ]; then rm -rf "$lockdir"; fi
	# Last: with the caller gone, this write ends the shell by SIGPIPE.
	flush
}
trap cleanup EXIT
trap 'exit 129' HUP
trap 'exit 130' INT
trap 'exit 141' PIPE
trap 'ended 143' TERM

# Ended by a signal (the watchdog's, at the deadline): say so, unless the new file is in place.
# A trap runs only once the command in progress has returned, so a TERM during mv lands here
# after the rename: the temp file being gone tells.
ended() {
	if [ -n "$renaming" ] && [ "$renamed" = 0 ] && [ ! -e "$tmp" ]; then
		renamed=1
		tmp=
		[ -z "$mark" ] || echo landed >"$mark"
	fi
	if [ "$renamed" = 0 ]; then
		say "failed deadline interrupted"
		say "error the remote command was ended by a signal before the new file was in place (its ${deadline}s deadline passed?)"
	fi
	exit "$1"
}

# Report the outcome, send the bytes (see "Output"), exit (the EXIT trap cleans up).
finish() {
	status=$1
	say "result $result"
	# Drain unread input so the sender never blocks on a full pipe. Input that fits in the
	# least a pipe holds (one page; a config is ~2 KB) cannot block it, and is not waited for:
	# the caller sends it only once the exec request is answered, so it reaches the host a
	# round trip after this script started, and a cat reading it to its end would hold the
	# answer of an unchanged file (or a refusal) for that round trip.
	[ "$stdin_done" = 1 ] || [ "$want_size" -le 4096 ] 2>/dev/null || cat >/dev/null 2>&1
	if [ "$result" = unchanged ]; then
		send_parts readback "$asked"
	elif [ "$renamed" = 1 ]; then
		# The read-back, then the old bytes. Once they are handed over, the caller knows: the
		# mark may go (a head ended by SIGPIPE did not hand them over).
		if [ -n "$backup" ]; then
			send_parts readback "$asked" old "./$backup"
		else
			send_parts readback "$asked"
		fi && { [ -z "$mark" ] || echo reported >"$mark"; }
		[ "$keep" -gt 0 ] || [ -z "$backup" ] || rm -f "./$backup"
	elif [ "$old" = present ] && [ -n "$file" ] && [ ! -L "$file" ]; then
		send_parts old "$file"
	else
		send_parts
	fi
	exit "$status"
}

# send_parts [NAME FILE [NAME FILE]]: the files' bytes as the reply's framed parts: a line
# "part NAME LENGTH" for each, "data", then the bytes (at most max_bytes + 1 of each file) in
# one head, and nothing after them. The lengths are measured (one wc for all) right before the
# bytes are sent: a file that changes size in between makes the reply not add up (a single
# part is cut at its length: it then holds other bytes), and the caller then takes none of its
# bytes and reads the file again. A file that cannot be measured is left out: its part is
# missing.
send_parts() {
	sizes=
	if [ $# -gt 0 ]; then
		sizes=$(wc -c -- "$2" ${4:+"$4"} 2>/dev/null) || sizes=
	fi
	sent=
	while [ $# -ge 2 ]; do
		if [ -n "$sizes" ]; then
			size=${sizes%%"$nl"*}
			sizes=${sizes#*"$nl"}
		else
			size=$(wc -c <"$2" 2>/dev/null) || size=
		fi
		size=${size#"${size%%[! ]*}"}
		size=${size%% *}
		case $size in '' | *[!0-9]*) ;; *)
			[ "$size" -le "$max_bytes" ] || size=$((max_bytes + 1))
			say "part $1 $size"
			sent=$sent${sent:+$nl}$2
			sent_size=$size
			;;
		esac
		shift 2
	done
	say data
	flush
	[ -n "$sent" ] || return 0
	if [ "$sent" = "${sent%"$nl"*}" ]; then
		# One part: exactly the length declared (a file grown since is cut there).
		head -c "$sent_size" -- "$sent" 2>/dev/null
	else
		head -q -c $((max_bytes + 1)) -- "${sent%%"$nl"*}" "${sent#*"$nl"}" 2>/dev/null
	fi
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

# digits STAMP: sets $digits to YYYYmmddTHHMMSSZ as one number (YYYYmmddHHMMSS), to compare.
digits() {
	digits=${1%Z}
	digits=${digits%T*}${digits#*T}
}

say "dflash-write 1"
start_watchdog

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
# Following a link writes wherever its owner points it: only a link made by root or by us is
# followed (stat without -L describes the link itself). Asked by the path given, then again by
# the name inside the pinned directory (below): a link planted in between is refused too.
refuse_link() {
	[ "$follow" = 1 ] || fail symlink symlink-refused "$dest is a symlink; refusing to replace it (--follow-symlinks writes the file it points to)" 13
}
if [ -L "$dest" ]; then
	refuse_link
	link_owner=$(stat -c %u "$dest" 2>/dev/null)
	[ "$link_owner" = 0 ] || [ "$link_owner" = "$(id -u)" ] ||
		fail symlink untrusted-link "$dest is a symlink owned by uid $link_owner, neither root nor user $(whoami_text): refusing to follow it" 13
	real=$(readlink -f "$dest" 2>/dev/null)
	[ -n "$real" ] && [ -d "${real%/*}/" ] || fail symlink dangling "$dest is a symlink whose target directory does not exist" 13
	say "followed-symlink 1"
	dest=$real
	dir=${dest%/*}
	[ -n "$dir" ] || dir=/
	base=${dest##*/}
fi
bdir=$dir/.dflash-backups

# --- pin the directory ------------------------------------------------------------------------
# From here on every name is relative to the directory the script is in: once entered, a
# directory stays the same one whatever is renamed or linked on the way to it.
cd -P -- "$dir" 2>/dev/null || fail dir permission-denied "user $(whoami_text) cannot enter $dir" 12
file=./$base

# --- dest -------------------------------------------------------------------------------------
if [ -e "$file" ] && [ ! -f "$file" ]; then
	fail dest not-regular "$dest exists and is not a regular file" 14
fi
[ ! -L "$file" ] || refuse_link
if [ "$readable" = 1 ] && [ -f "$file" ] && [ ! -r "$file" ]; then
	fail dest permission-denied "user $(whoami_text) may not read $dest: a file that cannot be judged is not replaced" 14
fi

# This directory and the old file, from here. The first line is the identity of this
# directory, which the push's own directory must be right inside (see trust).
set -- $(stat -c '%d:%i %s %a %u:%g' . "$file" 2>/dev/null)
here=${1:-}
old_size=${6:-}
old_mode=${7:-}
old_owner=${8:-}

# Already right? Then write nothing, and need no lock, no backup dir, no temp file (so a
# read-only directory holding the right file is fine). A file of another size cannot be right,
# so the common drifted case costs the one stat above and no hashing; the stat also gave the
# mode and owner the new file gets.
if [ -f "$file" ]; then
	old=present
	if { [ -z "$old_size" ] || [ "$old_size" = "$want_size" ]; } &&
		hash_of "$file" 2>/dev/null && [ "$hash" = "$want_sha" ]; then
		say "old present"
		say "old_sha256 $hash"
		say "sha256_after $want_sha"
		result=unchanged
		finish 0
	fi
else
	old_size=
	old_mode=
	old_owner=
fi
say "old $old"
[ -z "$old_size" ] || say "old_size $old_size"

# --- trust ------------------------------------------------------------------------------------
# The push's own directory (own_dir.sh).
enter_own_dir create
case $? in
2) fail_tool lock 11 "create $bdir" "$err" ;;
1)
	# Back to the destination directory by the path we were given, to report from there.
	if cd -P -- "$dir" 2>/dev/null; then file=./$base; else file=; fi
	fail trust unsafe-dir "refusing $bdir: $distrust; another user could plant links in it to make this push write, delete or read files elsewhere (remove it: the next push creates its own, mode 0700)" 19
	;;
esac
file=../$base

# --- lock -------------------------------------------------------------------------------------
if ! take_lock; then
	[ "$lock_why" = lock-timeout ] || fail_tool lock 11 "$lock_what" "$lock_err"
	fail lock lock-timeout "$lock_what" 11
fi
say "lock $lock_method"

# --- tmp ------------------------------------------------------------------------------------
# mktemp creates it exclusively (O_EXCL) in the push's own directory, mode 0600: while it fills
# it is open to no one but its owner, never more than the old file. `stat -c %a` drops leading
# zero digits (044 is "44"): pad them back for the chmod after the write.
want_mode=${old_mode:-644}
while [ ${#want_mode} -lt 3 ]; do want_mode=0$want_mode; done
if ! tmp=$(mktemp "./$base.dflash-tmp.XXXXXX" 2>&1); then
	err=$tmp
	tmp=
	fail_tool tmp 15 "create a temp file in $bdir" "$err"
fi

# --- attrs ------------------------------------------------------------------------------------
# Before any byte is in the temp file: the owner. A file we own, in our group, needs nothing (the
# shell tests that without a process); any other gets the old owner, and when that chown is
# refused (not root) it only fails the write if the temp file's owner really differs (a setgid
# directory gives both files its group). The mode is set after the write (a chown clears set-id
# bits, and a mode without the owner's w would refuse the write itself).
if [ -n "$old_owner" ] && ! { [ -O "$file" ] && [ -G "$file" ]; }; then
	if ! err=$(chown "$old_owner" "$tmp" 2>&1); then
		[ "$(stat -c %u:%g "$tmp" 2>/dev/null)" = "$old_owner" ] ||
			fail attrs "$(reason_of "$err")" "chown $old_owner failed: $err" 18
	fi
fi

# --- write ------------------------------------------------------------------------------------
# dd writes and fsyncs in one process. A dd without conv=fsync fails before reading anything
# (the temp file is still empty): then cat writes it and `sync` follows, globally if `sync FILE`
# is not understood.
file_sync=fsync
if ! err=$(dd of="$tmp" bs=65536 conv=fsync 2>&1); then
	err=${err%%"$nl"*} # the error; dd's statistics follow it
	why=$(reason_of "$err")
	if [ "$why" != error ] || [ -s "$tmp" ]; then
		fail write "$why" "writing $tmp failed: $err" 16
	fi
	err=$(cat 2>&1 >"$tmp") || fail write "$(reason_of "$err")" "writing $tmp failed: $err" 16
	if ! sync "$tmp" 2>/dev/null; then
		sync
		file_sync=global
	fi
fi
stdin_done=1
err=$(chmod "$want_mode" "$tmp" 2>&1) || fail_tool attrs 18 "chmod the new file" "$err"

# --- verify -----------------------------------------------------------------------------------
# One sha256sum for the temp file and the old one (as it is now, under the lock; its hash goes
# into the history), in that order. GNU sha256sum marks a line whose name it had to escape with
# a leading backslash.
hash=
old_hash=
# A file that was missing when this write looked may have been created while it waited for the
# lock (two repairs of one missing file): then only the first created it, and this one is judged
# against that file like any other old file (unchanged when it holds these bytes, else backed up
# and replaced), so that the caller does not report "created" twice.
if [ "$old" = missing ] && [ -f "$file" ] && [ ! -L "$file" ]; then
	old=present
	say "old present"
	old_size=$(stat -c %s "$file" 2>/dev/null) && say "old_size $old_size"
fi
if [ "$old" = present ]; then
	sums=$(sha256sum "$tmp" "$file" 2>/dev/null)
else
	sums=$(sha256sum "$tmp" 2>/dev/null)
fi
# Each line's first word (the names are not split: they may hold any character).
hash=${sums%%[ $nl]*}
case $sums in *"$nl"*)
	old_hash=${sums#*"$nl"}
	old_hash=${old_hash%%[ $nl]*}
	;;
esac
hash=${hash#\\}
old_hash=${old_hash#\\}
if [ "$hash" != "$want_sha" ]; then
	size=$(stat -c %s "$tmp" 2>/dev/null)
	[ -z "$size" ] || [ "$size" = "$want_size" ] ||
		fail verify short-write "received $size of $want_size bytes (connection lost mid-write?)" 17
	fail verify hash-mismatch "received bytes do not have the expected sha256" 17
fi
[ -z "$old_hash" ] || say "old_sha256 $old_hash"
# Someone else wrote these very bytes while we waited for the lock.
if [ "$old_hash" = "$want_sha" ]; then
	say "sha256_after $want_sha"
	result=unchanged
	finish 0
fi

# --- backup -----------------------------------------------------------------------------------
if [ "$old" = present ]; then
	# Named after STAMP (the caller's UTC time, so it matches the history) or this host's
	# clock; never before the newest backup already there (another controller's clock may be
	# ahead), and numbered within one second, so names keep sorting in the order the backups
	# were taken (pruning relies on that order).
	case $stamp in
	[0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9]T[0-9][0-9][0-9][0-9][0-9][0-9]Z) ;;
	*) stamp=$(date -u +%Y%m%dT%H%M%SZ) ;;
	esac
	newest=
	for f in "./$base".[0-9]*; do
		[ -e "$f" ] || continue
		f=${f#"./$base".}
		case $f in
		[0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9]T[0-9][0-9][0-9][0-9][0-9][0-9]Z*) newest=${f%%Z*}Z ;;
		esac
	done
	if [ -n "$newest" ]; then
		digits "$stamp"
		ours=$digits
		digits "$newest"
		[ "$digits" -le "$ours" ] || stamp=$newest
	fi
	backup=$base.$stamp
	n=0
	for f in "./$backup".[0-9][0-9][0-9]; do
		[ -e "$f" ] || continue
		m=${f##*.}
		m=${m#0}
		m=${m#0}
		[ "$m" -gt "$n" ] && n=$m
	done
	if [ -e "./$backup" ] || [ "$n" -gt 0 ]; then
		n=$((n + 1))
		while [ ${#n} -lt 3 ]; do n=0$n; done
		backup=$base.$stamp.$n
	fi
	# A hard link keeps the very file that is being replaced (a link planted there in the
	# meantime is linked as a link, never followed; rollback refuses such a backup).
	if ! err=$(ln "$file" "./$backup" 2>&1); then
		err=$(cp -P -p "$file" "./$backup" 2>&1) || {
			rm -f "./$backup"
			backup=
			fail_tool backup 20 "keep a backup of $dest in $bdir" "$err"
		}
	fi
	# With --keep-backups 0 it only carries the old bytes to the caller and goes once they are
	# sent: not a backup to name.
	[ "$keep" -eq 0 ] || say "backup $backup"
fi

# --- rename -----------------------------------------------------------------------------------
# The mark first (see "Mark"), created exclusively (noclobber: O_EXCL): a name already taken is
# settle.sh's "cancelled" (the caller already reported this write as not done), and the write
# stops here, under the lock, before anything is replaced.
case $nonce in '' | *[!0-9a-f]*) nonce= ;; esac
if [ -n "$nonce" ]; then
	set -C
	if ! echo "going ${tmp#./}" 2>/dev/null >"./$base.mark.$nonce"; then
		set +C
		state=
		read -r state _ <"./$base.mark.$nonce" 2>/dev/null
		[ "$state" != cancelled ] ||
			fail rename cancelled "the push was already reported as not done (its connection was lost before this step)" 23
		# Ours, half written (a full disk?): it can only say that this write failed, and why
		# (written again by dd, which names the error: the shell's echo may say only "I/O
		# error").
		if err=$(echo failed | dd of="./$base.mark.$nonce" 2>&1); then
			err="it could not be written, then could"
		fi
		err=${err%%"$nl"*}
		[ ! -e "./$base.mark.$nonce" ] || echo failed 2>/dev/null >"./$base.mark.$nonce"
		fail rename "$(reason_of "$err")" "cannot record this write in $bdir/$base.mark.$nonce: ${err:-disk full?}" 21
	fi
	set +C
	mark=./$base.mark.$nonce
fi
# -T: a directory (or a link to one) planted at DEST is an error, not a place to move into. A
# failure that left no temp file behind renamed it nonetheless.
renaming=1
if ! err=$(mv -f -T "$tmp" "$file" 2>&1) && [ -e "$tmp" ]; then
	fail_tool rename 21 "rename the new file over $dest" "$err"
fi
if [ -e "$tmp" ]; then
	# mv said yes and did nothing: the old file is still there (under our lock).
	say "sha256_after ${old_hash:-none}"
	fail readback not-applied "write did not take effect: $dest was not replaced by the new file (mv reported success)" 22
fi
renamed=1
tmp=
[ -z "$mark" ] || echo landed >"$mark"
say "sha256_after $want_sha"

# --- fsync-dir --------------------------------------------------------------------------------
# "sync DIR" fsyncs the directory with coreutils >= 8.24 and busybox >= 1.24. Older coreutils
# print "ignoring all arguments" and sync everything; others reject the argument: both are a
# global sync, and reported as one.
if err=$(sync .. 2>&1) && [ -z "$err" ]; then
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

# --- prune (best effort) ----------------------------------------------------------------------
# stale_mark FILE NONCE: whether another write's mark can go. A write that reported, or failed,
# needs none (a settle that finds no mark says "not landed", which is then the truth); any
# other goes a day after the time in its NONCE, by this write's clock (its own NONCE).
stale_mark() {
	case $2 in '' | *[!0-9a-f]*) return 0 ;; esac
	state=
	read -r state _ <"$1" 2>/dev/null
	case $state in reported | failed) return 0 ;; esac
	[ ${#2} -ge 8 ] && [ ${#now} -eq 8 ] || return 1
	[ $((0x$now - 0x${2%"${2#????????}"})) -gt 86400 ]
}
limit=$keep
[ "$limit" -gt 0 ] || limit=1 # our own backup is removed after its bytes are sent
now=${nonce%"${nonce#????????}"}
count=0
for f in ./*; do
	case ${f##*/} in
	"$base".[0-9]*) [ -f "$f" ] && count=$((count + 1)) ;;
	esac
done
excess=$((count - limit))
pruned=0
# The oldest names sort first.
set --
for f in ./*; do
	name=${f##*/}
	case $name in
	"$base".[0-9]*)
		[ "$pruned" -lt "$excess" ] && [ -f "$f" ] || continue
		set -- "$@" "$f"
		pruned=$((pruned + 1))
		;;
	"$base".mark.*)
		[ "$f" != "$mark" ] && stale_mark "$f" "${name#"$base".mark.}" && set -- "$@" "$f"
		;;
	# A killed write's temp file (we hold the lock: no live write owns one), the evidence files
	# of the versions before the mark and the scratch file of those before 2026-12-06.
	"$base".dflash-tmp.* | "$base".out | "$base".writer | "$base".landed.* | "$base".cancel.*)
		set -- "$@" "$f"
		;;
	esac
done
[ $# -eq 0 ] || rm -f "$@" || pruned=0
say "pruned $pruned"

result=written
finish 0
