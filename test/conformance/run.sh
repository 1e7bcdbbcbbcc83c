#!/usr/bin/env bash
# The conformance harness behind `make conformance`: the upstream Kubernetes conformance suite
# (the [Conformance] specs of k8s.io/kubernetes/test/e2e, of the version test/conformance/go.mod
# pins) against a fresh 3-node `waggle lab` with real pods.
#
#   make conformance [FOCUS=regex] [SKIP=regex] [LABEL=filter] [PARALLEL=n] [SMOKE=1] [UPDATE=1] [CHECK=0] [TIMEOUT=90m]
#
#   FOCUS, SKIP  ginkgo --focus/--skip over the [Conformance] specs (e.g. FOCUS=sig-network)
#   LABEL        ginkgo --label-filter (default Conformance); LABEL=none runs specs of any label
#                (e.g. the NetworkPolicy specs, which are not [Conformance]: LABEL=none
#                FOCUS='\[sig-network\] Netpol'); such a run is not compared with
#                expectations.tsv (UPDATE and SMOKE need LABEL=Conformance): ginkgo's own
#                passed/failed counts and junit.xml are its result
#   PARALLEL     ginkgo processes (default 4); [Serial] specs still run alone, at the end
#   SMOKE=1      only the CI subset: the specs test/conformance/smoke.txt names (full names)
#   UPDATE=1     rewrite test/conformance/expectations.tsv from this run (and record the run in
#                its header), then the README's conformance table from that file
#   CHECK=0      do not fail when a spec the expectations file marks pass does not pass
#   TIMEOUT      ginkgo's suite timeout; specs not reached by then are reported as not run
#   KEEP=1       leave the lab up afterwards (then: bin/waggle lab down --data-dir <printed dir>)
#
# Built once per suite version and cached outside the clone (WAGGLE_CONFORMANCE_CACHE, default
# /var/cache/waggle/conformance/<version>/): e2e-stamped.test (~15 min on 2 cores), ginkgo, the images.
# Each run takes a free slot 1..8 (a lock file), which gives its lab its own name (confN),
# bridge, subnets, ports and data dir, so several harnesses and other labs run side by side.
#
# Flags the suite is given, and why:
#   --provider=skeleton        no cloud: the hosted-cloud specs' preconditions skip themselves
#   --disable-log-dump         the log dump copies node logs over SSH from cloud VMs; the lab's
#                              logs stay in its data dir (printed on failure)
#   --allowed-not-ready-nodes=0 --minStartupPods=0   (defaults, spelled out) Waggle runs no
#                              kube-system pods: nothing to wait for
#   --e2e-verify-service-account stays on.
set -euo pipefail
# (Edit this file by writing a new one and renaming it over: bash reads a running script as it
# goes, so an in-place edit changes what a harness already running executes next.)
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
FOCUS="${FOCUS:-}"
SKIP="${SKIP:-}"
PARALLEL="${PARALLEL:-4}"
SMOKE="${SMOKE:-}"
UPDATE="${UPDATE:-}"
CHECK="${CHECK:-1}"
TIMEOUT="${TIMEOUT:-90m}"
LABEL="${LABEL:-Conformance}"
if [ "$LABEL" != Conformance ] && { [ -n "$UPDATE" ] || [ -n "$SMOKE" ]; }; then
	echo "UPDATE=1 and SMOKE=1 compare with expectations.tsv, which lists [Conformance] specs: not with LABEL=$LABEL" >&2
	exit 2
fi
KEEP="${KEEP:-}"

ver="$(awk '$1=="require" && $2=="k8s.io/kubernetes" {print $3}' "$here/go.mod")"
cache="${WAGGLE_CONFORMANCE_CACHE:-/var/cache/waggle/conformance}/$ver"
mkdir -p "$cache"
log() { printf '[conformance %s] %s\n' "$(date +%H:%M:%S)" "$*"; }

