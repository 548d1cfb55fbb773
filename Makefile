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

# test: everything CI runs. Later issues append their suites here.
test: test-unit

test-unit:
	$(GO) test -race -count=1 ./...

lint:
	@bad=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$bad" ]; then echo "gofmt:"; echo "$$bad"; exit 1; fi
	$(GO) vet ./...
	GOOS=windows $(GO) vet ./...
	$(GO) run $(GOLANGCI) run ./...

fuzz:
	$(GO) test ./pkg/cache -run '^$$' -fuzz FuzzCache -fuzztime 30s

clean:
	rm -rf $(BIN) .build

# test-kernel: the real-kernel suites of the Linux backend (network
# namespaces, kproxy as a process, real TCP/UDP traffic). Needs root,
# iproute2 and iptables; without them the tests skip, and under CI=true that
# is a failure. One package at a time: they measure latencies. The e2e suite
# runs twice, on iptables-nft and on iptables-legacy.
.PHONY: test-kernel demo
test: test-kernel

test-kernel:
	KPROXY_KERNEL_TESTS=1 $(GO) test -race -count=1 -p 1 -timeout 15m ./platform/linux/ ./platform/linux/netns/... ./platform/linux/e2e/...
	KPROXY_KERNEL_TESTS=1 KPROXY_E2E_FLAVOUR=legacy $(GO) test -race -count=1 -timeout 15m ./platform/linux/e2e/

# demo: kproxy in throwaway namespaces: ClusterIP and NodePort traffic, the
# spread over three pods, an endpoint removed (root; installs iproute2 and
# iptables with apt-get when missing).
demo:
	./platform/linux/e2e/demo.sh

# test-windows: the Windows test binaries of platform/windows and cmd/kproxy, cross-compiled
# and run under Wine through the generic `go test -exec` wrapper
# platform/windows/wine/exec.sh. setup.sh installs wine64 and the MinGW-w64
# binutils with apt-get when missing and prepares the Wine prefix in
# .build/wine (with the bcryptprimitives.dll forwarder Go needs).
.PHONY: test-windows
test: test-windows

test-windows:
	./platform/windows/wine/setup.sh
	GOOS=windows $(GO) test -count=1 -exec "$(CURDIR)/platform/windows/wine/exec.sh" ./platform/windows/... ./cmd/kproxy/...
