#!/usr/bin/env bash
# Seconds per round of copies into 64 MiB of mapped pinned memory (bench/mapped_copies.c;
# PAGEABLE=1: unregistered memory, the floor), through Chidori on loopback, emulated
# backend (no GPU). Usage:
#   bash bench/mapped_copies.sh DIST [DIST...]   (a dist: target/dist, or an older one)
exec bash "$(dirname "$0")/emulated.sh" mapped_copies "$@" -- "${ROUNDS:-10}"
