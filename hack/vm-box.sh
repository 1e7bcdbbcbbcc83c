#!/usr/bin/env bash
# Builds the VM lab's Vagrant box locally, for vagrant-libvirt, with no
# network inside the VMs: debootstrap Debian bookworm from the Debian mirror
# with the runtime Waggle needs (containerd, runc, iptables, conntrack)
# already installed, a vagrant user with Vagrant's public insecure key, a
# raw disk with one MBR partition, GRUB's boot and core images written
# straight to the disk (this host's kernel has no MSDOS partition support:
# `losetup -P` finds no partition, so the partition is an offset loop device
# and grub-install cannot be used), then qcow2 and a .box that `vagrant box
# add` registers.
#
#   hack/vm-box.sh WORKDIR BOXNAME     (as root; WORKDIR is removed after)
set -euo pipefail
work=${1:?usage: vm-box.sh WORKDIR BOXNAME}
name=${2:?usage: vm-box.sh WORKDIR BOXNAME}
mirror=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
size_gb=4
rootfs=$work/rootfs
mkdir -p "$work"
loop=""
cleanup() {
	mountpoint -q "$work/mnt" && umount "$work/mnt"
	[ -n "$loop" ] && losetup -d "$loop"
	return 0
}
trap cleanup EXIT

if [ ! -x "$rootfs/usr/bin/containerd" ]; then
	debootstrap --variant=minbase \
		--include=systemd-sysv,udev,openssh-server,linux-image-amd64,sudo,rsync,containerd,runc,iptables,iproute2,conntrack,nftables,dbus,kmod,ifupdown,isc-dhcp-client,procps,netbase \
		bookworm "$rootfs" "$mirror"
fi

# The guest: DHCP on every NIC Vagrant does not configure itself (it writes
# systemd-networkd files for its private networks), sshd, the vagrant user.
cat >"$rootfs/etc/systemd/network/99-dhcp.network" <<'EOF'
[Match]
Name=eth*
[Network]
DHCP=ipv4
EOF
chroot "$rootfs" systemctl enable systemd-networkd ssh containerd >/dev/null 2>&1
echo "vagrant-box" >"$rootfs/etc/hostname"
# An empty machine-id: each VM makes its own at first boot, so each gets its
# own DHCP lease (the DUID comes from it).
: >"$rootfs/etc/machine-id"
rm -f "$rootfs/var/lib/dbus/machine-id"
chroot "$rootfs" id vagrant >/dev/null 2>&1 || chroot "$rootfs" useradd -m -s /bin/bash vagrant
echo 'vagrant:vagrant' | chroot "$rootfs" chpasswd
echo 'vagrant ALL=(ALL) NOPASSWD: ALL' >"$rootfs/etc/sudoers.d/vagrant"
chmod 0440 "$rootfs/etc/sudoers.d/vagrant"
install -d -m 0700 -o 1000 -g 1000 "$rootfs/home/vagrant/.ssh"
# Vagrant's public insecure key (vagrant replaces it with a fresh key pair
# at the first `vagrant up`).
install -m 0600 -o 1000 -g 1000 /usr/share/vagrant/keys/vagrant.pub "$rootfs/home/vagrant/.ssh/authorized_keys" 2>/dev/null ||
	install -m 0600 -o 1000 -g 1000 "$(find / -path '*/vagrant*/keys/vagrant.pub' -print -quit 2>/dev/null)" "$rootfs/home/vagrant/.ssh/authorized_keys"
echo 'UseDNS no' >"$rootfs/etc/ssh/sshd_config.d/vagrant.conf"
echo '/dev/vda1 / ext4 errors=remount-ro 0 1' >"$rootfs/etc/fstab"
rm -f "$rootfs"/etc/ssh/ssh_host_*
# Host keys made at boot, before sshd.
cat >"$rootfs/etc/systemd/system/ssh-hostkeys.service" <<'EOF'
[Unit]
Description=SSH host keys
Before=ssh.service
ConditionPathExists=!/etc/ssh/ssh_host_ed25519_key
[Service]
Type=oneshot
ExecStart=/usr/bin/ssh-keygen -A
[Install]
WantedBy=multi-user.target
EOF
chroot "$rootfs" systemctl enable ssh-hostkeys >/dev/null 2>&1
chroot "$rootfs" apt-get clean

# The disk: one partition from 1 MiB, ext4, the root file system copied in.
img=$work/box.img
rm -f "$img"
truncate -s ${size_gb}G "$img"
echo 'start=2048, type=83, bootable' | sfdisk -q "$img"
loop=$(losetup -f --show -o $((2048 * 512)) --sizelimit $(((size_gb * 1024 - 1) * 1024 * 1024)) "$img")
mkfs.ext4 -q -L root "$loop"
mkdir -p "$work/mnt"
mount "$loop" "$work/mnt"
cp -a "$rootfs/." "$work/mnt/"
kernel=$(basename "$(ls "$work"/mnt/boot/vmlinuz-* | tail -1)")
initrd=$(basename "$(ls "$work"/mnt/boot/initrd.img-* | tail -1)")
install -d "$work/mnt/boot/grub"
cat >"$work/mnt/boot/grub/grub.cfg" <<EOF
set timeout=0
menuentry debian {
	linux /boot/$kernel root=/dev/vda1 ro console=ttyS0 net.ifnames=0 biosdevname=0
	initrd /boot/$initrd
}
EOF
umount "$work/mnt"
losetup -d "$loop"
loop=""
# GRUB: boot.img in the MBR's code area (the partition table stays), the
# core image (which finds /boot/grub on the first partition) right after it.
grub-mkimage -O i386-pc -o "$work/core.img" -p '(hd0,msdos1)/boot/grub' biosdisk part_msdos ext2 normal linux configfile
dd if=/usr/lib/grub/i386-pc/boot.img of="$img" bs=440 count=1 conv=notrunc status=none
dd if="$work/core.img" of="$img" bs=512 seek=1 conv=notrunc status=none

qemu-img convert -O qcow2 "$img" "$work/box.img.qcow2"
mv "$work/box.img.qcow2" "$work/box.img"
cat >"$work/metadata.json" <<EOF
{"provider": "libvirt", "format": "qcow2", "virtual_size": $size_gb}
EOF
tar -C "$work" -cf "$work/$name.box" metadata.json box.img
vagrant box add --force --name "$name" "$work/$name.box"
rm -f "$work/box.img" "$work/$name.box" "$work/core.img"
