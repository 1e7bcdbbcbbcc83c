#!/usr/bin/env bash
# Builds the container images the conformance suite's specs run, without Docker or a registry,
# as OCI archives named exactly as the suite's image manifest (k8s.io/kubernetes
# test/utils/image/manifest.go of the version in ../go.mod) names them. Every node of the lab
# imports the archives at start (waggle kubelet --image-dir), so no spec pulls.
#
#   images.sh WAGGLE OUT_DIR
#
# WAGGLE is the waggle binary (its `images build` packs the trees); OUT_DIR receives one
# <name>.tar per image. An archive already in OUT_DIR is kept: OUT_DIR is keyed by the suite's
# version and this script's hash by the caller (run.sh), so a change to either rebuilds.
#
# What the upstream images are and what these are instead (the suite checks behaviour, not bytes):
#   agnhost    upstream: Alpine + the agnhost program + curl, dig, nc, iproute2, ...
#              here:     Debian's busybox-static (sh, nc, wget, nslookup, ip, ...) + agnhost built
#                        from k8s.io/kubernetes/test/images/agnhost (CGO_ENABLED=0); the same
#                        users, /uploads, porter's certificate and the agnhost-2 link. Not here:
#                        iperf, socat, coredns and the fake registry's content.
#              Also curl and nc as upstream's (Debian's curl and netcat-openbsd, with the libraries
#              they load): the network specs' clients run `curl ...`, `nc -v -z -w 2 ...` and
#              `nc -u ...`, which busybox's nc does not take (the shell, bash, finds them in PATH).
#              Also dig (Debian's bind9-dnsutils, as upstream's bind-tools) and getent (libc-bin),
#              which the DNS specs' probers run.
#   busybox    upstream: busybox 1.37 (glibc), everything busybox, /bin/sh its ash;  here: the same:
#              busybox 1.37.0 built from its release tarball (static, glibc, defconfig), with its
#              applet links and /bin/sh -> busybox. Not Debian's busybox-static: Debian reverts
#              upstream's change that passes environment variables whose names are not shell names
#              (the env specs' "data-1") through ash, which is why the base below takes bash; and
#              the read-only root file system spec wants ash's own message, "/bin/sh: can't create
#              /file: Read-only file system", word for word.
#   glibc-dns-testing  upstream: Debian bookworm-slim + dnsutils (+ an unused coredns);  here: the
#              busybox base + Debian's bind9-dnsutils and libc-bin (dig, getent on glibc).
#   kitten, nautilus   upstream: agnhost + html/<animal>.jpg and html/data.json, CMD test-webserver;
#              here: the same files (from the suite's module) on this agnhost, and an
#              /etc/os-release naming upstream's base, Alpine 3.21 (agnhost's BASEIMAGE): the
#              ImageVolume spec mounts kitten as a volume and reads that file for "Alpine Linux".
#              The busybox base has no os-release of its own; the rest is still Debian's.
#   nonewprivs upstream: Alpine + nnp (prints its effective uid) installed setuid root;  here: nnp
#              built from k8s.io/kubernetes/test/images/nonewprivs, setuid root, on the busybox base.
#   nginx      upstream: nginx 1.27/1.28 on Alpine;  here: Debian's nginx (1.22) and the libraries
#              it links, unpacked from the package files, serving /usr/share/nginx/html on :80.
#   pause      a tiny static C program (pause.c): sleeps, reaps children, exits 0 on SIGTERM.
#   sample-apiserver  upstream: k8s.io/sample-apiserver 1.29 on distroless;  here: k8s.io/sample-apiserver
#              at the suite's staging version (go install, its own go.mod) on the busybox base,
#              entrypoint /sample-apiserver as upstream's.
#   etcd       upstream: etcd 3.7.0 with /usr/local/bin/etcd;  here: go.etcd.io/etcd/server/v3 at the
#              version Waggle's main module embeds, at /usr/local/bin/etcd on the busybox base.
# agnhost:2.55 (the suite's "previous" agnhost) and nginx:1.28.0-2 (its "new" nginx) are the same
# builds under the second tag: the specs only need two distinct image names that both work.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
waggle="$(realpath "$1")"
out="$2"
module="$here/.."                       # the conformance Go module (k8s.io/kubernetes pinned)
debs="${WAGGLE_CONFORMANCE_DEBS:-/var/cache/waggle/conformance/debs}"
e2e="registry.k8s.io/e2e-test-images"
mkdir -p "$out" "$debs"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

