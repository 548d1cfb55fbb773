package tools

import (
	"bytes"
	"encoding/json"
	"flag"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	logsapi "k8s.io/component-base/logs/api/v1"
	"k8s.io/kube-proxy/config/v1alpha1"
)

var update = flag.Bool("update", false, "rewrite charts/kproxy/values.schema.json")

type schema = map[string]any

func obj(props schema, required ...string) schema {
	s := schema{"type": "object", "additionalProperties": false, "properties": props}
	if len(required) > 0 {
		s["required"] = required
	}
	return s
}

func str(desc string) schema { return schema{"type": "string", "description": desc} }

// freeMap is an object of any keys whose values are of the given schema
// (labels, nodeSelector).
func freeMap(values schema, desc string) schema {
	return schema{"type": "object", "additionalProperties": values, "description": desc}
}

// anyObject is a Kubernetes object the API server validates (resources,
// tolerations, update strategy): the schema only checks its type.
func anyObject(desc string) schema { return schema{"type": "object", "description": desc} }

// configSchema is the schema of a KubeProxyConfiguration field of Go type
// t, derived from upstream's type (k8s.io/kube-proxy/config/v1alpha1), as
// kproxy decodes it: every field kproxy reads, each object closed to
// unknown keys, durations as strings.
func configSchema(t reflect.Type) schema {
	nullable := false
	if t.Kind() == reflect.Pointer {
		t, nullable = t.Elem(), true
	}
	typ := func(name string) schema {
		if nullable {
			return schema{"type": []any{name, "null"}}
		}
		return schema{"type": name}
	}
	switch t {
	case reflect.TypeFor[metav1.Duration](), reflect.TypeFor[logsapi.TimeOrMetaDuration]():
		s := typ("string")
		s["pattern"] = `^(([0-9]+(\.[0-9]+)?(ns|us|µs|ms|s|m|h))+|0)$`
		return s
	case reflect.TypeFor[logsapi.FormatOptions]():
		return typ("object")
	}
	switch t.Kind() {
	case reflect.String:
		return typ("string")
	case reflect.Bool:
		return typ("boolean")
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64, reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		return typ("integer")
	case reflect.Float32, reflect.Float64:
		return typ("number")
	case reflect.Slice:
		s := typ("array")
		s["items"] = configSchema(t.Elem())
		return s
	case reflect.Map:
		s := typ("object")
		s["additionalProperties"] = configSchema(t.Elem())
		return s
	case reflect.Struct:
		props := schema{}
		var walk func(t reflect.Type)
		walk = func(t reflect.Type) {
			for i := range t.NumField() {
				f := t.Field(i)
				name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
				if name == "-" {
					continue
				}
				if f.Anonymous && name == "" {
					walk(f.Type)
					continue
				}
				if name == "" {
					name = f.Name
				}
				props[name] = configSchema(f.Type)
			}
		}
		walk(t)
		return schema{"type": "object", "additionalProperties": false, "properties": props}
	}
	panic("no schema for " + t.String())
}

// kproxyConfig is the schema of the config blocks: a KubeProxyConfiguration
// without the fields the chart sets (apiVersion, kind, mode and
// clientConnection.kubeconfig).
func kproxyConfig(desc string) schema {
	s := configSchema(reflect.TypeFor[v1alpha1.KubeProxyConfiguration]())
	props := s["properties"].(schema)
	for _, k := range []string{"apiVersion", "kind", "mode"} {
		delete(props, k)
	}
	delete(props["clientConnection"].(schema)["properties"].(schema), "kubeconfig")
	s["description"] = desc
	return s
}

func imageSchema() schema {
	return obj(schema{
		"repository": str("The image's repository."),
		"tag":        str("The image's tag."),
		"pullPolicy": schema{"type": "string", "enum": []any{"Always", "IfNotPresent", "Never"}},
	}, "repository", "tag")
}

func monitorSchema(kind string) schema {
	return obj(schema{
		"enabled":  schema{"type": "boolean", "description": "Render a " + kind + " (Prometheus Operator)."},
		"interval": str("The scrape interval."),
		"labels":   freeMap(schema{"type": "string"}, "Labels your Prometheus's selector expects."),
	})
}

// valuesSchema is charts/kproxy/values.schema.json.
func valuesSchema() schema {
	os := func(modes []any, extra schema) schema {
		p := schema{
			"enabled":        schema{"type": "boolean"},
			"mode":           schema{"type": "string", "enum": modes},
			"config":         kproxyConfig("KubeProxyConfiguration fields for this OS, merged over config."),
			"resources":      anyObject("The kproxy container's resources."),
			"nodeSelector":   freeMap(schema{"type": "string"}, "Added to kubernetes.io/os."),
			"updateStrategy": anyObject("The DaemonSet's updateStrategy."),
		}
		for k, v := range extra {
			p[k] = v
		}
		return obj(p)
	}
	s := obj(schema{
		"image": obj(schema{"linux": imageSchema(), "windows": imageSchema()}),
		"imagePullSecrets": schema{"type": "array", "items": obj(schema{"name": str("A Secret's name.")}, "name"),
			"description": "The DaemonSets' imagePullSecrets."},
		"apiServer":         schema{"type": "string", "pattern": "^https?://", "description": "The API server's URL, written into kproxy's kubeconfig."},
		"config":            kproxyConfig("KubeProxyConfiguration fields for both OSes."),
		"priorityClassName": str("Every DaemonSet's pods' priority class."),
		"tolerations":       schema{"type": "array", "items": schema{"type": "object"}, "description": "Every DaemonSet's pods' tolerations."},
		"linux":             os([]any{"iptables", "nftables", "ipvs"}, nil),
		"windows": os([]any{"kernelspace"}, schema{"network": obj(schema{
			"networkName":           str("The HNS network (empty: KUBE_NETWORK, else the node's only L2Bridge or Overlay network)."),
			"enableDSR":             schema{"type": "boolean"},
			"rootHnsEndpointName":   schema{"type": "string"},
			"forwardHealthCheckVip": schema{"type": "boolean"},
		})}),
		"cleanup": obj(schema{"enabled": schema{"type": "boolean", "description": "Render the rollback DaemonSets (deploy/cleanup) instead of kproxy's."}}),
		"metrics": obj(schema{"serviceMonitor": monitorSchema("ServiceMonitor"), "podMonitor": monitorSchema("PodMonitor")}),
	})
	s["$schema"] = "http://json-schema.org/draft-07/schema#"
	s["title"] = "kproxy chart values"
	return s
}

// TestValuesSchema: charts/kproxy/values.schema.json is the schema above
// (its config blocks derived from upstream's KubeProxyConfiguration type,
// which kproxy decodes): run with -update to rewrite it.
func TestValuesSchema(t *testing.T) {
	want, err := json.MarshalIndent(valuesSchema(), "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	want = append(want, '\n')
	path := filepath.Join(repo(t), "charts", "kproxy", "values.schema.json")
	if *update {
		if err := os.WriteFile(path, want, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	got, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Errorf("%s is not the schema this test derives (go test -run TestValuesSchema -update rewrites it)", path)
	}
}
