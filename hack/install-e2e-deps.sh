#!/usr/bin/env bash
# Builds what hack/e2e.sh needs beyond hack/install-deps.sh to run
# Kubernetes' external-storage e2e suite (test/e2e/storage/external)
# against Oxhorn, idempotently:
#
# - e2e.test, the e2e suite's binary, from the k8s.io/kubernetes module
#   hack/tools/go.mod pins (`go test -c`, version-stamped like the other
#   Kubernetes binaries of hack/install-deps.sh), into the bin
#   directory, with a version stamp;
# - the container images its storage tests run, as OCI archives
#   `ctr -n k8s.io images import` takes under the names the suite's
#   test/utils/image/manifest.go gives them (read from the module, so the
#   names follow the pinned version). No registry is reachable here, and the
#   tests' pods pull only when an image is missing, so each must be there
#   under its exact name:
#   - busybox: Debian's static busybox with all its applets;
#   - agnhost: agnhost built from the same module, on that busybox (the
#     real image is Alpine with agnhost; the storage tests run its
#     subcommands, mounttest among them, and sh);
#   - nginx and jessie-dnsutils: stand-ins, the same busybox. The storage
#     tests only run shell commands in them (the volumes suite's exec test,
#     the multivolume suite's pods), never nginx or the DNS tools. Each
#     says so in its label io.oxhorn.stand-in. jessie-dnsutils, Debian in
#     the original, also has Debian's GNU dd and dash as its sh (with
#     their libc): the multivolume block tests write with
#     `dd oflag=nocache`, which busybox's dd refuses;
#   - hello-populator (sig-storage), the volume populator the
#     "any volume data source" test deploys: built from
#     lib-volume-populator's example, at the version the module proxy has
#     (v1.2.0; the manifest's v1.0.1 is not there), on that busybox. Its
#     flags are the same. The data-source validator the test also deploys
#     is not built (no version of it is on the proxy); the test does not
#     wait for it.
#   An archive is rebuilt only when what it is made of changed.
#
#   OXHORN_CACHE          where built tools live (default: ~/.cache/oxhorn)
#   OXHORN_E2E_IMAGE_DIR  where the image archives go (default:
#                         $OXHORN_CACHE/e2e-images), one <name>.tar each
#
# Needs the Go toolchain, umoci and busybox-static (hack/install-deps.sh
# installs them) and jq (installed here). Logs go to stderr; prints the
# archive directory as its last line.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
tools=$here/tools
cache=${OXHORN_CACHE:-${HOME}/.cache/oxhorn}
bin=$cache/bin
out=${OXHORN_E2E_IMAGE_DIR:-$cache/e2e-images}
# The static busybox of Debian's busybox-static, as in testbed/src/images.rs.
BUSYBOX=/bin/busybox

log_name=install-e2e-deps
# shellcheck source-path=SCRIPTDIR source=lib.sh
. "$here/lib.sh"
die() { log "$*"; exit 1; }

for tool in go umoci; do
	command -v "$tool" >/dev/null || die "$tool is missing: run hack/install-deps.sh"
done
dpkg-query -W -f='${Status}' busybox-static 2>/dev/null | grep -q 'install ok installed' ||
	die "busybox-static is missing ($BUSYBOX must be static): run hack/install-deps.sh"

# jq reads the archives' index and hack/e2e.sh's report.
install_apt jq

# The Kubernetes version is the one hack/tools/go.mod pins, so e2e.test,
# agnhost and the image names all come from the module the cluster's
# binaries are built from.
KUBE_VERSION=$(cd "$tools" && go list -m -f '{{.Version}}' k8s.io/kubernetes)
kube_src=$(cd "$tools" && go list -m -f '{{.Dir}}' k8s.io/kubernetes)
# Empty until the module is in the module cache.
if [ -z "$kube_src" ]; then
	log "go mod download k8s.io/kubernetes $KUBE_VERSION"
	(cd "$tools" && go mod download k8s.io/kubernetes)
	kube_src=$(cd "$tools" && go list -m -f '{{.Dir}}' k8s.io/kubernetes)
fi

mkdir -p "$bin" "$out"

# e2e.test runs standalone: its -ginkgo.* flags do what the ginkgo CLI
# would, so the CLI is not built. go vet is left out: it is not our code, and
# it doubles the build time.
build_e2e_test() {
	stamped e2e.test "$KUBE_VERSION" && return
	log "go test -c k8s.io/kubernetes/test/e2e $KUBE_VERSION (minutes on a cold cache)"
	local started=$SECONDS
	(cd "$tools" && go test -c -vet=off -trimpath -ldflags "$(kube_ldflags "$KUBE_VERSION")" \
		-o "$bin/e2e.test" k8s.io/kubernetes/test/e2e)
	stamp e2e.test "$KUBE_VERSION"
	log "e2e.test built in $((SECONDS - started)) s"
}

