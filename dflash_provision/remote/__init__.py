"""The remote side: short POSIX sh scripts (scripts/*.sh) and the Python that runs and parses them.

See ops.py for the protocol and the result types.
"""
