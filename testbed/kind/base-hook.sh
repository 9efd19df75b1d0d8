#!/usr/bin/env bash
# mmdebstrap customize hook for the kind base image (testbed/kind/images.sh base): what kind's
# images/base/Dockerfile does after its apt installs, on a Debian bookworm root with Debian's own
# containerd, runc and CNI plugins in place of kind's builds of them.
#   base-hook.sh <rootfs> <kind module source dir>
set -euo pipefail
root=$1
files=$2/images/base/files

# kind's own files: the entrypoint, the systemd units for containerd and the kubelet, containerd's
# config, sysctls, /kind/bin. The module cache is read-only: take the content, not the modes.
cp -r --no-preserve=mode,ownership "$files/." "$root/"
rm -rf "$root/LICENSES"
chmod 0755 "$root"/usr/local/bin/* "$root"/kind/bin/* "$root/kind" "$root/kind/bin"

# as kind's Dockerfile: no services but the ones enabled below, no kmsg in journald
rm -f "$root/lib/systemd/system/sysinit.target.wants/systemd-tmpfiles-setup.service" \
  "$root"/lib/systemd/system/multi-user.target.wants/* \
  "$root"/etc/systemd/system/*.wants/* \
  "$root"/lib/systemd/system/local-fs.target.wants/* \
  "$root"/lib/systemd/system/sockets.target.wants/*udev* \
  "$root"/lib/systemd/system/sockets.target.wants/*initctl* \
  "$root"/lib/systemd/system/basic.target.wants/*
echo "ReadKMsg=no" >> "$root/etc/systemd/journald.conf"
[[ -e $root/sbin/init ]] || ln -s /usr/lib/systemd/systemd "$root/sbin/init"

# kind's units and scripts expect containerd in /usr/local/bin and the CNI plugins in /opt/cni/bin;
# Debian installs them in /usr/bin and /usr/lib/cni.
for b in containerd ctr containerd-shim-runc-v2; do ln -sf "/usr/bin/$b" "$root/usr/local/bin/$b"; done
mkdir -p "$root/opt/cni/bin" "$root/etc/kubernetes/manifests"
for p in "$root"/usr/lib/cni/*; do ln -sf "/usr/lib/cni/${p##*/}" "$root/opt/cni/bin/${p##*/}"; done

chroot "$root" systemctl enable kubelet.service containerd.service undo-mount-hacks.service >/dev/null 2>&1
chroot "$root" systemctl mask systemd-binfmt.service >/dev/null 2>&1

# the runtime spec kind's containerd config names (base_runtime_spec), made as kind makes it
chroot "$root" sh -c "ctr oci spec | jq '.hooks.createContainer[.hooks.createContainer| length] |= . + {\"path\": \"/kind/bin/mount-product-files.sh\"}' | jq 'del(.process.rlimits)' > /etc/containerd/cri-base.json"

# The sandbox image is built here (testbed/node/pause.c), not pulled. This VM gives no process
# CAP_SYS_RESOURCE, without which runc cannot lower a container's OOM score below containerd's
# ("can't get final child's PID from pipe: EOF"): containerd clamps it instead, as on the real node.
sed -i -e 's|sandbox_image = .*|sandbox_image = "docker.io/netsense/pause:dev"|' \
  -e 's|restrict_oom_score_adj = false|restrict_oom_score_adj = true|' "$root/etc/containerd/config.toml"
grep -q 'restrict_oom_score_adj = true' "$root/etc/containerd/config.toml"
rm -rf "$root"/var/lib/apt/lists/* "$root"/var/cache/apt/*.bin
