package app

import (
	"net/http"
	"net/http/pprof"
)

// installProfiling serves Go's runtime profiles under /debug/pprof/ (heap,
// goroutine, profile, trace, ...), as upstream kube-proxy does on its metrics
// server when enableProfiling is set. Off by default: profiles reveal
// internals and a CPU profile costs CPU while it runs.
func installProfiling(mux *http.ServeMux) {
	mux.HandleFunc("/debug/pprof/", pprof.Index)
	mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
	mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
}
