package app

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strings"

	"github.com/kproxy/kproxy/pkg/config"
	"github.com/kproxy/kproxy/pkg/metrics"
)

// configzGroup is the key of /configz's one entry, as upstream's.
const configzGroup = "kubeproxy.config.k8s.io"

// metricsMux is the metrics server's handler, with upstream kube-proxy's
// URLs: /metrics, /healthz ("ok" while the process serves), /proxyMode (the
// mode kproxy runs: iptables for mode ipvs or nftables too, since that is
// what is programmed), /configz (the effective KubeProxyConfiguration under
// "kubeproxy.config.k8s.io"), /flagz (every flag and its value) and, with
// enableProfiling, /debug/pprof/.
func metricsMux(o *config.Options, m *metrics.Metrics) *http.ServeMux {
	mux := http.NewServeMux()
	mux.Handle("/metrics", m.Handler())
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		w.Header().Set("X-Content-Type-Options", "nosniff")
		_, _ = fmt.Fprint(w, "ok")
	})
	mode := string(o.ProxyMode())
	mux.HandleFunc("/proxyMode", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		w.Header().Set("X-Content-Type-Options", "nosniff")
		_, _ = fmt.Fprint(w, mode)
	})
	configz, err := json.Marshal(map[string]any{configzGroup: o.Config})
	mux.HandleFunc("/configz", func(w http.ResponseWriter, _ *http.Request) {
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write(configz)
	})
	flagz := "kproxy flags\nWarning: This endpoint is not meant to be machine parseable, has no formatting compatibility guarantees and is for debugging purposes only.\n\n" +
		strings.Join(o.Flagz(), "\n") + "\n"
	mux.HandleFunc("/flagz", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		w.Header().Set("X-Content-Type-Options", "nosniff")
		_, _ = fmt.Fprint(w, flagz)
	})
	if o.Config.EnableProfiling {
		installProfiling(mux)
	}
	return mux
}
