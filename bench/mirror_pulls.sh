#!/usr/bin/env bash
# Seconds per pull of 64 MiB of mirrored pinned memory of which one byte in four changed
# (bench/mirror_pulls.c; STEP=0x01010101: every byte), through Chidori on loopback,
# emulated backend (no GPU). Usage:
#   bash bench/mirror_pulls.sh DIST [DIST...]   (a dist: target/dist, or an older one)
exec bash "$(dirname "$0")/emulated.sh" mirror_pulls "$@" -- "${ROUNDS:-10}" "${STEP:-25}"
