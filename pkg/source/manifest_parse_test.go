package source

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
)

const svcYAML = `apiVersion: v1
kind: Service
metadata:
  name: %s
spec:
  clusterIP: 10.0.0.1
  ports:
  - port: 80
`

func TestParseManifest(t *testing.T) {
	tests := []struct {
		name, file, data string
		// want lists "key@line" for every object, in order.
		want []string
		// skipped lists "line: reason substring" for every skipped object.
		skipped []string
		// fileErr is "line: reason substring" when the file does not parse.
		fileErr string
	}{{
		name: "one service, default namespace",
		file: "a.yaml",
		data: fmt.Sprintf(svcYAML, "web"),
		want: []string{"Service default/web@1"},
	}, {
		name: "multi-document with comments, empty documents and an inline separator",
		file: "a.yml",
		data: "# leading comment\n---\n" + fmt.Sprintf(svcYAML, "a") +
			"--- # comment\n---\n\n" +
			"apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata: {name: a-1, namespace: ns}\naddressType: IPv4\nendpoints: []\n" +
			"...\n" +
			"--- {apiVersion: v1, kind: Node, metadata: {name: n1, namespace: ignored}}\n",
		want: []string{"Service default/a@3", "EndpointSlice ns/a-1@14", "Node n1@20"},
	}, {
		name: "List with items of every kind",
		file: "list.yaml",
		data: `apiVersion: v1
kind: List
items:
- apiVersion: v1
  kind: Service
  metadata: {name: s, namespace: ns}
- apiVersion: discovery.k8s.io/v1
  kind: EndpointSlice
  metadata: {name: s-1, namespace: ns}
  addressType: IPv6
- apiVersion: v1
  kind: Node
  metadata: {name: n1}
`,
		want: []string{"Service ns/s@1", "EndpointSlice ns/s-1@1", "Node n1@1"},
	}, {
		name: "typed list items without apiVersion and kind",
		file: "list.json",
		data: `{"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSliceList",
 "items": [{"metadata": {"name": "x-1", "namespace": "ns"}, "addressType": "IPv4"}]}`,
		want: []string{"EndpointSlice ns/x-1@1"},
	}, {
		name: "concatenated JSON objects",
		file: "objs.json",
		data: "{\"apiVersion\": \"v1\", \"kind\": \"Service\", \"metadata\": {\"name\": \"a\"}}\n\n" +
			"{\"apiVersion\": \"v1\", \"kind\": \"Node\", \"metadata\": {\"name\": \"n1\"}}\n",
		want: []string{"Service default/a@1", "Node n1@3"},
	}, {
		name: "bad objects are skipped, neighbours kept",
		file: "mixed.yaml",
		data: fmt.Sprintf(svcYAML, "good-1") +
			"---\napiVersion: v1\nkind: ConfigMap\nmetadata: {name: c}\n" +
			"---\napiVersion: v2\nkind: Service\nmetadata: {name: s}\n" +
			"---\napiVersion: v1\nkind: Service\nmetadata: {namespace: ns}\n" +
			"---\nmetadata: {name: nokind}\n" +
			"---\napiVersion: v1\nkind: List\nitems:\n- apiVersion: v1\n  kind: List\n  items: []\n" +
			"---\n" + fmt.Sprintf(svcYAML, "good-2"),
		want: []string{"Service default/good-1@1", "Service default/good-2@31"},
		skipped: []string{
			`10: document 2: unsupported kind "ConfigMap"`,
			`14: document 3: Service has apiVersion "v2", want "v1"`,
			`18: document 4: Service without metadata.name`,
			`22: document 5: missing kind`,
			`24: document 6 items[0]: a List inside a list`,
		},
	}, {
		name:    "YAML syntax error has the absolute line",
		file:    "broken.yaml",
		data:    fmt.Sprintf(svcYAML, "ok") + "---\napiVersion: v1\nkind: Service\nmetadata:\n  name: x\n   bad: indent\n",
		fileErr: "14: mapping values are not allowed",
	}, {
		name:    "duplicate key",
		file:    "dup.yaml",
		data:    "apiVersion: v1\nkind: Service\nmetadata: {name: a}\nkind: Service\n",
		fileErr: `4: unmarshal errors: key "kind" already set`,
	}, {
		name:    "wrong field type",
		file:    "type.yaml",
		data:    fmt.Sprintf(svcYAML, "a") + "---\napiVersion: v1\nkind: Service\nmetadata: {name: b}\nspec:\n  ports:\n  - port: eighty\n",
		fileErr: "10: document 2: Service: json: cannot unmarshal string",
	}, {
		name:    "unknown field",
		file:    "unknown.yaml",
		data:    "apiVersion: v1\nkind: Service\nmetadata: {name: a}\nspec:\n  clusterIPP: 10.0.0.1\n",
		fileErr: `1: document 1: Service: unknown field "spec.clusterIPP"`,
	}, {
		name:    "scalar document",
		file:    "scalar.yaml",
		data:    fmt.Sprintf(svcYAML, "a") + "---\njust some words\n",
		fileErr: "10: document 2: not a Kubernetes object",
	}, {
		name:    "JSON syntax error line",
		file:    "bad.json",
		data:    "{\"apiVersion\": \"v1\",\n \"kind\": \"Service\",\n \"metadata\": {\"name\": \"a\"}},\n}",
		fileErr: "3: invalid character ','",
	}, {
		name: "empty file",
		file: "empty.yaml",
		data: "# nothing here\n",
	}, {
		name: "byte order mark",
		file: "bom.yaml",
		data: "\xef\xbb\xbf" + fmt.Sprintf(svcYAML, "web"),
		want: []string{"Service default/web@1"},
	}}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			objs, skipped, err := parseManifest(tc.file, []byte(tc.data))
			if tc.fileErr != "" {
				var fe *fileError
				if !errors.As(err, &fe) {
					t.Fatalf("got error %v (objects %d), want a file error %q", err, len(objs), tc.fileErr)
				}
				if got := fmt.Sprintf("%d: %s", fe.Line, fe.Reason); !strings.Contains(got, tc.fileErr) || fe.File != tc.file {
					t.Errorf("file error %q in %s, want %q in %s", got, fe.File, tc.fileErr, tc.file)
				}
				if objs != nil || skipped != nil {
					t.Errorf("a file error came with objects %v or skips %v", objs, skipped)
				}
				return
			}
			if err != nil {
				t.Fatalf("unexpected error: %v", err)
			}
			var got []string
			for _, o := range objs {
				got = append(got, fmt.Sprintf("%s@%d", o.key, o.line))
			}
			if d := diffKeys(got, tc.want); d != "" {
				t.Errorf("objects:\n%s", d)
			}
			if len(skipped) != len(tc.skipped) {
				t.Errorf("skipped %v, want %d skips %q", skipped, len(tc.skipped), tc.skipped)
			} else {
				for i, s := range skipped {
					if got := fmt.Sprintf("%d: %s", s.Line, s.Reason); !strings.Contains(got, tc.skipped[i]) || s.File != tc.file {
						t.Errorf("skip %d: %q, want %q", i, got, tc.skipped[i])
					}
				}
			}
		})
	}
}

