package deploy

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"

	"k8s.io/apimachinery/pkg/runtime"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
)

// Decode decodes every document of a YAML stream (such as a file of
// deploy/ or `kubectl kustomize` output) with d; documents that hold only
// comments are skipped. An error names the document (counted from 1).
// The tests here decode strictly with the Kubernetes scheme; the
// integration tests read the RBAC files with it.
func Decode(d runtime.Decoder, data []byte) ([]runtime.Object, error) {
	r := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(data)))
	var out []runtime.Object
	for i := 1; ; i++ {
		doc, err := r.Read()
		if errors.Is(err, io.EOF) {
			return out, nil
		}
		if err != nil {
			return nil, fmt.Errorf("document %d: %w", i, err)
		}
		if len(bytes.TrimSpace(stripComments(doc))) == 0 {
			continue
		}
		obj, _, err := d.Decode(doc, nil, nil)
		if err != nil {
			return nil, fmt.Errorf("document %d: %w", i, err)
		}
		out = append(out, obj)
	}
}

// stripComments drops whole-line comments.
func stripComments(doc []byte) []byte {
	var b bytes.Buffer
	for _, l := range bytes.Split(doc, []byte("\n")) {
		if t := bytes.TrimSpace(l); len(t) > 0 && t[0] != '#' {
			b.Write(l)
			b.WriteByte('\n')
		}
	}
	return b.Bytes()
}