# deb PKG...: the .deb files of PKG from Debian's archive (apt-get download, cached in $debs).
deb() {
	local p f
	for p in "$@"; do
		f=$(ls "$debs/${p}_"*.deb 2>/dev/null | head -1 || true)
		if [ -z "$f" ]; then
			(cd "$debs" && apt-get download -q "$p" >/dev/null 2>&1) || {
				apt-get update -q >/dev/null && (cd "$debs" && apt-get download -q "$p" >/dev/null)
			}
			f=$(ls "$debs/${p}_"*.deb | head -1)
		fi
		echo "$f"
	done
}

# unpack DIR PKG...: unpack the packages' files into DIR (no maintainer scripts run).
unpack() {
	local dir=$1 f
	shift
	mkdir -p "$dir"
	for f in $(deb "$@"); do dpkg-deb -x "$f" "$dir"; done
}

# closure PKG...: PKG and every package it needs (Depends and Pre-Depends, recursively; virtual
# packages left out: each has a real provider in the list).
closure() {
	apt-cache depends --recurse --no-recommends --no-suggests --no-conflicts --no-breaks \
		--no-replaces --no-enhances "$@" | grep '^[a-z0-9]' | sort -u
}

# dnstools DIR: dig (and host, nslookup) and getent, with the libraries they load.
dnstools() {
	unpack "$1" libc-bin $(closure bind9-dnsutils)
	rm -rf "$1/usr/share/doc" "$1/usr/share/man" "$1/usr/share/lintian" "$1/usr/share/locale" "$1/usr/share/info"
}

# nettools DIR: curl and OpenBSD's nc (as /bin/nc, over busybox's), with the libraries they load.
nettools() {
	unpack "$1" $(closure curl netcat-openbsd)
	ln -sf nc.openbsd "$1/bin/nc"
	rm -rf "$1/usr/share/doc" "$1/usr/share/man" "$1/usr/share/lintian" "$1/usr/share/locale" "$1/usr/share/info"
}

# base DIR: a minimal root file system with busybox's tools, a shell, /etc files and /tmp.
# glibc's shared files come too: the static busybox still loads the NSS modules (libnss_files,
# libnss_dns) to resolve a host name, and crashes without them.
# /bin/sh is Debian's bash, not Debian's busybox ash, for two behaviours of upstream's busybox 1.37
# the specs rely on: Debian's ash drops environment variables whose names are not shell names
# (the env specs' "data-1", "p-data-1"), and busybox-static's shell runs its own applets before
# PATH (`sh -c 'nc -v ...'` would get busybox's nc, not the image's OpenBSD nc). bash passes such
# variables to the programs it runs and looks commands up in PATH; busybox's ash stays as ash.
base() {
	local dir=$1 a
	unpack "$dir" busybox-static libc6 bash libtinfo6
	rm -rf "$dir/etc/skel" "$dir/etc/bash.bashrc" "$dir/usr/share/doc-base"
	mkdir -p "$dir/bin" "$dir/tmp" "$dir/etc" "$dir/root" "$dir/var/run"
	for a in $("$dir/bin/busybox" --list); do
		[ -e "$dir/bin/$a" ] || ln -s busybox "$dir/bin/$a"
	done
	ln -sf bash "$dir/bin/sh"
	skeleton "$dir"
}

