# kproxy — see README.md. Every target runs from a clean clone.
GO        ?= go
BIN       ?= bin
VERSION   ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
LDFLAGS   := -X github.com/kproxy/kproxy/pkg/version.Version=$(VERSION)
GOLANGCI  := github.com/golangci/golangci-lint/v2/cmd/golangci-lint@v2.6.2

.PHONY: build test test-unit lint fuzz clean

build:
	$(GO) build -ldflags '$(LDFLAGS)' -o $(BIN)/kproxy ./cmd/kproxy
	GOOS=windows $(GO) build -ldflags '$(LDFLAGS)' -o $(BIN)/kproxy.exe ./cmd/kproxy

# images: the Linux image as an OCI archive, $(IMAGE_DIR)/kproxy-linux-amd64.oci.tar,
# offline, without a container engine or registry: kproxy (static, with
# VERSION) plus Debian's iptables, nftables, conntrack, ipset, kmod and dash
# with their dependency closure, downloaded with apt-get into
# $(IMAGE_DIR)/debs (the machine's package lists: apt-get update first) and
# unpacked with dpkg-deb (pkg/image). Fails if a tool kproxy runs is
# missing; prints the digest, which is the same for every build of the
# same commit and package versions (SOURCE_DATE_EPOCH: the last commit's
# time). image-windows: kproxy.exe and the HostProcess build context (see
# deploy/windows/build.sh).
IMAGE_DIR         ?= $(CURDIR)/.build/images
IMAGE_NAME        ?= ghcr.io/kproxy/kproxy
SOURCE_DATE_EPOCH ?= $(shell git log -1 --format=%ct 2>/dev/null || echo 0)
IMAGE_LDFLAGS     := -s -w $(LDFLAGS)
.PHONY: images image-windows test-image
images:
	CGO_ENABLED=0 GOOS=linux GOARCH=amd64 $(GO) build -trimpath -ldflags '$(IMAGE_LDFLAGS)' -o $(IMAGE_DIR)/linux-amd64/kproxy ./cmd/kproxy
	$(GO) run ./pkg/image/cmd/kproxy-image -kproxy $(IMAGE_DIR)/linux-amd64/kproxy -version $(VERSION) \
		-epoch $(SOURCE_DATE_EPOCH) -name $(IMAGE_NAME) -cache $(IMAGE_DIR)/debs -out $(IMAGE_DIR)/kproxy-linux-amd64.oci.tar

# test: everything CI runs, in this order. The control plane (etcd and
# kube-apiserver built from Go modules, many minutes cold) is built first so
# that no test package meets a cold build inside its go test deadline.
test: controlplane vet test-unit test-fuzz test-kernel test-image test-windows test-integration

test-unit:
	$(GO) test -race -count=1 ./...

# vet: gofmt and go vet for linux and windows (part of test; lint adds
# golangci-lint).
.PHONY: vet
vet:
	@bad=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$bad" ]; then echo "gofmt:"; echo "$$bad"; exit 1; fi
	$(GO) vet ./...
	GOOS=windows $(GO) build ./...
	GOOS=windows $(GO) vet ./...

lint: vet
	$(GO) run $(GOLANGCI) run ./...

fuzz:
	$(GO) test ./pkg/cache -run '^$$' -fuzz FuzzCache -fuzztime 30s
	$(GO) test ./platform/linux/rules -run '^$$' -fuzz FuzzPlanner -fuzztime 30s

# test-fuzz: the short fuzz run CI does on top of the seed corpus (which
# test-unit runs): random Services and EndpointSlices thrown at the cache, and
# random service ports (names of any bytes) thrown at the iptables planner.
# The budget is a count of executions (about 20 s here), not a duration: with
# a duration, Go 1.26's fuzz coordinator can fail a clean run with "context
# deadline exceeded" when the deadline races a busy worker (go.dev/issue/75804,
# fixed in Go 1.27).
.PHONY: test-fuzz
test-fuzz:
	$(GO) test ./pkg/cache -run '^$$' -fuzz FuzzCache -fuzztime 50000x
	$(GO) test ./platform/linux/rules -run '^$$' -fuzz FuzzPlanner -fuzztime 50000x

