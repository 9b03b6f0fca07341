# Shared helpers, prepended to every dflash script. POSIX sh only: runs under dash, bash and
# busybox ash, with coreutils or busybox applets (no python, no bash, no GNU-only options).
# Every variable part arrives as a positional argument; nothing is ever interpolated into code.

LC_ALL=C
export LC_ALL

say() {
	printf '%s\n' "$*"
}

# A message on one line: protocol lines are newline-delimited.
oneline() {
	printf '%s' "$1" | tr '\n\r' '  '
}

# Map an error message from a tool to a stable reason token.
reason_of() {
	case $1 in
	*"No space left"*) echo no-space ;;
	*"Read-only file system"*) echo read-only ;;
	*"Permission denied"*) echo permission-denied ;;
	*"Operation not permitted"*) echo not-permitted ;;
	*"No such file"*) echo missing ;;
	*"Disk quota"*) echo quota ;;
	*) echo error ;;
	esac
}

# The first 64 characters of sha256sum's output (coreutils prints "HEX  -", busybox the same).
sha256_of() {
	sha256sum <"$1" | cut -c1-64
}

size_of() {
	wc -c <"$1" | tr -d ' \t'
}
