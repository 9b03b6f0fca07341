# Shared by files.sh and weights.sh (prepended after common.sh): both read files of a drafter
# directory whose resolved path the script sets in $real before calling it.

# inside FILE: true when FILE is no symlink, or one that resolves inside the directory.
inside() {
	[ -L "$1" ] || return 0
	to=$(readlink -f -- "$1" 2>/dev/null) || return 1
	case $to in "$real"/*) return 0 ;; esac
	return 1
}
