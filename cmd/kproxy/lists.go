package main

import (
	clientfeatures "k8s.io/client-go/features"
)

// watchListEnv is the environment variable of client-go's WatchListClient
// gate (client-go reads KUBE_FEATURE_<gate>).
const watchListEnv = "KUBE_FEATURE_" + string(clientfeatures.WatchListClient)

// listGates are client-go's feature gates as the environment sets them,
// with WatchListClient off.
type listGates struct{ env clientfeatures.Gates }

func (g listGates) Enabled(f clientfeatures.Feature) bool {
	if f == clientfeatures.WatchListClient {
		return false
	}
	return g.env.Enabled(f)
}

// tuneLists turns client-go's streaming initial lists (WatchListClient, on
// by default in client-go 1.37) off unless the environment sets the gate:
// kproxy's informers then list in pages, which is what its start waits
// for. Measured with make bench-cluster at 10,000 Services and their
// slices on 2 cores shared with the API server: the initial lists took
// 1.9 s streamed and 0.67 s in pages (docs/benchmarks.md). Streaming spares
// the API server the memory of a list; a page of 500 objects from its watch
// cache costs little of that. KUBE_FEATURE_WatchListClient=true brings it
// back. It returns whether the gate is on, and must run before any client
// is made.
func tuneLists(getenv func(string) string) bool {
	if getenv(watchListEnv) != "" {
		return clientfeatures.FeatureGates().Enabled(clientfeatures.WatchListClient)
	}
	clientfeatures.ReplaceFeatureGates(listGates{env: clientfeatures.FeatureGates()})
	return false
}