# clean: a cluster still running is taken down first (its state is in .build).
clean:
	@if [ -d $(CLUSTER_DIR) ]; then $(MAKE) --no-print-directory cluster-down; fi
	rm -rf $(BIN) .build

# test-kernel: the real-kernel suites of the Linux backend (network
# namespaces, kproxy as a process, real TCP/UDP traffic). Needs root,
# iproute2 and iptables; without them the tests skip, and under CI=true that
# is a failure. One package at a time: they measure latencies. The e2e suite
# runs three times: the iptables mode on iptables-nft and on iptables-legacy,
# and the nftables mode.
.PHONY: test-kernel demo

test-kernel:
	KPROXY_KERNEL_TESTS=1 $(GO) test -race -count=1 -p 1 -timeout 15m -skip '^TestImage$$' ./platform/linux/ ./platform/linux/netns/... ./platform/linux/e2e/...
	KPROXY_KERNEL_TESTS=1 KPROXY_E2E_FLAVOUR=legacy $(GO) test -race -count=1 -timeout 15m -skip '^TestImage$$' ./platform/linux/e2e/
	KPROXY_KERNEL_TESTS=1 KPROXY_E2E_MODE=nftables $(GO) test -race -count=1 -timeout 15m -skip '^TestImage$$' ./platform/linux/e2e/

# test-image: make images, then the image run by runc in node1's namespace
# as the DaemonSet runs it (init container, then kproxy with NET_ADMIN and
# NET_RAW), ClusterIP, NodePort and no-endpoints rows with real traffic: on
# iptables-nft, iptables-legacy and in the nftables mode
# (platform/linux/e2e TestImage; root and runc; skips without them, fails
# under CI=true).
test-image: images
	KPROXY_KERNEL_TESTS=1 KPROXY_IMAGE=$(IMAGE_DIR)/kproxy-linux-amd64.oci.tar $(GO) test -count=1 -timeout 5m -run '^TestImage$$' ./platform/linux/e2e/
	KPROXY_KERNEL_TESTS=1 KPROXY_IMAGE=$(IMAGE_DIR)/kproxy-linux-amd64.oci.tar KPROXY_E2E_FLAVOUR=legacy $(GO) test -count=1 -timeout 5m -run '^TestImage$$' ./platform/linux/e2e/
	KPROXY_KERNEL_TESTS=1 KPROXY_IMAGE=$(IMAGE_DIR)/kproxy-linux-amd64.oci.tar KPROXY_E2E_MODE=nftables $(GO) test -count=1 -timeout 5m -run '^TestImage$$' ./platform/linux/e2e/

# demo: kproxy in throwaway namespaces: ClusterIP and NodePort traffic, the
# spread over three pods, an endpoint removed (root; installs iproute2 and
# iptables with apt-get when missing).
demo:
	./platform/linux/e2e/demo.sh

# cluster: a local cluster that keeps running (root; see README's quick start
# and platform/linux/cluster): kube-apiserver and etcd built from Go modules,
# kproxy on node1 (iptables) and node2 (nftables), pods with echo servers,
# all in network namespaces; a daemon owns them, its state, logs and PID in
# CLUSTER_DIR. It prints the KUBECONFIG and what to try. make shell POD=HOST
# [CMD="..."] enters a pod's (or node's) namespace; make cluster-down removes
# everything.
CLUSTER_DIR    ?= $(CURDIR)/.build/cluster
POD            ?= client
KPROXY_CLUSTER := $(CURDIR)/.build/kproxy-cluster
.PHONY: cluster cluster-down shell
cluster:
	@$(GO) build -o $(KPROXY_CLUSTER) ./platform/linux/cluster/cmd/kproxy-cluster
	@$(KPROXY_CLUSTER) -dir $(CLUSTER_DIR) up
