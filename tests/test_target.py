"""Target spec grammar: what parses to what, and what is refused with a one-line UsageError."""

from __future__ import annotations

import os

import pytest

from dflash_provision.errors import ExitCode, UsageError
from dflash_provision.target import (
    ContainerRef,
    Target,
    make_target,
    parse_container_ref,
    parse_target,
)

# spec -> (host, user, port, container, path)
VALID = {
    "/root/models/X": (None, None, None, None, "/root/models/X"),
    "/root/models/X/": (None, None, None, None, "/root/models/X"),
    "/srv/m/config.json": (None, None, None, None, "/srv/m/config.json"),
    "gpu1:/root/models/X": ("gpu1", None, None, None, "/root/models/X"),
    "root@gpu1:/root/models/X": ("gpu1", "root", None, None, "/root/models/X"),
    "ops@10.0.0.5:/m/x.json": ("10.0.0.5", "ops", None, None, "/m/x.json"),
    "root@[fd00::5]:/models/X": ("fd00::5", "root", None, None, "/models/X"),
    "[::1]:/m": ("::1", None, None, None, "/m"),
    "ssh://gpu1/root/m": ("gpu1", None, None, None, "/root/m"),
    "ssh://ops@gpu1:2222/root/m": ("gpu1", "ops", 2222, None, "/root/m"),
    "ssh://[fe80::1%eth0]:22/m": ("fe80::1%eth0", None, 22, None, "/m"),
    "ssh://user@host:2222/pct:101:/path": (
        "host",
        "user",
        2222,
        ContainerRef("pct", "101"),
        "/path",
    ),
    "ssh://h/lxc:c1:/p": ("h", None, None, ContainerRef("lxc", "c1"), "/p"),
    "pve1/pct:101:/root/models/X": (
        "pve1",
        None,
        None,
        ContainerRef("pct", "101"),
        "/root/models/X",
    ),
    "root@gpu1/lxc:c1.a_b-2:/m": ("gpu1", "root", None, ContainerRef("lxc", "c1.a_b-2"), "/m"),
    "h/incus:web-1:/m": ("h", None, None, ContainerRef("incus", "web-1"), "/m"),
    "h/lxd:web:/m": ("h", None, None, ContainerRef("lxd", "web"), "/m"),
    "root@[::1]/lxc:c1:/m": ("::1", "root", None, ContainerRef("lxc", "c1"), "/m"),
    "lxc:c1:/models/X": (None, None, None, ContainerRef("lxc", "c1"), "/models/X"),
    "pct:999999999:/m": (None, None, None, ContainerRef("pct", "999999999"), "/m"),
    "docker:vllm-1.a_b:/models/X": (
        None,
        None,
        None,
        ContainerRef("docker", "vllm-1.a_b"),
        "/models/X",
    ),
    "root@gpu1/docker:vllm:/m": ("gpu1", "root", None, ContainerRef("docker", "vllm"), "/m"),
    "ssh://gpu1:2222/docker:3f2a9c1d0b7e:/m": (
        "gpu1",
        None,
        2222,
        ContainerRef("docker", "3f2a9c1d0b7e"),
        "/m",
    ),
    "gpu1/podman:vllm:/m": ("gpu1", None, None, ContainerRef("podman", "vllm"), "/m"),
    "podman:v1:/m": (None, None, None, ContainerRef("podman", "v1"), "/m"),
    # As with lxc: a host called "docker".
    "docker:/models/X": ("docker", None, None, None, "/models/X"),
    # A host literally called "lxc": the part after the colon is a path, not a container name.
    "lxc:/models/X": ("lxc", None, None, None, "/models/X"),
    # Hostile but legal path characters stay in the path, untouched.
    "h:/m/$(touch /tmp/x); rm -rf 'a b'/\"q\"": (
        "h",
        None,
        None,
        None,
        "/m/$(touch /tmp/x); rm -rf 'a b'/\"q\"",
    ),
    "h:/a@b/c:d": ("h", None, None, None, "/a@b/c:d"),
}


@pytest.mark.parametrize("spec", list(VALID))
def test_valid_spec_parses_into_its_parts(spec: str) -> None:
    target = parse_target(spec)
    assert (target.host, target.user, target.port, target.container, target.path) == VALID[spec]
    assert target.raw == spec


@pytest.mark.parametrize("spec", list(VALID))
def test_display_is_a_spec_that_parses_back_to_the_same_target(spec: str) -> None:
    target = parse_target(spec)
    again = parse_target(target.display())
    assert (again.host, again.user, again.port, again.container, again.path) == (
        target.host,
        target.user,
        target.port,
        target.container,
        target.path,
    )


@pytest.mark.parametrize("spec", list(VALID))
def test_a_target_made_from_its_fields_is_the_one_its_spec_parses_to(spec: str) -> None:
    # Inventories give the fields; no spec is rendered for them and parsed back.
    parsed = parse_target(spec)
    made = make_target(parsed.host, parsed.user, parsed.port, parsed.container, parsed.path)
    assert made == Target(parsed.display(), *VALID[spec])


@pytest.mark.parametrize(
    ("fields", "words"),
    [
        (("root@gpu1", None, None, None, "/m"), "'root@gpu1' is not a valid host name"),
        (("gpu1", "a b", None, None, "/m"), "'a b' is not a valid user name"),
        (("gpu1", None, 70000, None, "/m"), "port must be 1..65535"),
        (("gpu1", None, None, ContainerRef("pct", "abc"), "/m"), "numeric VMID"),
        (("gpu1", None, None, None, "m"), "the path must be absolute"),
    ],
)
def test_a_field_a_spec_could_not_hold_is_refused(fields: tuple, words: str) -> None:
    with pytest.raises(UsageError, match=words):
        make_target(*fields)


