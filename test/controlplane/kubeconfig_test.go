package controlplane

import (
	"bytes"
	"testing"

	"k8s.io/client-go/tools/clientcmd"
)

func TestKubeconfig(t *testing.T) {
	cp := &ControlPlane{
		URL: "https://[fd00::10]:6443", CAPEM: []byte("-----CA-----"),
		AdminToken: "admin-token", KproxyToken: "kproxy-token",
	}
	tests := []struct {
		id        Identity
		wantToken string
		wantErr   bool
	}{
		{id: Admin, wantToken: "admin-token"},
		{id: Kproxy, wantToken: "kproxy-token"},
		{id: "root", wantErr: true},
	}
	for _, tt := range tests {
		t.Run(string(tt.id), func(t *testing.T) {
			data, err := cp.Kubeconfig(tt.id)
			if (err != nil) != tt.wantErr {
				t.Fatalf("Kubeconfig error = %v, wantErr %v", err, tt.wantErr)
			}
			if tt.wantErr {
				return
			}
			// Read it back the way kproxy --kubeconfig does.
			cfg, err := clientcmd.RESTConfigFromKubeConfig(data)
			if err != nil {
				t.Fatalf("kubeconfig does not load: %v\n%s", err, data)
			}
			if cfg.Host != cp.URL || cfg.BearerToken != tt.wantToken || !bytes.Equal(cfg.CAData, cp.CAPEM) {
				t.Errorf("loaded host %q token %q CA %q; want %q %q %q", cfg.Host, cfg.BearerToken, cfg.CAData, cp.URL, tt.wantToken, cp.CAPEM)
			}

			rc, err := cp.RESTConfig(tt.id)
			if err != nil {
				t.Fatal(err)
			}
			if rc.Host != cp.URL || rc.BearerToken != tt.wantToken || !bytes.Equal(rc.CAData, cp.CAPEM) {
				t.Errorf("RESTConfig = host %q token %q CA %q", rc.Host, rc.BearerToken, rc.CAData)
			}
		})
	}
}
