// Package tools is a module of its own (hack/tools/go.mod) for what kproxy
// ships beside its binary and that needs heavy upstream code to check: the
// Helm chart (charts/kproxy, checked with helm v4's own binary), the
// Grafana dashboard and the alert rules (deploy/monitoring, checked with
// Prometheus's PromQL parser and promtool). Its own go.mod keeps helm's and
// Prometheus's dependencies out of kproxy's: `go test ./...` of the main
// module never builds them. `make test-tools` runs these tests; `make
// tools` builds helm and promtool into .build/tools/ (see tool.go), once per
// version.
package tools