def test_container_ref_from_kind_and_name() -> None:
    assert parse_container_ref("pct:101") == ContainerRef("pct", "101")
    for text in ("lxc", "vm:c1", "lxc:/x", "lxc:a:b"):
        with pytest.raises(UsageError, match="expected KIND:NAME"):
            parse_container_ref(text)


def test_relative_local_path_is_made_absolute_against_the_current_directory() -> None:
    target = parse_target("./models/X")
    assert target.host is None
    assert target.path == os.path.join(os.getcwd(), "models/X")


@pytest.mark.parametrize(
    ("spec", "config_path", "is_file"),
    [
        ("h:/root/models/X", "/root/models/X/config.json", False),
        ("h:/root/models/X/", "/root/models/X/config.json", False),
        ("h:/root/models/X/config.json", "/root/models/X/config.json", True),
        ("h:/root/models/X/drafter.json", "/root/models/X/drafter.json", True),
        ("h:/root/models/X.json.d", "/root/models/X.json.d/config.json", False),
        ("h:/", "/config.json", False),
    ],
)
def test_config_path_is_decided_from_the_spec_alone(
    spec: str, config_path: str, is_file: bool
) -> None:
    target = parse_target(spec)
    assert target.config_path == config_path
    assert target.is_file is is_file


@pytest.mark.parametrize(
    ("spec", "words"),
    [
        ("", "empty"),
        ("   ", "empty"),
        ("models/X", "neither an absolute path"),
        ("gpu1:models/X", "absolute"),
        ("gpu1:~/models/X", "absolute"),
        ("gpu1:", "empty path"),
        (":/root/m", "empty host"),
        ("@gpu1:/m", "user name"),
        ("-oProxyCommand=x:/m", "host name"),
        ("gpu 1:/m", "host name"),
        ("us er@h:/m", "user name"),
        ("h:/m\nrm -rf /", "line break"),
        ("h:/m\x00x", "NUL"),
        ("h:/m\r", "line break"),
        ("ssh://h", "absolute path"),
        ("ssh://h:0/m", "port"),
        ("ssh://h:65536/m", "port"),
        ("ssh://h:22x/m", "port"),
        ("ssh://:22/m", "empty host"),
        ("ssh://[::1/m", "']'"),
        ("[::1:/m", "']'"),
        ("[nothex]:/m", "IPv6"),
        ("h/pct:abc:/m", "VMID"),
        ("h/pct:99:/m", "VMID"),
        ("h/pct:0101:/m", "VMID"),
        ("h/pct:101;reboot:/m", "VMID"),
        ("h/lxc:-c1:/m", "LXC container name"),
        ("h/lxc:c 1:/m", "LXC container name"),
        ("lxc:$(id):/m", "LXC container name"),
        ("lxc:c1;id:/m", "LXC container name"),
        ("h/incus:web_1:/m", "incus instance name"),
        ("h/docker:v:/m", "docker container name or ID"),
        ("h/docker:-v:/m", "docker container name or ID"),
        ("docker:$(id):/m", "docker container name or ID"),
        ("docker:v 1:/m", "docker container name or ID"),
        ("h/podman:_v:/m", "podman container name or ID"),
        ("h/incus:1web:/m", "incus instance name"),
        ("h/lxd:web-:/m", "lxd instance name"),
        ("h/kvm:c1:/m", "KIND:NAME:/path"),
        ("h/lxc:c1:rel", "absolute"),
        ("h/lxc::/m", "KIND:NAME:/path"),
        ("h:/m/..", "directory or a .json file"),
        # A port as scp would have it: how to give one, not "the path must be absolute".
        ("gpu1:2222:/root/models/X", "give it as ssh://gpu1:2222/root/models/X"),
        ("ops@gpu1:2222/m", "give it as ssh://ops@gpu1:2222/m"),
    ],
)
def test_bad_spec_is_refused_with_one_line_usage_error(spec: str, words: str) -> None:
    with pytest.raises(UsageError) as caught:
        parse_target(spec)
    message = caught.value.message
    assert words in message
    assert "\n" not in message and "\x00" not in message
    assert caught.value.exit_code == ExitCode.USAGE


def test_target_is_frozen_and_hashable() -> None:
    target = parse_target("root@gpu1:/m")
    assert isinstance(target, Target)
    assert {target, parse_target("root@gpu1:/m")} == {target}
    with pytest.raises(AttributeError):
        target.path = "/other"  # type: ignore[misc]


def test_machine_names_where_commands_run() -> None:
    assert parse_target("/m").machine == "local"
    assert parse_target("ssh://ops@h:2222/pct:101:/m").machine == "ops@h:2222"
    assert parse_target("root@[::1]:/m").machine == "root@[::1]"


def test_display_of_container_target_uses_host_slash_kind_form() -> None:
    assert parse_target("root@pve1/pct:101:/m/").display() == "root@pve1/pct:101:/m"
    assert parse_target("ssh://pve1:2222/pct:101:/m").display() == "ssh://pve1:2222/pct:101:/m"
    assert parse_target("lxc:c1:/m").display() == "lxc:c1:/m"
