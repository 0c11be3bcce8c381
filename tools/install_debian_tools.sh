#!/bin/sh
# Install the Debian packages of the binaries that are missing, and nothing else.
#   tools/install_debian_tools.sh BINARY:PACKAGE ...
#   e.g. tools/install_debian_tools.sh prometheus:prometheus promtool:prometheus wrk:wrk
# Idempotent: when every BINARY is on PATH it does nothing (no apt-get update either).
# Packaged services are not started: the tests run the binaries themselves on free loopback
# ports (a policy-rc.d that refuses service starts is put in place for the install when the
# machine has none, and removed afterwards).
set -eu
missing=""
for pair in "$@"; do
  bin=${pair%%:*}
  pkg=${pair#*:}
  if ! command -v "$bin" >/dev/null 2>&1; then
    case " $missing " in *" $pkg "*) ;; *) missing="$missing $pkg" ;; esac
  fi
done
[ -z "$missing" ] && exit 0

sudo=""
if [ "$(id -u)" -ne 0 ]; then
  command -v sudo >/dev/null 2>&1 || {
    echo "install_debian_tools: need root (or sudo) to apt-get install$missing" >&2; exit 2; }
  sudo=sudo
fi
policy=/usr/sbin/policy-rc.d
if [ ! -e "$policy" ]; then
  printf '#!/bin/sh\nexit 101\n' | $sudo tee "$policy" >/dev/null
  $sudo chmod 755 "$policy"
  trap '$sudo rm -f "$policy"' EXIT
fi
echo "install_debian_tools: apt-get install$missing" >&2
$sudo apt-get update -qq
# shellcheck disable=SC2086  # the package list is meant to split
DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends $missing
