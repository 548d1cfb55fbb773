package main

import (
	"testing"

	clientfeatures "k8s.io/client-go/features"
)

// Without KUBE_FEATURE_WatchListClient, kproxy's informers list in pages;
// the other gates keep what the environment says.
func TestTuneLists(t *testing.T) {
	before := clientfeatures.FeatureGates()
	defer clientfeatures.ReplaceFeatureGates(before)
	other := before.Enabled(clientfeatures.InformerResourceVersion)
	if !before.Enabled(clientfeatures.WatchListClient) {
		t.Skip("client-go's default has WatchListClient off already")
	}
	if on := tuneLists(func(k string) string {
		if k == watchListEnv {
			return "true"
		}
		return ""
	}); !on || !clientfeatures.FeatureGates().Enabled(clientfeatures.WatchListClient) {
		t.Errorf("with %s=true: gate on %v, want it left on", watchListEnv, on)
	}
	if on := tuneLists(func(string) string { return "" }); on || clientfeatures.FeatureGates().Enabled(clientfeatures.WatchListClient) {
		t.Errorf("without %s: the gate is on", watchListEnv)
	}
	if clientfeatures.FeatureGates().Enabled(clientfeatures.InformerResourceVersion) != other {
		t.Error("another gate changed")
	}
}
