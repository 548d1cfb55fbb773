package proxytest

import (
	"bytes"
	"fmt"

	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
	"sigs.k8s.io/yaml"
)

// Manifest renders objects as one multi-document YAML stream ("---"
// separated), the format of kproxy's --manifests directory. Every object must
// carry its apiVersion and kind (the builders set them).
func Manifest(objs ...any) ([]byte, error) {
	var buf bytes.Buffer
	for i, o := range objs {
		b, err := yaml.Marshal(o)
		if err != nil {
			return nil, fmt.Errorf("proxytest: render object %d as YAML: %w", i, err)
		}
		if i > 0 {
			buf.WriteString("---\n")
		}
		buf.Write(b)
	}
	return buf.Bytes(), nil
}

// ObjectList flattens typed lists into one list for Manifest.
func ObjectList(nodes []*v1.Node, svcs []*v1.Service, slices []*discovery.EndpointSlice) []any {
	out := make([]any, 0, len(nodes)+len(svcs)+len(slices))
	for _, n := range nodes {
		out = append(out, n)
	}
	for _, s := range svcs {
		out = append(out, s)
	}
	for _, s := range slices {
		out = append(out, s)
	}
	return out
}

// Manifest renders every object a proxy run with configuration c needs
// (Nodes, Services, EndpointSlices) as one YAML stream.
func (tb *Table) Manifest(c Config) ([]byte, error) {
	return Manifest(ObjectList(tb.Objects(c))...)
}
