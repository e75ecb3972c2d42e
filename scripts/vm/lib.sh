# Functions for scripts/vm-test (sourced): host tools, test binaries, guest kernels and initramfs,
# booting. Uses the globals set by scripts/vm-test (ROOT, CACHE, CUSTOM_DIR, VMDIR, SHARE, BUILD,
# TIMEOUT, FILTERS).

die() {
	echo "vm-test: $*" >&2
	exit 1
}

note() { echo "vm-test: $*"; }

# ---------------------------------------------------------------------------------------------------
# Host packages

# Debian packages the harness needs besides QEMU: busybox-static (guest PID 1, must be static),
# cpio (initramfs), kmod (depmod/modprobe to resolve guest modules), xz-utils (Debian modules and
# linux-source are xz-compressed), zstd (in case a kernel ships .ko.zst), dwarves (pahole, for the BTF
# step of out-of-tree module builds), make + gcc-12 (the compiler Debian's bookworm kernels were built
# with, named in the headers' .kernelvariables), libc6-dev (static glibc for the test binary).
HOST_PACKAGES=(busybox-static cpio kmod xz-utils zstd dwarves make gcc-12 libc6-dev binutils)
APT_UPDATED=0

pkg_installed() {
	dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q 'install ok installed'
}

# QEMU 8.0 added the igb device; bookworm's 7.2 lacks it, bookworm-backports has 10.x.
qemu_ok() {
	command -v qemu-system-x86_64 >/dev/null &&
		qemu-system-x86_64 -device help 2>/dev/null | grep -q '"igb"'
}

apt_update_once() {
	[ "$APT_UPDATED" = 1 ] && return 0
	ensure_backports_source
	note "apt-get update"
	apt-get update -q >/dev/null || die "apt-get update failed"
	APT_UPDATED=1
}

ensure_backports_source() {
	if grep -rqs 'bookworm-backports' /etc/apt/sources.list /etc/apt/sources.list.d/; then
		return 0
	fi
	note "adding bookworm-backports to apt's sources"
	cat >/etc/apt/sources.list.d/bookworm-backports.sources <<'EOF'
Types: deb
URIs: http://deb.debian.org/debian
Suites: bookworm-backports
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
EOF
}

