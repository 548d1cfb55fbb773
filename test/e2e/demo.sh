#!/usr/bin/env bash
# make demo: kproxy routing Service traffic through a real kernel, in
# throwaway network namespaces (see test/e2e/demo). Needs root on
# Linux; installs iproute2 and iptables with apt-get when they are missing.
set -euo pipefail
cd "$(dirname "$0")/../.."

if [ "$(uname -s)" != Linux ]; then
	echo "make demo: needs Linux (network namespaces)" >&2
	exit 1
fi
if [ "$(id -u)" -ne 0 ]; then
	echo "make demo: needs root to create network namespaces; run: sudo make demo" >&2
	exit 1
fi

missing=()
command -v ip >/dev/null 2>&1 || missing+=(iproute2)
command -v iptables >/dev/null 2>&1 || missing+=(iptables)
if [ "${#missing[@]}" -gt 0 ]; then
	if ! command -v apt-get >/dev/null 2>&1; then
		echo "make demo: please install ${missing[*]} (no apt-get here)" >&2
		exit 1
	fi
	echo "make demo: installing ${missing[*]} with apt-get (the demo needs them)..."
	apt-get update -qq
	DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
	echo "make demo: installed ${missing[*]}."
fi

GO="${GO:-go}"
if ! command -v "$GO" >/dev/null 2>&1; then
	echo "make demo: needs the Go toolchain (go) to build kproxy" >&2
	exit 1
fi
exec "$GO" run ./test/e2e/demo -manifests docs/examples/demo "$@"