func TestParseManifestObjectFields(t *testing.T) {
	data := `apiVersion: v1
kind: Service
metadata:
  name: web
  resourceVersion: "99"
  labels: {app: web}
spec:
  clusterIP: 10.0.0.1
  ports:
  - {name: http, port: 80, targetPort: 8080}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: web-1
  uid: given-uid
  labels: {kubernetes.io/service-name: web}
addressType: IPv4
endpoints:
- addresses: [10.1.0.1]
  conditions: {ready: true}
  nodeName: n1
ports:
- {name: http, port: 8080}
`
	objs, skipped, err := parseManifest("f.yaml", []byte(data))
	if err != nil || len(skipped) > 0 || len(objs) != 2 {
		t.Fatalf("parse: %v %v %d objects", err, skipped, len(objs))
	}
	svc := objs[0].obj.(*v1.Service)
	if svc.Namespace != "default" || svc.ResourceVersion != "" || svc.Kind != "" || svc.APIVersion != "" {
		t.Errorf("service meta not normalized: %+v %+v", svc.TypeMeta, svc.ObjectMeta)
	}
	if svc.UID == "" || svc.UID != syntheticUID(objs[0].key) {
		t.Errorf("service UID %q, want the synthetic one", svc.UID)
	}
	if svc.Spec.Ports[0].TargetPort.IntValue() != 8080 || svc.Labels["app"] != "web" {
		t.Errorf("service spec not decoded: %+v", svc.Spec)
	}
	es := objs[1].obj.(*discovery.EndpointSlice)
	if es.UID != "given-uid" || *es.Endpoints[0].NodeName != "n1" || !*es.Endpoints[0].Conditions.Ready || *es.Ports[0].Port != 8080 {
		t.Errorf("slice not decoded: %+v", es)
	}
}

func TestSplitYAMLLines(t *testing.T) {
	tests := []struct {
		data string
		want []string // "line:first line of data"
	}{
		{"a: 1\n", []string{"1:a: 1"}},
		{"---\na: 1\n---\nb: 2", []string{"2:a: 1", "4:b: 2"}},
		{"a: 1\n---   \n\n# c\nb: 2\n", []string{"1:a: 1", "5:b: 2"}},
		{"--- x: 1\n", []string{"1:x: 1"}},
		{"---x: 1\n", []string{"1:---x: 1"}}, // not a separator
		{"\n\n---\n---\n", nil},
	}
	for _, tc := range tests {
		var got []string
		for _, d := range splitYAML([]byte(tc.data)) {
			first, _, _ := strings.Cut(string(d.data), "\n")
			got = append(got, fmt.Sprintf("%d:%s", d.line, first))
		}
		if d := diffKeys(got, tc.want); d != "" {
			t.Errorf("splitYAML(%q):\n%s", tc.data, d)
		}
	}
}