# agnhost, static as the upstream image's (CGO_ENABLED=0), stamped with the
# version its image carries.
build_agnhost() {
	local version=$1
	stamped agnhost "$version" && return
	log "go build agnhost $version"
	(cd "$tools" && CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" \
		-o "$bin/agnhost" k8s.io/kubernetes/test/images/agnhost)
	stamp agnhost "$version"
}

# hello-populator from lib-volume-populator's example, static, in a module
# of its own: its Kubernetes libraries (client-go v0.25) must not move those
# of hack/tools.
POPULATOR_VERSION=v1.2.0
build_hello_populator() {
	stamped hello-populator "$POPULATOR_VERSION" && return
	local module=$cache/hello-populator-module
	mkdir -p "$module"
	log "go build hello-populator of lib-volume-populator $POPULATOR_VERSION (a minute or two when new)"
	(
		cd "$module"
		[ -f go.mod ] || go mod init oxhorn.io/e2e-hello-populator >/dev/null 2>&1
		go get "github.com/kubernetes-csi/lib-volume-populator/example/hello-populator@$POPULATOR_VERSION" >/dev/null 2>&1
		CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o "$bin/hello-populator" \
			github.com/kubernetes-csi/lib-volume-populator/example/hello-populator
	)
	stamp hello-populator "$POPULATOR_VERSION"
}

# The image the "any volume data source" test's populator Deployment runs.
populator_ref() {
	local deploy=$kube_src/test/e2e/testing-manifests/storage-csi/any-volume-datasource/hello-populator-deploy.yaml
	sed -nE 's/^\s*image:\s*(\S+)\s*$/\1/p' "$deploy" | head -n 1 | grep . ||
		die "no image in $deploy"
}

# image_ref ID: the name and tag manifest.go gives image ID (BusyBox,
# Agnhost, ...), as the tests ask for it with no --kube-test-repo-list.
image_ref() {
	local line registry name tag
	line=$(grep -E "^\s*configs\[$1\] = Config\{" "$kube_src/test/utils/image/manifest.go") ||
		die "manifest.go of $KUBE_VERSION names no image $1"
	registry=$(sed -E 's/.*Config\{list\.([A-Za-z0-9]+),.*/\1/' <<<"$line")
	name=$(sed -E 's/.*Config\{[^,]*, "([^"]+)", "([^"]+)"\}.*/\1/' <<<"$line")
	tag=$(sed -E 's/.*Config\{[^,]*, "([^"]+)", "([^"]+)"\}.*/\2/' <<<"$line")
	case $registry in
	PromoterE2eRegistry) registry=registry.k8s.io/e2e-test-images ;;
	*) die "image $1 is in $registry, which this script does not map" ;;
	esac
	echo "$registry/$name:$tag"
}

scratch=$(mktemp -d "${TMPDIR:-/tmp}/oxhorn-e2e-images.XXXXXX")
trap 'rm -rf "$scratch"' EXIT

# busybox_rootfs DIR: the busybox and a link per applet, the directories a
# container expects, and the users and groups of the official busybox image
# the e2e busybox mirrors (root and nobody: the fsGroup tests read `ls -l`'s
# group column as a number, so gid 1000 must have no name).
busybox_rootfs() {
	local root=$1 applet
	mkdir -p "$root/bin" "$root/sbin" "$root/usr/bin" "$root/usr/sbin" "$root/etc" \
		"$root/tmp" "$root/root" "$root/uploads"
	chmod 1777 "$root/tmp"
	cp "$BUSYBOX" "$root/bin/busybox"
	while read -r applet; do
		[ "$applet" = bin/busybox ] && continue
		ln -sf /bin/busybox "$root/$applet"
	done < <("$BUSYBOX" --list-full)
	cat >"$root/etc/passwd" <<-'EOF'
		root:x:0:0:root:/root:/bin/sh
		nobody:x:65534:65534:nobody:/nonexistent:/bin/false
	EOF
	cat >"$root/etc/group" <<-'EOF'
		root:x:0:
		nogroup:x:65534:
	EOF
}

# gnu_dd DIR: Debian's GNU dd in place of busybox's, and Debian's dash as
# /bin/sh (busybox's sh runs its own applets before any program of the
# PATH), with the libraries they load.
gnu_dd() {
	local root=$1 library
	rm -f "$root/bin/dd" "$root/bin/sh"
	cp /usr/bin/dd "$root/bin/dd"
	cp /usr/bin/dash "$root/bin/sh"
	# ldd of one file at a time: given several, it heads each list with
	# the file's name.
	for library in $({ ldd /usr/bin/dd; ldd /usr/bin/dash; } | grep -oE '/[^ ]+' | sort -u); do
		mkdir -p "$root$(dirname "$library")"
		cp -L "$library" "$root$library"
	done
}

# agnhost_users DIR: the user and groups agnhost's Dockerfile adds, which
# its SupplementalGroups tests look up.
agnhost_users() {
	local root=$1
	echo 'user-defined-in-image:x:1000:1000::/home/user-defined-in-image:/bin/sh' >>"$root/etc/passwd"
	cat >>"$root/etc/group" <<-'EOF'
		user-defined-in-image:x:1000:user-defined-in-image
		group-defined-in-image:x:50000:user-defined-in-image
	EOF
}

