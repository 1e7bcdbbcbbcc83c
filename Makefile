# Waggle's build. `make help` lists the targets.
SHELL := /bin/bash
GO ?= go
BIN := bin
PKG := github.com/waggle-io/waggle
VERSION ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
LDFLAGS := -s -w -X $(PKG)/internal/version.Version=$(VERSION)
# static_build drops containerd's Go-plugin loader (Waggle loads no containerd
# plugins); Go's plugin package makes the linker keep every exported symbol,
# about a quarter of the binary (106 MB -> 81 MB).
BUILD_TAGS := static_build
# Debian packages the build and the tests need (binary:package).
# A path is checked with test -e (headers), a name with command -v.
APT_DEPS := containerd:containerd runc:runc iptables:iptables clang:clang llvm-strip:llvm \
	bpftool:bpftool ip:iproute2 nft:nftables conntrack:conntrack nsenter:util-linux \
	docker-registry:docker-registry cc:gcc make:make bzip2:bzip2 curl:curl
# Test tiers: TEST_FLAGS=-short gives the unit tier only.
TEST_TIMEOUT ?= 20m
TEST_FLAGS ?=
# Flags of `waggle bench dataplane` in `make bench` (e.g. --rounds 5 --duration 2s).
BENCH_DATAPLANE_FLAGS ?=

.PHONY: help deps build images generate test test-unit test-race lint bench up lab conformance conformance-readme clean

help: ## list the targets
	@grep -hE '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-12s %s\n", $$1, $$2}'

deps: ## install the Debian packages the build and tests need (apt, only what is missing)
	@missing=""; for d in $(APT_DEPS); do w=$${d%%:*}; \
		case $$w in /*) [ -e $$w ] ;; *) command -v $$w >/dev/null 2>&1 ;; esac || missing="$$missing $${d##*:}"; done; \
	if [ -n "$$missing" ]; then \
		echo "installing:$$missing"; \
		apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q $$missing; \
	fi
	@mountpoint -q /sys/fs/bpf || mount -t bpf bpf /sys/fs/bpf

build: ## build bin/waggle, the container logger (bin/waggle-container-logger) and the CNI plugin (bin/waggle-cni, installed for CNI as bin/cni/waggle)
	$(GO) build -tags $(BUILD_TAGS) -ldflags '$(LDFLAGS)' -o $(BIN)/waggle ./cmd/waggle
	$(GO) build -ldflags '$(LDFLAGS)' -o $(BIN)/waggle-container-logger ./cmd/waggle-container-logger
	$(GO) build -tags $(BUILD_TAGS) -ldflags '$(LDFLAGS)' -o $(BIN)/waggle-cni ./cmd/waggle-cni
	@mkdir -p $(BIN)/cni && ln -f $(BIN)/waggle-cni $(BIN)/cni/waggle

images: ## build the waggle-echo workload image as an OCI archive (bin/images/waggle-echo.tar, no Docker)
	CGO_ENABLED=0 $(GO) build -ldflags '-s -w' -o $(BIN)/waggle-echo ./cmd/waggle-echo
	$(GO) build -tags $(BUILD_TAGS) -ldflags '$(LDFLAGS)' -o $(BIN)/waggle ./cmd/waggle
	$(BIN)/waggle images build-echo --binary $(BIN)/waggle-echo --output $(BIN)/images/waggle-echo.tar

generate: ## regenerate the eBPF objects (bpf2go, the pinned clang, the headers vendored in bpf/include)
	$(GO) generate ./...

test: deps ## run every test tier this machine can run (unit, integration as root, end-to-end)
	$(GO) test -p 2 -timeout $(TEST_TIMEOUT) $(TEST_FLAGS) ./...

test-unit: ## run the unit tests only (no root needed)
	$(GO) test -short -timeout 5m ./...

# Packages left out of test-race (a regular expression over import paths;
# empty: none). The Job controller's tests, once left out, pass 20 of 20
# runs under -race since ctrltest refuses stale writes and the controller
# waits for its own status writes.
RACE_EXCLUDE :=

test-race: ## run the unit tests under the race detector (CI runs it after make test)
	$(GO) test -race -short -timeout 25m $$($(GO) list ./... | { if [ -n '$(RACE_EXCLUDE)' ]; then grep -Ev '$(RACE_EXCLUDE)'; else cat; fi; })

lint: ## gofmt, go vet, and the non-Linux build (the *_other.go stubs must keep up with their Linux sides)
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi
	$(GO) vet ./...
	GOOS=darwin $(GO) build ./...

bench: deps build ## run the benchmarks and print their tables
	$(GO) test -run '^$$' -bench . -benchtime 1x ./controlplane/...
	$(GO) test -run '^$$' -bench 'PodStartup' -benchtime 1x -timeout 15m ./kubelet/
	$(GO) test -run '^$$' -bench AddDel -benchtime 1000x ./cni/
	$(GO) test -run '^$$' -bench ClusterIPQuery -benchtime 100000x ./clusterdns/
	$(BIN)/waggle bench dataplane --output $(BIN)/bench-dataplane.json $(BENCH_DATAPLANE_FLAGS)
	$(BIN)/waggle bench policy --rounds 5 --output $(BIN)/bench-policy.json

up: deps build images ## run a single-machine cluster (waggle up); Ctrl-C stops it, running it again resumes it
	$(BIN)/waggle up --data-dir $${WAGGLE_DATA_DIR:-/var/lib/waggle} --image-dir $(BIN)/images

lab: deps build images ## run a multi-node lab on this machine (waggle lab up; waggle lab down removes it)
	$(BIN)/waggle lab up --nodes $${NODES:-3} --image-dir $(BIN)/images

conformance: deps build ## upstream conformance suite on a fresh 3-node lab (FOCUS= SKIP= LABEL= PARALLEL= SMOKE=1 UPDATE=1; see test/conformance/run.sh)
	FOCUS='$(value FOCUS)' SKIP='$(value SKIP)' LABEL='$(LABEL)' PARALLEL='$(PARALLEL)' SMOKE='$(SMOKE)' UPDATE='$(UPDATE)' CHECK='$(CHECK)' \
		TIMEOUT='$(TIMEOUT)' KEEP='$(KEEP)' test/conformance/run.sh

conformance-readme: ## regenerate the README's conformance table from test/conformance/expectations.tsv
	cd test/conformance && $(GO) run ./summary -expectations expectations.tsv -readme ../../README.md

clean: ## remove build outputs
	rm -rf $(BIN)

# The VM lab (docs/lab.md): not part of `make test`.
VM_APT_DEPS := vagrant vagrant-libvirt libvirt-daemon-system libvirt-daemon-driver-qemu qemu-system-x86 qemu-utils \
	debootstrap grub-pc-bin fdisk dnsmasq-base rsync
vm-deps: ## install the Debian packages the VM lab needs (apt, only what is missing)
	@missing=""; for p in $(VM_APT_DEPS); do dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then echo "installing:$$missing"; apt-get update -q && \
		DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends $$missing; fi

vm-lab: vm-deps build images ## build the waggle-debian Vagrant box locally (debootstrap, qcow2, vagrant box add)
	hack/vm-box.sh $${WAGGLE_VM_WORK:-/tmp/waggle-vm}/box waggle-debian

vm-lab-test: vm-deps build images ## boot 3 TCG VMs (1 vCPU, 1 GiB), check the cluster end to end, destroy them
	hack/vm-lab-test.sh
