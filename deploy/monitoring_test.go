package deploy

import (
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
	"testing"

	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/kyaml/filesys"
	sigsyaml "sigs.k8s.io/yaml"
)

// TestMonitoringKustomization renders deploy/monitoring and checks what
// Grafana's sidecar and the Prometheus Operator read: a ConfigMap labelled
// grafana_dashboard holding kproxy-dashboard.json byte for byte (valid
// JSON, with panels), and a PrometheusRule whose groups are those of the
// plain rules file kproxy-rules.yaml. The queries themselves, and promtool's
// unit tests of the rules, are checked in hack/tools (make test-tools).
func TestMonitoringKustomization(t *testing.T) {
	m, err := krusty.MakeKustomizer(krusty.MakeDefaultOptions()).Run(filesys.MakeFsOnDisk(), monitoringDir)
	if err != nil {
		t.Fatal(err)
	}
	raw, err := os.ReadFile(filepath.Join(monitoringDir, "kproxy-dashboard.json"))
	if err != nil {
		t.Fatal(err)
	}
	var rules struct {
		Groups []any `json:"groups"`
	}
	data, err := os.ReadFile(filepath.Join(monitoringDir, "kproxy-rules.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if err := sigsyaml.UnmarshalStrict(data, &rules); err != nil || len(rules.Groups) == 0 {
		t.Fatalf("kproxy-rules.yaml: %v (%d groups)", err, len(rules.Groups))
	}
	var sawDashboard, sawRule bool
	for _, r := range m.Resources() {
		o, err := r.Map()
		if err != nil {
			t.Fatal(err)
		}
		switch r.GetKind() {
		case "ConfigMap":
			sawDashboard = true
			if r.GetLabels()["grafana_dashboard"] != "1" {
				t.Errorf("ConfigMap %s: labels %v, want grafana_dashboard: \"1\" (the sidecar's default label)", r.GetName(), r.GetLabels())
			}
			d, _ := o["data"].(map[string]any)
			js, _ := d["kproxy.json"].(string)
			if js != string(raw) {
				t.Errorf("ConfigMap %s: kproxy.json is not kproxy-dashboard.json", r.GetName())
			}
			var dash struct {
				SchemaVersion int   `json:"schemaVersion"`
				Panels        []any `json:"panels"`
			}
			if err := json.Unmarshal([]byte(js), &dash); err != nil || dash.SchemaVersion == 0 || len(dash.Panels) == 0 {
				t.Errorf("the dashboard does not load: %v (schemaVersion %d, %d panels)", err, dash.SchemaVersion, len(dash.Panels))
			}
		case "PrometheusRule":
			sawRule = true
			spec, _ := o["spec"].(map[string]any)
			if !reflect.DeepEqual(spec["groups"], rules.Groups) {
				t.Errorf("PrometheusRule %s: its groups differ from kproxy-rules.yaml's (edit both)", r.GetName())
			}
		default:
			t.Errorf("unexpected %s %s", r.GetKind(), r.GetName())
		}
	}
	if !sawDashboard || !sawRule {
		t.Errorf("dashboard ConfigMap %v, PrometheusRule %v: want both", sawDashboard, sawRule)
	}
}
