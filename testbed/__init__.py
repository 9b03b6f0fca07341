"""Throwaway local infrastructure (Hub stand-in, sshd fleet, LXC containers) for demos and tests."""
