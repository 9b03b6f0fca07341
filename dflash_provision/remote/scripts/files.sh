# dflash files: every file a lock pins, checked where it lies, in ONE exec (verify --all-files,
# audit --all-files). Nothing but these lines travels: never a file's bytes.
# Arguments: DIR DEADLINE_S MAX_PRESENT
# stdin: one line per pinned file, "SIZE ALGO TRUSTED NAME": ALGO sha256 (the content's) or
# git-blob-sha1 (sha1 of "blob SIZE\0" and the content: git's blob id); TRUSTED the identity
# DEV:INO:SIZE:MTIME:CTIME a recorded proof hashed, or - (NAME: no slash, no line break).
# Output lines:
#   dflash-files 1
#   dir ok|missing|permission-denied|not-a-directory
#   clock SECONDS                      (the host's clock when the checks began)
#   hashing NAME                       (sent before each hash: a deadline that ends the script
#                                       mid-hash leaves the name of the file it was hashing)
#   f STATE SIZE IDENT CLOCK HASH NAME (one per pinned file; "-" for what does not apply)
#       STATE: missing symlink-outside not-regular unreadable size (another size: not hashed)
#              same (the identity is TRUSTED: not hashed) hashed (HASH, begun at CLOCK)
#              changed (the identity changed while it was hashed) hash-failed
#              timeout (not hashed: the deadline was too near to begin)
#   present NAME                       (each top-level name vLLM could read, at most MAX_PRESENT)
#   present-odd                        (one such name holding a line break: it cannot be sent)
#   too-many-present
#   done
# Trust: the directory may belong to another user. A symlink is followed only when it resolves
# inside the directory (as weights.sh: out of it is refused, the trust model's rule for
# config.json); only regular files are hashed; the watchdog ends a hash at the deadline.

dir=$1
deadline=${2:-0}
max_present=${3:-1000}
cr=$(printf '\r')

say "dflash-files 1"
start_watchdog
examine_dir "$dir"
say "dir $dir_state"
if [ "$dir_state" != ok ]; then
	say done
	exit 0
fi
real=$(cd -P -- "$dir" && pwd -P) || real=$dir

started=$(date +%s)
say "clock $started"
flush
case $deadline in '' | *[!0-9]*) deadline=0 ;; esac

while read -r size algo trusted name; do
	[ -n "$name" ] || continue
	f=$dir/$name
	if [ ! -e "$f" ] && [ ! -L "$f" ]; then
		say "f missing - - - - $name"
		continue
	fi
	if ! inside "$f"; then
		say "f symlink-outside - - - - $name"
		continue
	fi
	if [ ! -f "$f" ]; then
		say "f not-regular - - - - $name"
		continue
	fi
	if [ ! -r "$f" ]; then
		say "f unreadable - - - - $name"
		continue
	fi
	ident=$(stat -L -c '%d:%i:%s:%Y:%Z' -- "$f" 2>/dev/null) || ident=
	if [ -z "$ident" ]; then
		say "f unreadable - - - - $name"
		continue
	fi
	rest=${ident#*:*:}
	have=${rest%%:*}
	if [ "$have" != "$size" ]; then
		say "f size $have $ident - - $name"
		continue
	fi
	if [ "$ident" = "$trusted" ]; then
		say "f same $have $ident - - $name"
		continue
	fi
	now=$(date +%s)
	if [ "$deadline" -gt 0 ] && [ $((now - started + 1)) -ge "$deadline" ]; then
		say "f timeout $have $ident - - $name"
		continue
	fi
	say "hashing $name"
	flush
	case $algo in
	sha256) hash=$(sha256sum <"$f") || hash= ;;
	git-blob-sha1) hash=$({
		printf 'blob %s\0' "$size"
		cat <"$f"
	} | sha1sum) || hash= ;;
	*) hash= ;;
	esac
	hash=${hash%% *}
	if [ -z "$hash" ]; then
		say "f hash-failed $have $ident - - $name"
		continue
	fi
	after=$(stat -L -c '%d:%i:%s:%Y:%Z' -- "$f" 2>/dev/null) || after=
	if [ "$after" != "$ident" ]; then
		say "f changed $have $ident - - $name"
		continue
	fi
	say "f hashed $have $ident $now $hash $name"
	flush
done

count=0
for p in "$dir"/*; do
	[ -e "$p" ] || [ -L "$p" ] || continue
	n=${p##*/}
	case $n in
	*"$nl"* | *"$cr"*)
		case $n in *.safetensors | *.bin | *.pt) say present-odd ;; esac
		continue
		;;
	esac
	case $n in
	*.safetensors | *.bin | *.pt | config.json | generation_config.json | hf_quant_config.json | \
		model.safetensors.index.json) ;;
	*) continue ;;
	esac
	count=$((count + 1))
	if [ "$count" -gt "$max_present" ]; then
		say too-many-present
		break
	fi
	say "present $n"
done
say done