# skeleton DIR: what every image's root file system has beside its programs: /tmp, /root, the
# users and groups upstream's images define, and nsswitch.conf; no documentation.
skeleton() {
	local dir=$1
	mkdir -p "$dir/bin" "$dir/tmp" "$dir/etc" "$dir/root" "$dir/var/run"
	rm -rf "$dir/usr/share/doc" "$dir/usr/share/man" "$dir/usr/share/lintian" "$dir/usr/share/locale" \
		"$dir/usr/share/i18n" "$dir/usr/lib/x86_64-linux-gnu/gconv"
	chmod 1777 "$dir/tmp"
	cat >"$dir/etc/passwd" <<-'EOF'
	root:x:0:0:root:/root:/bin/sh
	daemon:x:1:1:daemon:/usr/sbin:/bin/false
	www-data:x:33:33:www-data:/var/www:/bin/false
	nobody:x:65534:65534:nobody:/nonexistent:/bin/false
	EOF
	cat >"$dir/etc/group" <<-'EOF'
	root:x:0:
	daemon:x:1:
	www-data:x:33:
	nogroup:x:65534:
	EOF
	echo "hosts: files dns" >"$dir/etc/nsswitch.conf"
}

# busybox_upstream DIR: busybox 1.37.0 as upstream releases it, built static against glibc from
# the release tarball (Debian's archive carries it byte for byte as trixie's orig tarball; cached
# in $debs, checked against the release's SHA-256), installed with its applet links and glibc's
# shared files (a static glibc busybox still loads the NSS modules to resolve names). defconfig less `tc`,
# which no longer builds against kernel headers without CBQ. About 3 minutes on 2 cores.
busybox_upstream() {
	local dir=$1 tarball="$debs/busybox-1.37.0.tar.bz2" a
	local sum=3311dff32e746499f4df0d5df04d7eb396382d7e108bb9250e7b519b837043a4
	if ! echo "$sum  $tarball" | sha256sum -c --status 2>/dev/null; then
		curl -fsS --retry 3 -o "$tarball.part" http://deb.debian.org/debian/pool/main/b/busybox/busybox_1.37.0.orig.tar.bz2
		echo "$sum  $tarball.part" | sha256sum -c --status || { echo "busybox-1.37.0.tar.bz2: SHA-256 mismatch" >&2; return 1; }
		mv "$tarball.part" "$tarball"
	fi
	tar -xjf "$tarball" -C "$work"
	(
		cd "$work/busybox-1.37.0"
		make -s defconfig >/dev/null
		sed -i -e 's/^# CONFIG_STATIC is not set$/CONFIG_STATIC=y/' -e 's/^CONFIG_TC=y$/# CONFIG_TC is not set/' .config
		make -s -j"$(nproc)" busybox >/dev/null 2>"$work/busybox-build.log" || { cat "$work/busybox-build.log" >&2; exit 1; }
	)
	unpack "$dir" libc6
	mkdir -p "$dir/bin"
	install -m 0755 "$work/busybox-1.37.0/busybox" "$dir/bin/busybox"
	for a in $("$dir/bin/busybox" --list); do
		[ -e "$dir/bin/$a" ] || ln -s busybox "$dir/bin/$a"
	done
	skeleton "$dir"
}

# build NAME TAR ARGS...: pack with waggle images build unless TAR exists.
build() {
	local name=$1 tar=$2
	shift 2
	if [ -s "$out/$tar" ]; then
		echo "image $name: $out/$tar (cached)"
		return
	fi
	"$waggle" images build --name "$name" --output "$out/$tar" "$@" >/dev/null
	echo "image $name: $out/$tar ($(du -h "$out/$tar" | cut -f1))"
}

# busybox
if [ ! -s "$out/busybox.tar" ]; then
	busybox_upstream "$work/busybox"
fi
build "$e2e/busybox:1.37.0-2" busybox.tar --rootfs "$work/busybox" --cmd '["sh"]' --env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin

