"""Where the authoritative config comes from: the Hub client (pinned to a commit, with its
deadline and integrity checks), the lock file, a local file or a target as a source, the
authority that names the bytes every other stage compares with, and host name lookup with a
deadline."""
