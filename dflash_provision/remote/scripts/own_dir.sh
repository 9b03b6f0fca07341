# The push's own directory, DIR/.dflash-backups: write.sh keeps its lock, scratch and temp files
# and backups there, place.sh its parts, settle.sh reads its marks, backups.sh lists and restores
# from it. Whoever owns DIR can rename anything in DIR and plant names there, but cannot move a
# directory of ours elsewhere (that needs write permission on the directory itself), so from
# inside it ".." is always DIR. It is trusted when it is root's or the login user's, no one else
# may write in it, it is right inside DIR and on DIR's filesystem. One test for every script.

# own_dir_distrust UID MODE DEV:INO PARENT_DEV:INO HERE -- run inside the directory, with one
# stat of it ("%u %a %d:%i") and of its parent ("%d:%i"); HERE is DIR's dev:inode. Sets distrust
# to why it is not to be trusted and returns 1; distrust empty and 0 when it is.
own_dir_distrust() {
	case $2 in *[2367]? | *[2367]) open=1 ;; *) open= ;; esac
	if [ "$1" != 0 ] && [ ! -O . ]; then
		distrust="it is owned by uid $1, neither root nor user $(whoami_text)"
	elif [ -n "$open" ]; then
		distrust="others may write in it (mode $2)"
	elif [ "$4" != "$5" ]; then
		distrust="it is not a directory inside $dir (a symlink to elsewhere?)"
	elif [ "${3%%:*}" != "${5%%:*}" ]; then
		distrust="it is on another filesystem than $dir"
	else
		distrust=
		return 0
	fi
	return 1
}

# enter_own_dir create|existing -- from DIR (its dev:inode in $here) into DIR/.dflash-backups,
# made (mode 0700) when missing and the argument is "create", and checked. Returns 0 inside a
# trusted one; 2 when it could not be made (err: the tool's message); 1 with distrust set.
enter_own_dir() {
	if [ "$1" = create ] && [ ! -d .dflash-backups ]; then
		err=$(mkdir -m 700 .dflash-backups 2>&1) || [ -d .dflash-backups ] || return 2
	fi
	distrust="it cannot be entered"
	cd -P .dflash-backups 2>/dev/null || return 1
	set -- $(stat -c '%u %a %d:%i' . .. 2>/dev/null)
	distrust="it cannot be examined"
	[ $# -eq 6 ] || return 1
	own_dir_distrust "$1" "$2" "$3" "$6" "$here"
}
