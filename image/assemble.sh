#!/usr/bin/env bash
# Assembles the image of Clever Karpenter Hub as an OCI image layout, without a container engine:
# the same files where the Dockerfile puts them (both binaries in /usr/local/bin, user 65532, the
# hub as entrypoint with `run`), on a runtime made of Debian 12 packages instead of the distroless
# base (glibc, libgcc, CA certificates, time zones, netbase; no shell, no package manager).
#
#   image/assemble.sh HUB_BINARY WEBHOOK_BINARY OUT_DIR [TAG]
#
# OUT_DIR/oci is the layout (`skopeo copy oci:OUT_DIR/oci:TAG docker://...` pushes it); OUT_DIR
# also keeps the .debs it used and `packages.txt` (name, version, SHA-256 of each). Needs: apt-get
# (Debian 12's sources), dpkg-deb, umoci, strip; root (umoci writes the layer's owners as root).
# operator/tests/suite/image.rs runs it in every CI run and checks the result against the
# Dockerfile; docs/install.md, "The image", says how big it is.
set -euo pipefail

if [ $# -lt 3 ]; then
  echo "usage: $0 HUB_BINARY WEBHOOK_BINARY OUT_DIR [TAG]" >&2
  exit 2
fi
hub=$1 webhook=$2 out=$3 tag=${4:-latest}
for b in "$hub" "$webhook"; do
  [ -x "$b" ] || { echo "$0: $b is not an executable file" >&2; exit 2; }
done
for tool in apt-get dpkg-deb umoci strip; do
  command -v "$tool" >/dev/null || { echo "$0: $tool is missing (apt-get install umoci binutils)" >&2; exit 2; }
done
here=$(cd "$(dirname "$0")/.." && pwd)
version=$(sed -n 's/^version = "\(.*\)"/\1/p' "$here/Cargo.toml" | head -1)

rm -rf "$out" && mkdir -p "$out/debs" "$out/rootfs"
out=$(cd "$out" && pwd)

# The runtime's packages, at the versions Debian 12's sources offer today (recorded below).
packages=(libc6 libgcc-s1 ca-certificates tzdata netbase)
# apt downloads as its own user where that user may write (else it warns and downloads as root).
chown _apt "$out/debs" 2>/dev/null || true
(cd "$out/debs" && apt-get download -qq "${packages[@]}")
: > "$out/packages.txt"
for deb in "$out"/debs/*.deb; do
  dpkg-deb -x "$deb" "$out/rootfs"
  printf '%s %s %s\n' "$(dpkg-deb -f "$deb" Package)" "$(dpkg-deb -f "$deb" Version)" \
    "$(sha256sum "$deb" | cut -d' ' -f1)" >> "$out/packages.txt"
done
root=$out/rootfs
# What the packages' maintainer scripts would do, and what a runtime image has: the CA bundle
# (update-ca-certificates concatenates the certificates the package ships), the users, /tmp.
mkdir -p "$root/etc/ssl/certs" "$root/tmp" "$root/home/nonroot" "$root/usr/local/bin"
find "$root/usr/share/ca-certificates" -name '*.crt' -print0 | sort -z | xargs -0 cat > "$root/etc/ssl/certs/ca-certificates.crt"
printf 'root:x:0:0:root:/root:/sbin/nologin\nnonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n' > "$root/etc/passwd"
printf 'root:x:0:\nnonroot:x:65532:\n' > "$root/etc/group"
chmod 1777 "$root/tmp"
chown 65532:65532 "$root/home/nonroot"
# Documentation, manuals and the packages' scripts are of no use at run time.
rm -rf "$root/usr/share/doc" "$root/usr/share/man" "$root/usr/share/lintian" "$root/usr/sbin/update-ca-certificates"
# The binaries, where the Dockerfile puts them, without their symbols.
install -m 0755 "$hub" "$root/usr/local/bin/karpenter-hub"
install -m 0755 "$webhook" "$root/usr/local/bin/karpenter-hub-webhook"
strip "$root/usr/local/bin/karpenter-hub" "$root/usr/local/bin/karpenter-hub-webhook"

# The OCI layout: one layer, then the Dockerfile's user, entrypoint, command and labels.
layout=$out/oci
umoci init --layout "$layout"
umoci new --image "$layout:$tag"
umoci unpack --image "$layout:$tag" "$out/bundle"
cp -a "$root/." "$out/bundle/rootfs/"
umoci repack --image "$layout:$tag" "$out/bundle"
rm -rf "$out/bundle"
source_url=https://github.com/clever-karpenter-hub/clever-karpenter-hub
umoci config --image "$layout:$tag" \
  --os linux --architecture amd64 \
  --config.user 65532:65532 \
  --config.entrypoint /usr/local/bin/karpenter-hub --config.cmd run \
  --config.label "org.opencontainers.image.title=Clever Karpenter Hub" \
  --config.label "org.opencontainers.image.description=One Karpenter for a fleet of Clever Kubernetes Engine clusters: karpenter-hub and karpenter-hub-webhook" \
  --config.label "org.opencontainers.image.version=$version" \
  --config.label "org.opencontainers.image.licenses=Apache-2.0" \
  --config.label "org.opencontainers.image.source=$source_url" \
  --config.label "org.opencontainers.image.url=$source_url"
umoci gc --layout "$layout"
echo "$0: $layout:$tag, $(du -sb "$layout/blobs" | cut -f1) bytes of blobs"
