"""Where the authoritative config comes from: the Hub client (pinned to a commit, with its
deadline and integrity checks), the lock file, a local file, and the authority that names the
bytes every other stage compares with. A target as a SOURCE is read by the commands that take
one (cli/_sources.py): reading a host is not this floor's job."""
