#!/usr/bin/env bash
# Refreshes the headers the BPF programs compile against from this machine's
# Debian packages (linux-libc-dev: the kernel UAPI; libbpf-dev: libbpf's BPF
# helpers), so `make generate` never reads the host's /usr/include and builds
# byte-identical objects on every machine. Run it after changing the list
# below or to move to newer headers, then `make generate` and commit both.
#
# The closure of what the listed headers include is copied with the
# multiarch asm/ directory flattened to asm/ (BPF programs are built for
# bpfel on x86-64 hosts' UAPI, as before).
set -euo pipefail
cd "$(dirname "$0")"
HEADERS=(
	bpf/bpf_helpers.h bpf/bpf_endian.h bpf/bpf_core_read.h
	linux/bpf.h linux/types.h linux/in.h linux/in6.h linux/if_ether.h linux/if_packet.h
	linux/ip.h linux/ipv6.h linux/tcp.h linux/udp.h linux/icmpv6.h
	linux/pkt_cls.h linux/if_xdp.h
)
multiarch=$(gcc -print-multiarch 2>/dev/null || echo x86_64-linux-gnu)
probe=$(mktemp --suffix=.c)
trap 'rm -f "$probe"' EXIT
for h in "${HEADERS[@]}"; do echo "#include <$h>"; done >"$probe"
deps=$(clang -target bpf -M -nostdinc -I/usr/include/"$multiarch" -I/usr/include "$probe" |
	tr ' \\' '\n\n' | grep '^/usr/include/' | sort -u)
find . -mindepth 1 -maxdepth 1 -type d -exec rm -rf {} +
for f in $deps; do
	rel=${f#/usr/include/}
	rel=${rel#"$multiarch"/}
	mkdir -p "$(dirname "$rel")"
	cp "$f" "$rel"
done
{
	echo "# Copied by update.sh from these Debian packages:"
	dpkg-query -W -f '${Package} ${Version}\n' linux-libc-dev libbpf-dev
} >VERSIONS
echo "copied $(echo "$deps" | wc -l) headers"