ensure_host_tools() {
	local missing=() p
	for p in "${HOST_PACKAGES[@]}"; do
		pkg_installed "$p" || missing+=("$p")
	done
	if [ ${#missing[@]} -eq 0 ] && qemu_ok; then
		return 0
	fi
	[ "$(id -u)" = 0 ] || die "missing host packages (${missing[*]} qemu-system-x86 from bookworm-backports); run as root to install them"
	apt_update_once
	if [ ${#missing[@]} -gt 0 ]; then
		note "installing ${missing[*]}"
		apt-get install -y -q --no-install-recommends "${missing[@]}" >/dev/null ||
			die "apt-get install ${missing[*]} failed"
	fi
	if ! qemu_ok; then
		note "installing qemu-system-x86 from bookworm-backports"
		apt-get install -y -q --no-install-recommends -t bookworm-backports qemu-system-x86 >/dev/null ||
			die "apt-get install -t bookworm-backports qemu-system-x86 failed"
		qemu_ok || die "qemu-system-x86_64 still has no igb device after installing from bookworm-backports"
	fi
}

# Downloads Debian package $1 into $CACHE/debs (once) and sets DEB to the .deb's path. (A global, not
# output: apt_update_once must run in this shell so it runs once.)
fetch_deb() {
	local pkg=$1
	mkdir -p "$CACHE/debs"
	DEB=$(find "$CACHE/debs" -maxdepth 1 -name "${pkg}_*.deb" | sort -V | tail -n1)
	if [ -z "$DEB" ]; then
		apt_update_once
		note "downloading $pkg"
		(cd "$CACHE/debs" && apt-get download -q -o APT::Sandbox::User=root "$pkg" >/dev/null) ||
			die "apt-get download $pkg failed"
		DEB=$(find "$CACHE/debs" -maxdepth 1 -name "${pkg}_*.deb" | sort -V | tail -n1)
	fi
	[ -n "$DEB" ] || die "no .deb for $pkg after apt-get download"
}

# bookworm-backports' libvirt 11.3 for the guest's libvirt tests (tests/src/kernel/libvirt/sysroot.rs):
# its packages, downloaded once into $CACHE/debs, extracted into the share's libvirt-11.3/, which the
# guest lays over the host's root (the host keeps bookworm's 9.0 installed: .ci/run installs it).
# Debian's 11.3 ships the monolithic libvirtd only (no virtnodedevd/virtqemud in these packages).
LIBVIRT_11_3_VERSION='11.3.0-2~bpo12+1'
LIBVIRT_11_3_PACKAGES=(libvirt0 libvirt-common libvirt-clients libvirt-daemon libvirt-daemon-common
	libvirt-daemon-log libvirt-daemon-driver-nodedev libvirt-daemon-driver-qemu)
prepare_libvirt_11_3() {
	local dir=$SHARE/libvirt-11.3 pkg deb debs=()
	mkdir -p "$CACHE/debs"
	for pkg in "${LIBVIRT_11_3_PACKAGES[@]}"; do
		deb=$CACHE/debs/${pkg}_${LIBVIRT_11_3_VERSION}_amd64.deb
		if [ ! -f "$deb" ]; then
			apt_update_once
			note "downloading $pkg $LIBVIRT_11_3_VERSION (bookworm-backports)"
			(cd "$CACHE/debs" && apt-get download -q -o APT::Sandbox::User=root "$pkg=$LIBVIRT_11_3_VERSION" >/dev/null) ||
				die "apt-get download $pkg=$LIBVIRT_11_3_VERSION failed (bookworm-backports)"
			[ -f "$deb" ] || die "apt-get download $pkg=$LIBVIRT_11_3_VERSION left no $deb"
		fi
		debs+=("$deb")
	done
	# Extracted anew when a package is newer than the tree (or the tree is incomplete).
	if [ -f "$dir/.extracted" ] && [ -z "$(find "${debs[@]}" -newer "$dir/.extracted")" ]; then
		return 0
	fi
	note "extracting libvirt $LIBVIRT_11_3_VERSION into the share"
	rm -rf "$dir" && mkdir -p "$dir"
	for deb in "${debs[@]}"; do
		dpkg-deb -x "$deb" "$dir" || die "dpkg-deb -x $deb failed"
	done
	[ -x "$dir/usr/sbin/libvirtd" ] || die "no usr/sbin/libvirtd in the extracted libvirt $LIBVIRT_11_3_VERSION"
	touch "$dir/.extracted"
}

# ---------------------------------------------------------------------------------------------------
# Test binaries

# Builds every PKG:BIN statically (the guest has no libc) into a target dir of its own, so the
# crt-static RUSTFLAGS do not invalidate the workspace's normal build, and copies each to the share
# (stripped of debug info). One cargo run for all of them: their shared dependencies are built once,
# with one set of features. With SHIPPED_PROFILE=1 the release profile stays as shipped (whole-program
# LTO, one codegen unit) and the build has a target dir of its own, so neither build undoes the other.
build_test_binaries() {
	local triple=x86_64-unknown-linux-gnu target=$CACHE/target spec pkg bin src args=() pkgs=" "
	# The release profile's whole-program LTO (smaller shipped binaries, see Cargo.toml) only slows
	# the test build down: off there; and no line tables, which the copy strips anyway.
	local profile=(CARGO_PROFILE_RELEASE_LTO=false CARGO_PROFILE_RELEASE_CODEGEN_UNITS=16) what="static, release"
	if [ "${SHIPPED_PROFILE:-0}" = 1 ]; then
		target=$CACHE/target-shipped profile=() what="static, release as shipped: LTO"
	fi
	for spec; do
		pkg=${spec%%:*}
		case "$pkgs" in *" $pkg "*) ;; *) pkgs+="$pkg " args+=(-p "$pkg") ;; esac
	done
	for spec; do args+=(--bin "${spec#*:}"); done
	if [ "$BUILD" = 1 ]; then
		note "building $* ($what)"
		(cd "$ROOT" && env CARGO_TARGET_DIR="$target" RUSTFLAGS='-C target-feature=+crt-static' \
			"${profile[@]}" CARGO_PROFILE_RELEASE_DEBUG=false \
			cargo build -q --release --target "$triple" "${args[@]}") ||
			die "cargo build of $* failed"
	fi
	for spec; do
		bin=${spec#*:}
		src=$target/$triple/release/$bin
		[ -x "$src" ] || die "$src is missing (run without --no-build)"
		if readelf -l "$src" | grep -q 'program interpreter'; then
			die "$src is dynamically linked; the guest can only run static binaries"
		fi
		# Without debug info (release keeps line tables): a fifth of the size to page in over 9p.
		objcopy --strip-debug "$src" "$SHARE/$bin.tmp" && mv -f "$SHARE/$bin.tmp" "$SHARE/$bin" ||
			die "cannot copy $src to the share"
	done
}

# Writes the script the guest's init runs from the share: every binary in turn, each followed by a
# "vm-test: <bin> exit <code>" line the host checks.
write_guest_run() {
	local spec bin f args=""
	for f in "${FILTERS[@]}"; do
		case "$f" in *\'*) die "test filter '$f' must not contain a single quote" ;; esac
		args+=" '$f'"
	done
	{
		echo '#!/bin/sh'
		echo '# Written by scripts/vm-test; runs in the guest from the 9p share.'
		for spec; do
			bin=${spec#*:}
			echo "echo 'vm-test: running $bin'"
			if [ "$bin" = kernel-tests ]; then
				echo "./$bin$args"
			else
				echo "./$bin"
			fi
			echo "echo \"vm-test: $bin exit \$?\""
		done
	} >"$SHARE/guest-run"
	EXPECTED_BINS=$#
}

# ---------------------------------------------------------------------------------------------------
# Guest kernels. Each sets KVER (module directory name), KDIR (its cache dir), IMG (a root holding
# lib/modules/$KVER with every module, depmod-ed) and VMLINUZ.

prepare_kernel() {
	case "$1" in
	# Pinned to the versions the suite was first measured on; when Debian's mirror has moved on, the newest
	# kernel of the same series is used instead (with a note).
	stock-6.12) prepare_stock "$1" 6.12.117+deb12 '6\.12\.[0-9]+\+deb12' 6.12 ;;
	stock-6.1) prepare_stock "$1" 6.1.0-57 '6\.1\.0-[0-9]+' 6.1 ;;
	custom) prepare_custom ;;
	esac
	build_initramfs "$1"
}

# Sets ABI to the kernel ABI name to use: the pinned one when cached or on the mirror, else the newest
# kernel of the same series there.
resolve_abi() {
	local kernel=$1 pinned=$2 regex=$3
	ABI=$pinned
	if [ -e "$CACHE/kernels/$kernel-$pinned/.samples-done" ] ||
		[ -n "$(find "$CACHE/debs" -maxdepth 1 -name "linux-image-$pinned-amd64_*.deb" 2>/dev/null)" ]; then
		return
	fi
	apt_update_once
	apt-cache show "linux-image-$pinned-amd64" >/dev/null 2>&1 && return
	ABI=$(apt-cache search --names-only "^linux-image-${regex}-amd64\$" | awk '{print $1}' |
		sed 's/^linux-image-//; s/-amd64$//' | sort -V | tail -n1)
	[ -n "$ABI" ] || die "neither linux-image-$pinned-amd64 nor a newer kernel of its series is on the mirror"
	note "linux-image-$pinned-amd64 is gone from the mirror; using linux-image-$ABI-amd64"
}

prepare_stock() {
	local kernel=$1 series=$4
	resolve_abi "$kernel" "$2" "$3"
	KVER=$ABI-amd64
	KDIR=$CACHE/kernels/$kernel-$ABI
	IMG=$KDIR/img
	VMLINUZ=$IMG/boot/vmlinuz-$KVER
	mkdir -p "$KDIR"
	if [ ! -e "$KDIR/.image-done" ]; then
		fetch_deb "linux-image-$KVER"
		note "unpacking $(basename "$DEB")"
		rm -rf "$IMG"
		dpkg-deb -x "$DEB" "$IMG"
		touch "$KDIR/.image-done"
	fi
	if [ ! -e "$KDIR/.samples-done" ]; then
		build_samples "$series"
		depmod -b "$IMG" "$KVER"
		touch "$KDIR/.samples-done"
	fi
}

# Builds the kernel's sample mdev drivers (samples/vfio-mdev: mtty, mdpy, mdpy-fb, mbochs) out of tree
# against Debian's headers, taking the sources from the linux-source package at build time.
build_samples() {
	local series=$1 hdr common kbuild x hdir src pkg
	hdr=linux-headers-$KVER
	apt_update_once
	common=$(apt-cache depends "$hdr" | awk '/Depends: linux-headers-.*-common/{print $2; exit}')
	kbuild=$(apt-cache depends "$hdr" | awk '/Depends: linux-kbuild-/{print $2; exit}')
	[ -n "$common" ] && [ -n "$kbuild" ] || die "cannot find the -common and kbuild packages $hdr depends on"
	x=$KDIR/headers
	rm -rf "$x" "$KDIR/samples"
	for pkg in "$hdr" "$common" "$kbuild"; do
		fetch_deb "$pkg"
		dpkg-deb -x "$DEB" "$x"
	done
	hdir=$x/usr/src/$hdr
	# Debian's per-flavour headers Makefile includes the -common Makefile by absolute path
	# (/usr/src/linux-headers-*-common/Makefile); point it at the unpacked copy.
	sed -i "s#^include /usr/src/#include $x/usr/src/#" "$hdir/Makefile"
	fetch_deb "linux-source-$series"
	src=$DEB
	note "extracting samples/vfio-mdev from $(basename "$src")"
	mkdir -p "$KDIR/samples"
	dpkg-deb --fsys-tarfile "$src" | tar -xO "./usr/src/linux-source-$series.tar.xz" | xz -dc |
		tar -x -C "$KDIR/samples" --strip-components=3 "linux-source-$series/samples/vfio-mdev"
	# The sources are only needed here: drop the 140 MB package once they are out.
	rm -f "$src"
	echo 'obj-m := mtty.o mdpy.o mdpy-fb.o mbochs.o' >"$KDIR/samples/Kbuild"
	rm -f "$KDIR/samples/Makefile"
	note "building the sample mdev drivers for $KVER"
	make -s -C "$hdir" M="$KDIR/samples" -j"$(nproc)" modules >"$KDIR/samples/build.log" 2>&1 ||
		{ tail -n 30 "$KDIR/samples/build.log" >&2; die "building the sample mdev drivers failed"; }
	mkdir -p "$IMG/lib/modules/$KVER/extra"
	cp "$KDIR"/samples/*.ko "$IMG/lib/modules/$KVER/extra/"
	rm -rf "$x"
}

prepare_custom() {
	[ -f "$CUSTOM_DIR/bzImage" ] && [ -f "$CUSTOM_DIR/modules.tar.gz" ] ||
		die "the custom kernel is not at $CUSTOM_DIR (bzImage, modules.tar.gz)"
	local sum
	sum=$(sha256sum "$CUSTOM_DIR/modules.tar.gz" | cut -c1-12)
	KDIR=$CACHE/kernels/custom-$sum
	IMG=$KDIR/img
	VMLINUZ=$CUSTOM_DIR/bzImage
	if [ ! -e "$KDIR/.image-done" ]; then
		(cd "$CUSTOM_DIR" && sha256sum --quiet -c SHA256SUMS) || die "checksums in $CUSTOM_DIR/SHA256SUMS do not match"
		rm -rf "$IMG"
		mkdir -p "$IMG"
		tar -xzf "$CUSTOM_DIR/modules.tar.gz" -C "$IMG"
		touch "$KDIR/.image-done"
	fi
	KVER=$(ls "$IMG/lib/modules")
	[ "$(echo "$KVER" | wc -w)" = 1 ] || die "expected one kernel in $CUSTOM_DIR/modules.tar.gz, found: $KVER"
}

# ---------------------------------------------------------------------------------------------------
# Initramfs: busybox, /init, the modules of scripts/vm/modules with their dependencies (decompressed,
# so busybox's modprobe needs no xz support) and their load list in /etc/vm-modules.

build_initramfs() {
	local kernel=$1 key rootfs line name policy out paths p rel mdir
	key=$(cat "$VMDIR/init" "$VMDIR/modules" "${BASH_SOURCE[0]}" /bin/busybox | sha256sum | cut -c1-12)
	INITRD=$KDIR/initramfs-$key.cpio.gz
	[ -e "$INITRD" ] && return 0
	note "building the initramfs for $KVER"
	rootfs=$KDIR/rootfs
	rm -rf "$rootfs" "$KDIR"/initramfs-*.cpio.gz
	mdir=$rootfs/lib/modules/$KVER
	mkdir -p "$rootfs"/{bin,dev,etc,mnt,proc,sys,tmp} "$mdir"
	cp /bin/busybox "$rootfs/bin/busybox"
	cp "$VMDIR/init" "$rootfs/init"
	chmod 755 "$rootfs/init" "$rootfs/bin/busybox"
	# The kernel opens /dev/console for PID 1 before init can mount devtmpfs.
	mknod "$rootfs/dev/console" c 5 1 2>/dev/null || true
	: >"$rootfs/etc/vm-modules"
	while read -r name policy; do
		case "$name" in '' | '#'*) continue ;; esac
		policy=${policy:-required}
		if ! out=$(modprobe -d "$IMG" -S "$KVER" --show-depends "$name" 2>&1); then
			case "$policy" in
			optional) note "optional module $name is not in $KVER" ;;
			custom) [ "$kernel" = custom ] && die "module $name is missing from the custom kernel $KVER" ;;
			*) die "module $name is missing from $KVER: $out" ;;
			esac
			continue
		fi
		paths=$(echo "$out" | awk '$1 == "insmod" {print $2}')
		[ -z "$paths" ] && continue # built in
		for p in $paths; do
			rel=${p#"$IMG/lib/modules/$KVER/"}
			mkdir -p "$(dirname "$mdir/$rel")"
			case "$rel" in
			*.ko.xz) [ -e "$mdir/${rel%.xz}" ] || xz -dc "$p" >"$mdir/${rel%.xz}" ;;
			*.ko.zst) [ -e "$mdir/${rel%.zst}" ] || zstd -qdc "$p" >"$mdir/${rel%.zst}" ;;
			*.ko.gz) [ -e "$mdir/${rel%.gz}" ] || gzip -dc "$p" >"$mdir/${rel%.gz}" ;;
			*) cp -f "$p" "$mdir/$rel" ;;
			esac
		done
		if [ "$policy" = optional ]; then
			echo "$name optional" >>"$rootfs/etc/vm-modules"
		else
			echo "$name" >>"$rootfs/etc/vm-modules"
		fi
	done <"$VMDIR/modules"
	for f in modules.builtin modules.builtin.modinfo modules.order; do
		[ -e "$IMG/lib/modules/$KVER/$f" ] && cp "$IMG/lib/modules/$KVER/$f" "$mdir/"
	done
	depmod -b "$rootfs" "$KVER"
	echo "$kernel" >"$rootfs/etc/vm-kernel"
	(cd "$rootfs" && find . | cpio -o -H newc -R 0:0 --quiet) | gzip -1 >"$INITRD.tmp"
	mv "$INITRD.tmp" "$INITRD"
}

# ---------------------------------------------------------------------------------------------------
# Boot

# The kernel's words for a vCPU that sat idle in HLT while its timer interrupt never came (RCU's
# grace-period kthread waits on a timer of that CPU: kernel/rcu/tree_stall.h,
# rcu_check_gp_kthread_expired_fqs_timer). Under TCG the emulator sometimes loses that interrupt and the
# guest never recovers: the tests then hang until --timeout, though nothing in them failed.
LOST_TIMER="kthread timer wakeup didn't happen"

# Shows a guest console line on the terminal: everything but kernel messages, and of those only the
# ones that explain a failure. The full console goes to the log. A lost timer interrupt stops QEMU
# (its pid is in $1) at once, rather than after the timeout.
show_guest_lines() {
	local line pidfile=$1
	while IFS= read -r line; do
		case "$line" in
		*"$LOST_TIMER"*)
			echo "  | $line"
			echo "  | vm-test: the guest lost a timer interrupt; stopping it"
			{ [ -s "$pidfile" ] && kill "$(cat "$pidfile")" 2>/dev/null; } || true ;;
		'['*) case "$line" in
			*'Kernel panic'* | *'BUG:'* | *'Oops'* | *'WARNING:'* | *'Call Trace'* | *segfault* | *'Out of memory'*)
				echo "  | $line" ;;
			esac ;;
		*) echo "  | $line" ;;
		esac
	done
}

# Boots the prepared kernel with topology $2, logging the console to $3; ONE_BOOT, when set, names the
# boot (kernel/topology) that runs the user-space integration tests. Sets RUN_PASSED, RUN_FAILED,
# RUN_SKIPPED, RUN_REASON and RUN_EMULATOR_FAULT (1 when the emulator failed rather than a test: it lost
# a timer interrupt, see LOST_TIMER, or QEMU itself aborted or crashed); returns non-zero unless every
# binary passed.
boot_and_test() {
	local kernel=$1 topo=$2 log=$3 rc exits summaries bad
	local pidfile=$log.qemu-pid
	rm -f "$pidfile"
	RUN_EMULATOR_FAULT=0
	RUN_PASSED=0 RUN_FAILED=0 RUN_SKIPPED=0 RUN_ELSEWHERE= RUN_REASON=
	# The share's host path goes on the kernel command line, which splits at whitespace; physical (no
	# symlinks), because the guest resolves an absolute symlink against its own root, not the host's.
	local share
	share=$(cd "$SHARE" && pwd -P)
	case "$share" in *[[:space:]\'\"]*) die "the share path '$share' must not contain whitespace or quotes" ;; esac
	QEMU_ARGS=(
		-machine q35,kernel-irqchip=split -accel tcg,thread=multi -cpu max
		-device intel-iommu,intremap=on,caching-mode=on
		-smp 2 -m 1G -nographic -no-reboot -nodefaults -serial stdio -display none
		-kernel "$VMLINUZ" -initrd "$INITRD"
		# no_timer_check: under TCG on a loaded host the early IO-APIC timer test can miss its ticks and
		# panic ("timer doesn't work through Interrupt-remapped IO-APIC"); the timer works, the check is
		# what fails (Documentation/admin-guide/kernel-parameters.txt: no_timer_check).
		-append "console=ttyS0,115200 intel_iommu=on iommu=pt no_timer_check panic=-1 vmtest.kernel=$kernel vmtest.topology=$topo vmtest.share=$share${ONE_BOOT:+ vmtest.one-boot=$ONE_BOOT}"
		# One 9p share at a fixed slot (see scripts/vm/topologies.sh): the host's whole root, read-only.
		# The guest's init bind-mounts the test share out of it (vmtest.share=) for the test binaries, and the
		# qemu_attach tests run the host's QEMU chrooted into it. One device rather than a second share:
		# another PCI function would change the guest's PCI list and IOMMU group numbers, which
		# mdev-types/sims/samples.toml mirrors. multidevs=remap: / spans several file systems, whose
		# inode numbers would otherwise collide in 9p's qids (QEMU docs, -fsdev multidevs).
		-fsdev "local,id=hostroot,path=/,security_model=none,readonly=on,multidevs=remap"
		-device virtio-9p-pci,fsdev=hostroot,mount_tag=hostroot,addr=1.0
		-pidfile "$pidfile"
	)
	"topology_${topo//-/_}"
	note "booting $kernel ($KVER), topology $topo"
	set +e
	# SeaBIOS clears the screen with terminal escapes; drop them and the CRs of the serial console.
	timeout -k 10 "$TIMEOUT" qemu-system-x86_64 "${QEMU_ARGS[@]}" </dev/null 2>&1 |
		sed -u -e 's/\r//g' -e 's/\x1b\[[0-9;?]*[A-Za-z]//g' -e 's/\x1b[A-Za-z]//g' | tee "$log" |
		show_guest_lines "$pidfile"
	rc=${PIPESTATUS[0]}
	rm -f "$pidfile"
	set -e
	exits=$(grep -E '^vm-test: [^ ]+ exit [0-9]+$' "$log" || true)
	summaries=$(grep -E '^[A-Za-z-]*:? ?[0-9]+ passed, [0-9]+ failed' "$log" || true)
	RUN_PASSED=$(echo "$summaries" | grep -oE '[0-9]+ passed' | awk '{s += $1} END {print s + 0}')
	RUN_FAILED=$(echo "$summaries" | grep -oE '[0-9]+ failed' | awk '{s += $1} END {print s + 0}')
	RUN_SKIPPED=$(echo "$summaries" | grep -oE '[0-9]+ skipped' | awk '{s += $1} END {print s + 0}')
	RUN_ELSEWHERE=$(echo "$summaries" | grep -oE '[0-9]+ on another boot' | awk '{s += $1} END {if (s) print s}')
	bad=$(echo "$exits" | grep -vE ' exit 0$' || true)
	if grep -qF "$LOST_TIMER" "$log"; then
		RUN_EMULATOR_FAULT=1
		RUN_REASON="the emulator lost a timer interrupt of an idle vCPU (RCU: \"$LOST_TIMER\"); the guest was stopped"
	elif [ "$rc" = 134 ] || [ "$rc" = 139 ]; then
		# timeout(1) passes on 128 + the signal that ended QEMU: SIGABRT (an assertion in QEMU) or SIGSEGV.
		RUN_EMULATOR_FAULT=1
		RUN_REASON="QEMU itself died (exit status $rc: SIGABRT or SIGSEGV)"
	elif [ "$rc" = 124 ] || [ "$rc" = 137 ]; then
		RUN_REASON="the guest did not finish within ${TIMEOUT}s"
	elif [ "$rc" != 0 ]; then
		RUN_REASON="qemu exited with status $rc"
	elif grep -q '^vm-test: MODULE FAILED' "$log"; then
		RUN_REASON="a required module did not load ($(grep '^vm-test: MODULE FAILED' "$log" | head -n1))"
	elif ! grep -q '^vm-test: guest-run finished' "$log"; then
		RUN_REASON="the guest stopped before the tests finished (panic or crash?)"
	elif [ "$(echo "$exits" | grep -c .)" != "$EXPECTED_BINS" ] || [ -n "$bad" ]; then
		RUN_REASON="a test binary failed: ${bad:-missing exit line}"
	elif [ "$(echo "$summaries" | grep -c .)" != "$EXPECTED_BINS" ]; then
		RUN_REASON="a test binary printed no 'N passed, M failed' line"
	elif [ "$RUN_FAILED" != 0 ]; then
		RUN_REASON="$RUN_FAILED tests failed"
	elif [ "$RUN_PASSED" = 0 ]; then
		RUN_REASON="no test passed"
	fi
	if [ -n "$RUN_REASON" ]; then
		echo "vm-test: $kernel/$topo FAILED: $RUN_REASON; last lines of $log:" >&2
		tail -n 60 "$log" | sed 's/^/  > /' >&2
		return 1
	fi
	return 0
}