# pause
if [ ! -s "$out/pause.tar" ]; then
	mkdir -p "$work/pause"
	cc -static -Os -s -o "$work/pause/pause" "$here/pause.c"
fi
build "registry.k8s.io/pause:3.10.2" pause.tar --rootfs "$work/pause" --entrypoint '["/pause"]'

# agnhost (and kitten and nautilus, which are agnhost plus two files)
ksrc="$(cd "$module" && go list -m -f '{{.Dir}}' k8s.io/kubernetes)/test/images"
if [ ! -s "$out/agnhost.tar" ] || [ ! -s "$out/agnhost-prev.tar" ] || [ ! -s "$out/kitten.tar" ] || [ ! -s "$out/nautilus.tar" ]; then
	r="$work/agnhost"
	base "$r"
	dnstools "$r"
	nettools "$r"
	(cd "$module" && CGO_ENABLED=0 go build -trimpath -ldflags '-s -w' -o "$r/agnhost" k8s.io/kubernetes/test/images/agnhost)
	ln -s agnhost "$r/agnhost-2"
	src="$ksrc/agnhost"
	install -m 0644 "$src/porter/localhost.crt" "$src/porter/localhost.key" "$r/"
	mkdir -p "$r/uploads"
	# The user and group the SupplementalGroups spec expects to be defined in the image.
	echo "user-defined-in-image:x:1000:1000::/home/user-defined-in-image:/bin/sh" >>"$r/etc/passwd"
	printf 'user-defined-in-image:x:1000:\ngroup-defined-in-image:x:50000:user-defined-in-image\n' >>"$r/etc/group"
	mkdir -p "$r/home/user-defined-in-image" && chown 1000:1000 "$r/home/user-defined-in-image"
fi
agnhost_args=(--rootfs "$work/agnhost" --entrypoint '["/agnhost"]'
	--env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
	--expose 80/tcp --expose 8080/tcp --expose 8081/tcp --expose 9376/tcp --expose 5000/tcp)
build "$e2e/agnhost:2.66.1" agnhost.tar "${agnhost_args[@]}" --cmd '["pause"]'
build "$e2e/agnhost:2.55" agnhost-prev.tar "${agnhost_args[@]}" --cmd '["pause"]'
printf '%s\n' 'NAME="Alpine Linux"' 'ID=alpine' 'VERSION_ID=3.21' 'PRETTY_NAME="Alpine Linux v3.21"' \
	'HOME_URL="https://alpinelinux.org/"' >"$work/alpine-os-release"
for animal in kitten nautilus; do
	build "$e2e/$animal:1.8" "$animal.tar" "${agnhost_args[@]}" --cmd '["test-webserver"]' \
		--file "$ksrc/$animal/html/$animal.jpg:/$animal.jpg" --file "$ksrc/$animal/html/data.json:/data.json" \
		--file "$work/alpine-os-release:/etc/os-release"
done

# glibc-dns-testing (the DNS specs' glibc prober)
if [ ! -s "$out/glibc-dns-testing.tar" ]; then
	base "$work/glibc-dns-testing"
	dnstools "$work/glibc-dns-testing"
fi
build "$e2e/glibc-dns-testing:2.1.1" glibc-dns-testing.tar --rootfs "$work/glibc-dns-testing" --cmd '["sh"]' \
	--env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin

# nonewprivs (AllowPrivilegeEscalation: a setuid-root program that prints its effective uid)
if [ ! -s "$out/nonewprivs.tar" ]; then
	r="$work/nonewprivs"
	base "$r"
	mkdir -p "$r/usr/local/bin"
	(cd "$module" && CGO_ENABLED=0 go build -trimpath -ldflags '-s -w' -o "$r/usr/local/bin/nnp" k8s.io/kubernetes/test/images/nonewprivs)
	chown 0:0 "$r/usr/local/bin/nnp"
	chmod 4755 "$r/usr/local/bin/nnp"
