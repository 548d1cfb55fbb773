#!/bin/sh
# setup.sh prepares Wine to run kproxy's Windows test binaries (idempotent).
#
# Go 1.22+ programs need bcryptprimitives.dll!ProcessPrng, which Debian 12's
# Wine 8.0 lacks: they die at start with "bcryptprimitives.dll not found".
# This script installs wine64 and the MinGW-w64 binutils if missing (apt-get),
# creates a Wine prefix under <repo>/.build/wine (gitignored), and builds a
# forwarder DLL into its system32: bcryptprimitives.dll exporting
# ProcessPrng = advapi32.SystemFunction036 (RtlGenRandom), which has the same
# signature.
#
# Use exec.sh (beside this file) as the `go test -exec` wrapper afterwards.
set -eu

root=$(git -C "$(dirname "$0")" rev-parse --show-toplevel)
prefix="${WINEPREFIX:-$root/.build/wine}"
build="$root/.build/wine-dll"

say() { echo "wine/setup.sh: $*"; }

apt_install() {
	say "installing $* with apt-get (missing)"
	if [ ! -e /var/lib/apt/lists/lock ] || [ -z "$(ls /var/lib/apt/lists 2>/dev/null | grep -v -e lock -e partial)" ]; then
		apt-get update -qq
	fi
	DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$@" >/dev/null
}

wine_bin() {
	for w in wine64 wine /usr/lib/wine/wine64; do
		if command -v "$w" >/dev/null 2>&1; then
			command -v "$w"
			return 0
		fi
	done
	return 1
}

if ! wine_bin >/dev/null; then
	apt_install wine64
fi
if ! command -v x86_64-w64-mingw32-as >/dev/null 2>&1 || ! command -v x86_64-w64-mingw32-ld >/dev/null 2>&1; then
	apt_install binutils-mingw-w64-x86-64
fi
wine=$(wine_bin) || { say "no wine binary after installing wine64"; exit 1; }

export WINEPREFIX="$prefix" WINEDEBUG=-all WINEARCH=win64
# No display, and no Mono/Gecko installer prompts.
unset DISPLAY WAYLAND_DISPLAY
export WINEDLLOVERRIDES="mscoree,mshtml="

if [ ! -f "$prefix/system.reg" ]; then
	say "creating the Wine prefix $prefix"
	mkdir -p "$prefix"
	"$wine" wineboot --init >/dev/null 2>&1 || true
	wineserver_bin=$(command -v wineserver || echo /usr/lib/wine/wineserver64)
	[ -x "$wineserver_bin" ] && "$wineserver_bin" -w || true
fi
sys32="$prefix/drive_c/windows/system32"
if [ ! -d "$sys32" ]; then
	say "the Wine prefix has no system32 ($sys32)"
	exit 1
fi

dll="$build/bcryptprimitives.dll"
if [ ! -f "$dll" ]; then
	say "building the bcryptprimitives.dll forwarder"
	mkdir -p "$build"
	cat >"$build/bcryptprimitives.def" <<'DEF'
LIBRARY bcryptprimitives.dll
EXPORTS
ProcessPrng = advapi32.SystemFunction036
DEF
	# An empty object: the DLL holds nothing but the forwarded export, and no
	# entry point (-e 0: address 0).
	printf '\t.text\n' >"$build/empty.s"
	x86_64-w64-mingw32-as -o "$build/empty.o" "$build/empty.s"
	x86_64-w64-mingw32-ld -shared -e 0 -o "$dll.tmp" "$build/empty.o" "$build/bcryptprimitives.def"
	mv "$dll.tmp" "$dll"
fi
if ! cmp -s "$dll" "$sys32/bcryptprimitives.dll"; then
	say "installing the forwarder into $sys32"
	cp "$dll" "$sys32/bcryptprimitives.dll"
fi
say "ready: WINEPREFIX=$prefix"
