#!/bin/sh
# exec.sh runs a Windows program under Wine: a `go test -exec` wrapper.
#
#   GOOS=windows go test -exec "$PWD/hack/wine/exec.sh" ./...
#
# It uses the prefix that setup.sh prepares (<repo>/.build/wine, or
# $WINEPREFIX), silences Wine's debug output and runs without a display.
set -eu
root=$(git -C "$(dirname "$0")" rev-parse --show-toplevel)
export WINEPREFIX="${WINEPREFIX:-$root/.build/wine}"
export WINEDEBUG=-all WINEARCH=win64 WINEDLLOVERRIDES="mscoree,mshtml="
unset DISPLAY WAYLAND_DISPLAY
if [ ! -f "$WINEPREFIX/drive_c/windows/system32/bcryptprimitives.dll" ]; then
	echo "wine/exec.sh: $WINEPREFIX is not prepared; run $(dirname "$0")/setup.sh first" >&2
	exit 2
fi
for w in wine64 wine /usr/lib/wine/wine64; do
	if command -v "$w" >/dev/null 2>&1; then
		exec "$w" "$@"
	fi
done
echo "wine/exec.sh: wine is not installed; run $(dirname "$0")/setup.sh first" >&2
exit 2