# --- the suite, the runner and the images: built once per version (one builder at a time) ---
exec 9>"$cache/.build.lock"
flock 9
# Stamped with its version as upstream's release builds are (hack/lib/version.sh): specs that
# read the suite's own version (the PodCertificate mTLS spec's pod-security fixture for
# "restricted" at this release) find v0.0 otherwise. (e2e-stamped.test: the unstamped e2e.test
# of older checkouts of this script stays as it was.)
suite="$cache/e2e-stamped.test"
if [ ! -x "$suite" ]; then
	log "building e2e.test $ver (once per version, ~15 minutes on 2 cores) into $suite"
	major="${ver#v}"; major="${major%%.*}"
	minor="${ver#v*.}"; minor="${minor%%.*}"
	ldflags=""
	for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
		ldflags="$ldflags -X $pkg.gitVersion=$ver -X $pkg.gitMajor=$major -X $pkg.gitMinor=$minor -X $pkg.gitTreeState=clean"
	done
	(cd "$here" && nice -n 10 go test -c -vet=off -ldflags "$ldflags" -o "$suite.tmp" k8s.io/kubernetes/test/e2e)
	mv "$suite.tmp" "$suite"
fi
if [ ! -x "$cache/ginkgo" ]; then
	(cd "$here" && go build -o "$cache/ginkgo" github.com/onsi/ginkgo/v2/ginkgo)
fi
if [ ! -s "$cache/specs.txt" ]; then
	# Every [Conformance] spec of the suite, by full name.
	"$suite" --list-tests 2>/dev/null | sed -n 's/^    [^ ]*:[0-9]*: //p' | grep -F '[Conformance]' | sort -u >"$cache/specs.tmp"
	mv "$cache/specs.tmp" "$cache/specs.txt"
fi
imgkey="$(cat "$here/images/images.sh" "$here/images/pause.c" | sha256sum | cut -c1-12)"
images="$cache/images-$imgkey"
"$here/images/images.sh" "$root/bin/waggle" "$images"
flock -u 9
log "suite $ver: $(wc -l <"$cache/specs.txt") [Conformance] specs; images in $images"

# --- what to run ---
ginkgo_flags=(--procs "$PARALLEL" --timeout "$TIMEOUT" --no-color
	--junit-report junit.xml --json-report report.json --poll-progress-after 5m --silence-skips)
[ "$LABEL" != none ] && ginkgo_flags+=(--label-filter "$LABEL")
if [ -n "$SMOKE" ]; then
	# The smoke.txt specs that expectations.tsv marks pass, each matched by its full name
	# (escaped; ginkgo matches "<suite> <spec>").
	n=0
	while IFS= read -r l; do
		case "$l" in "" | "#"*) continue ;; esac
		grep -qxF "pass	-	$l" "$here/expectations.tsv" || continue
		ginkgo_flags+=(--focus " $(printf '%s' "$l" | sed 's/[][\.*^$(){}?+|/]/\\&/g')\$")
		n=$((n + 1))
	done <"$here/smoke.txt"
	if [ "$n" -eq 0 ]; then
		log "smoke: none of the $(grep -vc '^#' "$here/smoke.txt") smoke.txt specs passes in expectations.tsv yet: nothing to gate on"
		exit 0
	fi
	log "smoke: $n specs"
fi
[ -n "$FOCUS" ] && ginkgo_flags+=(--focus "$FOCUS")
[ -n "$SKIP" ] && ginkgo_flags+=(--skip "$SKIP")

# --- a slot: the lab's own name, bridge, subnets, ports and data dir ---
slot=""
for n in 1 2 3 4 5 6 7 8; do
	exec 8>"/run/waggle-conformance-$n.lock"
	if flock -n 8; then slot=$n; break; fi
done
[ -n "$slot" ] || { echo "no free conformance slot (8 harnesses running?)" >&2; exit 1; }
name="conf$slot"
data="/var/lib/waggle-conformance/$slot"
lab_flags=(--data-dir "$data")
results="$root/bin/conformance/$(date +%Y%m%d-%H%M%S)-$name"
mkdir -p "$results"

