#!/bin/sh
# Starts Snekbox (gunicorn, as upstream's image does) after making the cgroup controllers that
# docker/snekbox/snekbox.cfg limits writable.
#
# NsJail puts every run in a cgroup of its own under the container's (memory: 384 MiB, no swap;
# pids: 64), and Snekbox creates the parent (NSJAIL) at start. A privileged container gets its
# cgroup file systems read-write; any other container gets them read-only, which Snekbox cannot
# start with ("Read-only file system: '/sys/fs/cgroup/memory/NSJAIL'"). With CAP_SYS_ADMIN (the
# least set in compose.yaml) this remounts them read-write: the mounts are the container's own
# subtree of each hierarchy (/docker/<id>), so nothing above the container becomes writable.
# Privileged, the mounts are writable already and nothing is done.
set -eu

remount_rw() {
    [ -d "$1" ] && [ ! -w "$1" ] || return 0
    if ! mount -o remount,bind,rw "$1" 2>/dev/null; then
        echo "snekbox: $1 is read-only and cannot be remounted read-write: the container needs" \
            "CAP_SYS_ADMIN (cap_add: [SYS_ADMIN]) or privileged: true (see compose.yaml)" >&2
        exit 1
    fi
    echo "snekbox: remounted $1 read-write for NsJail's cgroups" >&2
}

if [ -f /sys/fs/cgroup/cgroup.controllers ]; then
    remount_rw /sys/fs/cgroup # cgroup v2: one hierarchy
else
    remount_rw /sys/fs/cgroup/memory
    remount_rw /sys/fs/cgroup/pids
fi
exec gunicorn "$@"
