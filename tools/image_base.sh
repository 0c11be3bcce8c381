#!/bin/sh
# Create the local base image for `make image`: Debian 12 (bookworm) from debootstrap
# --variant=minbase with python3, imported into podman (no container registry is reachable).
#   tools/image_base.sh IMAGE_NAME
# Idempotent: does nothing when IMAGE_NAME exists. The host's CA bundle is copied in and named by
# SSL_CERT_FILE and PIP_CERT so that pip and uv inside the build trust the same roots as the
# host (some networks re-sign TLS). This base is for the local test build only: the
# Containerfile's default runtime stays distroless.
set -eu
name=${1:?usage: tools/image_base.sh IMAGE_NAME}
mirror=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
podman="podman --runtime runc --cgroup-manager cgroupfs"
if $podman image exists "$name"; then
  exit 0
fi
root=$(mktemp -d /tmp/sg-image-base.XXXXXX)
trap 'rm -rf "$root"' EXIT
echo "image_base: debootstrap --variant=minbase bookworm (python3) -> $name" >&2
debootstrap --variant=minbase --include=python3,python3-venv,ca-certificates \
  bookworm "$root" "$mirror" >"$root.log" 2>&1 || { tail -20 "$root.log" >&2; exit 1; }
rm -f "$root.log"
ca=/etc/ssl/certs/host-ca-bundle.crt
cp /etc/ssl/certs/ca-certificates.crt "$root$ca"
rm -rf "$root"/var/cache/apt/archives/*.deb "$root"/var/lib/apt/lists/*
tar -C "$root" -c . | $podman import \
  --change "ENV SSL_CERT_FILE=$ca" --change "ENV PIP_CERT=$ca" \
  --change 'CMD ["/bin/sh"]' - "$name" >/dev/null
echo "image_base: $name ready" >&2