teardown() {
	local rc=$?
	trap - EXIT INT TERM
	if [ -n "$KEEP" ]; then
		log "KEEP=1: the lab stays up; remove it with: $root/bin/waggle lab down --data-dir $data"
	else
		log "tearing the lab down"
		"$root/bin/waggle" lab down "${lab_flags[@]}" >"$results/lab-down.log" 2>&1 ||
			"$root/bin/waggle" lab down "${lab_flags[@]}" >>"$results/lab-down.log" 2>&1 ||
			echo "lab down left something behind: see $results/lab-down.log" >&2
	fi
	exit "$rc"
}
trap teardown EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# A lab left by a killed run of this slot goes first.
"$root/bin/waggle" lab down "${lab_flags[@]}" >/dev/null 2>&1 || true
log "lab $name: 3 nodes on wgconf$slot 10.213.$slot.0/24, API server https://10.213.$slot.1:$((17440 + slot))"
start_lab=$(date +%s)
if ! "$root/bin/waggle" lab up "${lab_flags[@]}" --nodes 3 --name "$name" --bridge "wgconf$slot" \
	--subnet "10.213.$slot.0/24" --cluster-cidr "10.$((120 + slot)).0.0/16" --service-cidr "10.$((130 + slot)).0.0/16" \
	--api-port $((17440 + slot)) --scheduler-port $((17250 + slot)) --controller-manager-port $((17260 + slot)) \
	--image-dir "$images" --local-registries registry.k8s.io >"$results/lab-up.log" 2>&1; then
	cat "$results/lab-up.log" >&2
	echo "lab up failed; its logs are in $data/logs" >&2
	cp -r "$data/logs" "$results/lab-logs" 2>/dev/null || true
	exit 1
fi
log "lab up in $(($(date +%s) - start_lab)) s"
kubeconfig="$data/control-plane/admin.kubeconfig"

# --- the run ---
ginkgo_flags+=(--output-dir "$results")
e2e_flags=(--kubeconfig "$kubeconfig" --provider skeleton --disable-log-dump
	--allowed-not-ready-nodes 0 --minStartupPods 0 --report-dir "$results/e2e"
	--e2e-output-dir "$results/e2e" --kubectl-path "$(command -v kubectl || echo kubectl)")
mkdir -p "$results/e2e"
log "running: ginkgo ${ginkgo_flags[*]} e2e.test -- ${e2e_flags[*]}"
log "output: $results/e2e.log"
start=$(date +%s)
set +e
(cd "$results" && "$cache/ginkgo" "${ginkgo_flags[@]}" "$suite" -- "${e2e_flags[@]}") >"$results/e2e.log" 2>&1
ginkgo_rc=$?
set -e
dur=$(($(date +%s) - start))
log "suite finished in $((dur / 60))m$((dur % 60))s (ginkgo exit $ginkgo_rc)"
if [ ! -s "$results/junit.xml" ]; then
	tail -50 "$results/e2e.log" >&2
	echo "no JUnit report: the suite did not run (see $results/e2e.log)" >&2
	cp -r "$data/logs" "$results/lab-logs" 2>/dev/null || true
	exit 1
fi
grep -E '^(Ran [0-9]+ of|FAIL!|SUCCESS!|PASS|Test Suite)' "$results/e2e.log" | tail -3 || true
cp -r "$data/logs" "$results/lab-logs" 2>/dev/null || true

if [ "$LABEL" != Conformance ]; then
	# Not [Conformance] specs: nothing in expectations.tsv to compare with.
	echo "duration: $((dur / 60))m$((dur % 60))s, procs $PARALLEL, suite $ver, LABEL=$LABEL; report: $results"
	exit "$ginkgo_rc"
fi
summary_flags=(-junit "$results/junit.xml" -expectations "$here/expectations.tsv" -specs "$cache/specs.txt")
if [ -n "$UPDATE" ]; then
	# Record the run in the file's header (a run of the whole set, or what focused it) and
	# regenerate the README's table from the file, so the two always match.
	what="$FOCUS"
	[ -n "$SMOKE" ] && what="smoke.txt${what:+ $what}"
	[ -n "$SKIP" ] && what="${what:-.} SKIP=$SKIP"
	summary_flags+=(-update -record -suite "$ver" -procs "$PARALLEL" -duration "${dur}s" -focus "$what"
		-commit "$(git -C "$root" rev-parse --short HEAD 2>/dev/null || echo unknown)" -readme "$root/README.md")
fi
[ "$CHECK" = 1 ] && summary_flags+=(-check)
echo
set +e
(cd "$here" && go run ./summary "${summary_flags[@]}") 2>&1 | tee "$results/summary.txt"
rc=${PIPESTATUS[0]}
set -e
echo "duration: $((dur / 60))m$((dur % 60))s, procs $PARALLEL, suite $ver; report: $results"
exit "$rc"