# The image config's options for each image: what its command is.
config_of() { # SHORT NAME
	case $1 in
	busybox) echo --config.cmd=sh ;;
	agnhost) echo --config.entrypoint=/agnhost --config.cmd=pause ;;
	hello-populator) echo --config.entrypoint=/hello-populator ;;
	# Pods started without a command stay up, as nginx's would.
	nginx | jessie-dnsutils) echo --config.cmd=sleep --config.cmd=2147483647 ;;
	esac
}

stand_in_of() { # SHORT
	case $1 in
	busybox) echo "Debian's static busybox $(dpkg-query -W -f='${Version}' busybox-static), by hack/install-e2e-deps.sh" ;;
	agnhost) echo "agnhost of k8s.io/kubernetes $KUBE_VERSION on Debian's static busybox, by hack/install-e2e-deps.sh" ;;
	hello-populator) echo "hello-populator of lib-volume-populator $POPULATOR_VERSION on Debian's static busybox, by hack/install-e2e-deps.sh" ;;
	jessie-dnsutils) echo "Debian's static busybox, GNU dd and dash in place of jessie-dnsutils, whose DNS tools the storage tests never run, by hack/install-e2e-deps.sh" ;;
	*) echo "Debian's static busybox in place of $1, whose programs the storage tests never run, by hack/install-e2e-deps.sh" ;;
	esac
}

# build_image SHORT REF: $out/SHORT.tar, an OCI archive (an image layout
# tarred, as testbed/src/images.rs makes busybox's) of image REF, named REF in
# its index so that ctr imports it under that name. Rebuilt when its inputs
# (the binaries, this script, the name) changed; their digest is a label.
build_image() {
	local short=$1 ref=$2 file=$out/$1.tar inputs layout bundle
	inputs=$({
		sha256sum "$BUSYBOX" "${BASH_SOURCE[0]}"
		[ "$short" = agnhost ] && sha256sum "$bin/agnhost"
		[ "$short" = hello-populator ] && sha256sum "$bin/hello-populator"
		[ "$short" = jessie-dnsutils ] && sha256sum /usr/bin/dd /usr/bin/dash
		echo "$ref"
	} | sha256sum | cut -c1-64)
	if [ -f "$file" ] && [ "$(tar -xOf "$file" index.json 2>/dev/null |
		jq -r '.manifests[0].annotations["org.opencontainers.image.ref.name"]')" = "$ref" ] &&
		[ "$(cat "$out/.$short.inputs" 2>/dev/null)" = "$inputs" ]; then
		return
	fi
	log "building $ref into $file"
	layout=$scratch/$short-layout
	bundle=$scratch/$short-bundle
	rm -rf "$layout" "$bundle"
	umoci init --layout "$layout"
	umoci new --image "$layout:build"
	umoci unpack --image "$layout:build" "$bundle"
	busybox_rootfs "$bundle/rootfs"
	if [ "$short" = agnhost ]; then
		agnhost_users "$bundle/rootfs"
		install -m 755 "$bin/agnhost" "$bundle/rootfs/agnhost"
		ln -s agnhost "$bundle/rootfs/agnhost-2"
	fi
	[ "$short" = hello-populator ] && install -m 755 "$bin/hello-populator" "$bundle/rootfs/hello-populator"
	[ "$short" = jessie-dnsutils ] && gnu_dd "$bundle/rootfs"
	umoci repack --image "$layout:build" "$bundle"
	# shellcheck disable=SC2046 # one option a word
	umoci config --image "$layout:build" \
		--config.env=PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
		--config.label="io.oxhorn.stand-in=$(stand_in_of "$short")" \
		--config.label="io.oxhorn.inputs=$inputs" \
		$(config_of "$short")
	# umoci names the image by its tag alone; ctr wants the full name.
	jq --arg ref "$ref" \
		'.manifests |= map(.annotations["org.opencontainers.image.ref.name"] = $ref)' \
		"$layout/index.json" >"$scratch/index.json"
	mv "$scratch/index.json" "$layout/index.json"
	# Not *.tar until complete: readers take every *.tar of the directory.
	tar -C "$layout" -cf "$out/.$short.tar.partial" .
	mv -f "$out/.$short.tar.partial" "$file"
	echo "$inputs" >"$out/.$short.inputs"
	rm -rf "$layout" "$bundle"
}

build_e2e_test
agnhost_ref=$(image_ref Agnhost)
[ "$(cat "$kube_src/test/images/agnhost/VERSION")" = "${agnhost_ref##*:}" ] ||
	die "test/images/agnhost/VERSION is not the tag manifest.go gives agnhost ($agnhost_ref)"
build_agnhost "${agnhost_ref##*:}"
build_hello_populator
build_image busybox "$(image_ref BusyBox)"
build_image agnhost "$agnhost_ref"
build_image nginx "$(image_ref Nginx)"
build_image jessie-dnsutils "$(image_ref JessieDnsutils)"
build_image hello-populator "$(populator_ref)"
log "e2e.test in $bin, images ready in $out"
echo "$out"