fi
build "$e2e/nonewprivs:1.4" nonewprivs.tar --rootfs "$work/nonewprivs" --cmd '["nnp"]' \
	--env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin

# nginx
if [ ! -s "$out/nginx.tar" ] || [ ! -s "$out/nginx-new.tar" ]; then
	r="$work/nginx"
	base "$r"
	unpack "$r" nginx libcrypt1 libpcre2-8-0 libssl3 zlib1g
	rm -rf "$r/usr/share/doc" "$r/usr/share/man" "$r/usr/share/lintian" "$r/etc/init.d" "$r/lib/systemd" "$r/usr/lib/systemd"
	mkdir -p "$r/etc/nginx/conf.d" "$r/var/lib/nginx" "$r/var/log/nginx" "$r/run" "$r/usr/share/nginx/html"
	unpack "$work/nginx-common" nginx-common
	cp "$work/nginx-common/etc/nginx/mime.types" "$r/etc/nginx/"
	# The official image's configuration in substance: a worker per CPU, logs on the
	# container's stdout/stderr, the welcome page on port 80.
	cat >"$r/etc/nginx/nginx.conf" <<-'EOF'
	user www-data;
	worker_processes auto;
	error_log /dev/stderr notice;
	pid /run/nginx.pid;
	events { worker_connections 1024; }
	http {
	    include /etc/nginx/mime.types;
	    default_type application/octet-stream;
	    access_log /dev/stdout;
	    sendfile on;
	    keepalive_timeout 65;
	    include /etc/nginx/conf.d/*.conf;
	}
	EOF
	cat >"$r/etc/nginx/conf.d/default.conf" <<-'EOF'
	server {
	    listen 80;
	    listen [::]:80;
	    server_name localhost;
	    location / {
	        root /usr/share/nginx/html;
	        index index.html index.htm;
	    }
	}
	EOF
	printf '<!DOCTYPE html>\n<html>\n<head>\n<title>Welcome to nginx!</title>\n</head>\n<body>\n<h1>Welcome to nginx!</h1>\n</body>\n</html>\n' >"$r/usr/share/nginx/html/index.html"
fi
nginx_args=(--rootfs "$work/nginx" --cmd '["nginx","-g","daemon off;"]' --stop-signal SIGQUIT --expose 80/tcp
	--env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin)
build "$e2e/nginx:1.27.0-2" nginx.tar "${nginx_args[@]}"
build "$e2e/nginx:1.28.0-2" nginx-new.tar "${nginx_args[@]}"

# sample-apiserver (the Aggregator spec's extension API server)
if [ ! -s "$out/sample-apiserver.tar" ]; then
	r="$work/sample-apiserver"
	base "$r"
	v=$(cd "$module" && go list -m -f '{{if .Replace}}{{.Replace.Version}}{{else}}{{.Version}}{{end}}' k8s.io/apiserver)
	(cd "$work" && CGO_ENABLED=0 GOBIN="$r" go install -trimpath -ldflags '-s -w' "k8s.io/sample-apiserver@$v")
fi
build "$e2e/sample-apiserver:1.29.2" sample-apiserver.tar --rootfs "$work/sample-apiserver" --entrypoint '["/sample-apiserver"]' \
	--env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin --expose 443/tcp

# etcd (the sample-apiserver's storage, a second container of its pod)
if [ ! -s "$out/etcd.tar" ]; then
	r="$work/etcd"
	base "$r"
	mkdir -p "$r/usr/local/bin" "$r/var/etcd"
	(cd "$here/../../.." && CGO_ENABLED=0 go build -trimpath -ldflags '-s -w' -o "$r/usr/local/bin/etcd" go.etcd.io/etcd/server/v3)
fi
build "registry.k8s.io/etcd:3.7.0-0" etcd.tar --rootfs "$work/etcd" --cmd '["/usr/local/bin/etcd"]' \
	--env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin --expose 2379/tcp