cluster-down:
	@$(GO) build -o $(KPROXY_CLUSTER) ./platform/linux/cluster/cmd/kproxy-cluster
	@$(KPROXY_CLUSTER) -dir $(CLUSTER_DIR) down
shell:
	@$(GO) build -o $(KPROXY_CLUSTER) ./platform/linux/cluster/cmd/kproxy-cluster
	@$(KPROXY_CLUSTER) -dir $(CLUSTER_DIR) shell $(POD) $(CMD)

# test-windows: the Windows test binaries of platform/windows and cmd/kproxy, cross-compiled
# and run under Wine through the generic `go test -exec` wrapper
# platform/windows/wine/exec.sh. setup.sh installs wine64 and the MinGW-w64
# binutils with apt-get when missing and prepares the Wine prefix in
# .build/wine (with the bcryptprimitives.dll forwarder Go needs).
.PHONY: test-windows

test-windows:
	./platform/windows/wine/setup.sh
	GOOS=windows $(GO) test -count=1 -exec "$(CURDIR)/platform/windows/wine/exec.sh" ./platform/windows/... ./cmd/kproxy/...

# controlplane: etcd, kube-apiserver, kube-proxy and kubectl built from Go
# modules into .build/controlplane/<versions>/ (many minutes cold; seconds
# once cached; kubectl, built last, adds about 2 minutes to a cold build).
# The integration tests, bench-cluster and make cluster run them; building
# them here first keeps a cold build out of the tests' deadline.
# bench-soak (not in CI): 10 minutes of the API-server source, cache and
# runner against a backend that fails every sync, with EndpointSlices
# churning through node and zone names never seen before; heap and
# goroutines sampled (the curve is in docs/benchmarks.md).
.PHONY: bench-soak
bench-soak:
	KPROXY_SOAK=10m KPROXY_SOAK_OUT=$(CURDIR)/.build/soak.txt $(GO) test ./pkg/source -run '^TestSoak$$' -count=1 -timeout 15m -v

.PHONY: controlplane test-integration bench-cluster
controlplane:
	$(GO) run ./pkg/testing/controlplane/build

# test-integration: kproxy as a process in node1 of a namespace topology,
# against that kube-apiserver and etcd in a "control-plane" namespace on the
# node network, authorized only by deploy/'s RBAC: Services and
# EndpointSlices through the API reach the kernel, a 60 s API-server outage,
# a new cluster behind the same address, node deletion and /healthz,
# objects kproxy cannot fully use. Then make cluster as README's quick start
# uses it (platform/linux/cluster): make cluster, kubectl apply of the example
# Service, curl of its ClusterIP from a pod on each node (iptables and
# nftables) and of its NodePort from outside, make cluster-down, nothing left.
# Root; skips without it, fails under CI=true.

test-integration: controlplane
	KPROXY_KERNEL_TESTS=1 $(GO) test -race -count=1 -p 1 -timeout 20m ./platform/linux/integration/ ./platform/linux/cluster/

# bench-cluster: BENCH_SERVICES Services × 10 endpoints loaded through the
# API, then kproxy's start-to-programmed time, one endpoint change, RSS,
# rules and new connections per second through a ClusterIP, in each of
# BENCH_MODES (iptables: once per BENCH_FLAVOURS) (root; docs/benchmarks.md
# has the results).
# Example: make bench-cluster BENCH_SERVICES=5000 BENCH_MODES=nftables
BENCH_SERVICES ?= 1000,5000,10000
BENCH_FLAVOURS ?= legacy,nft
BENCH_MODES ?= iptables,nftables
bench-cluster: controlplane
	KPROXY_KERNEL_TESTS=1 $(GO) test -run '^$$' -bench BenchmarkCluster -benchtime 1x -timeout 240m \
		./platform/linux/integration/ -args -cluster-bench-services=$(BENCH_SERVICES) -cluster-bench-flavours=$(BENCH_FLAVOURS) \
		-cluster-bench-modes=$(BENCH_MODES)
