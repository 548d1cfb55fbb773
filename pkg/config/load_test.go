package config

import (
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"k8s.io/kube-proxy/config/v1alpha1"
	"sigs.k8s.io/yaml"
)

// TestLoadGood loads each file of testdata/good, completes it and compares
// the effective configuration and the warnings with its golden file.
func TestLoadGood(t *testing.T) {
	files, err := filepath.Glob("testdata/good/*.*")
	if err != nil {
		t.Fatal(err)
	}
	for _, file := range files {
		file = filepath.ToSlash(file) // golden names and messages use '/' on every OS
		if strings.HasSuffix(file, ".golden") {
			continue
		}
		t.Run(filepath.Base(file), func(t *testing.T) {
			resetKlogFlags(t)
			o := testOptions("linux", nil)
			if _, err := parse(t, o, "--config", file); err != nil {
				t.Fatalf("Complete: %v", err)
			}
			if err := o.Validate(); err != nil {
				t.Fatalf("Validate: %v", err)
			}
			out, err := yaml.Marshal(o.Config)
			if err != nil {
				t.Fatal(err)
			}
			var b strings.Builder
			b.WriteString("# nodeName: " + o.NodeName + "\n")
			for _, w := range o.Warnings() {
				b.WriteString("# warning: " + w + "\n")
			}
			b.Write(out)
			golden(t, strings.TrimPrefix(strings.TrimSuffix(file, filepath.Ext(file)), "testdata/")+".golden", b.String())
		})
	}
}

// TestLoadBad checks the exact error for each file of testdata/bad against
// its golden file: every problem, with file, line and field.
func TestLoadBad(t *testing.T) {
	files, err := filepath.Glob("testdata/bad/*.*")
	if err != nil {
		t.Fatal(err)
	}
	for _, file := range files {
		file = filepath.ToSlash(file) // golden names and messages use '/' on every OS
		if strings.HasSuffix(file, ".golden") {
			continue
		}
		t.Run(filepath.Base(file), func(t *testing.T) {
			c, err := Load(file)
			if err == nil {
				t.Fatalf("Load succeeded, want an error; got %+v", c)
			}
			var de *DecodeError
			if !errors.As(err, &de) {
				t.Fatalf("error %T is not a *DecodeError: %v", err, err)
			}
			if de.File != file {
				t.Errorf("DecodeError.File = %q, want %q", de.File, file)
			}
			golden(t, strings.TrimPrefix(file, "testdata/")+".golden", err.Error()+"\n")
		})
	}
}

// TestDecodeProblems checks the structured problems: field path, line, and
// that every problem in a document is reported at once.
func TestDecodeProblems(t *testing.T) {
	const head = "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\n"
	for _, tc := range []struct {
		name string
		doc  string
		want []Problem // Message is checked as a substring
	}{
		{
			name: "unknown nested field",
			doc:  head + "iptables:\n  masqueradeBits: 14\n",
			want: []Problem{{Line: 4, Field: "iptables.masqueradeBits", Message: `unknown field "iptables.masqueradeBits"`}},
		},
		{
			name: "field names are case-sensitive",
			doc:  head + "MetricsBindAddress: 127.0.0.1:1\n",
			want: []Problem{{Line: 3, Field: "MetricsBindAddress", Message: `unknown field "MetricsBindAddress"`}},
		},
		{
			name: "wrong type for an integer",
			doc:  head + "iptables:\n  masqueradeBit: \"14\"\n",
			want: []Problem{{Line: 4, Field: "iptables.masqueradeBit", Message: `iptables.masqueradeBit: got "14", want an integer (int32)`}},
		},
		{
			name: "integer overflow",
			doc:  head + "oomScoreAdj: 4294967296\n",
			want: []Problem{{Line: 3, Field: "oomScoreAdj", Message: "oomScoreAdj: got 4294967296, want an integer (int32)"}},
		},
		{
			name: "scalar where a list is wanted",
			doc:  head + "nodePortAddresses: 10.0.0.0/8\n",
			want: []Problem{{Line: 3, Field: "nodePortAddresses", Message: `nodePortAddresses: got "10.0.0.0/8", want a list of strings`}},
		},
		{
			name: "number where a duration is wanted",
			doc:  head + "configSyncPeriod: 15\n",
			want: []Problem{{Line: 3, Field: "configSyncPeriod", Message: `configSyncPeriod: got 15, want a duration such as "30s"`}},
		},
		{
			name: "unparsable duration",
			doc:  head + "conntrack:\n  tcpCloseWaitTimeout: 1 hour\n",
			want: []Problem{{Line: 4, Field: "conntrack.tcpCloseWaitTimeout", Message: `conntrack.tcpCloseWaitTimeout: invalid value "1 hour"`}},
		},
		{
			name: "mapping where a string is wanted",
			doc:  head + "winkernel:\n  networkName:\n    name: x\n",
			want: []Problem{{Line: 4, Field: "winkernel.networkName", Message: "winkernel.networkName: got a mapping, want a string"}},
		},
		{
			name: "wrong type and unknown field are both reported",
			doc:  head + "iptables:\n  syncPeriod: true\nfoo: 1\n",
			want: []Problem{
				{Line: 4, Field: "iptables.syncPeriod", Message: "iptables.syncPeriod: got true"},
				{Line: 5, Field: "foo", Message: `unknown field "foo"`},
			},
		},
		{
			name: "duplicate key",
			doc:  head + "mode: iptables\nmode: iptables\n",
			want: []Problem{{Line: 4, Message: `key "mode" already set`}},
		},
		{
			name: "wrong kind",
			doc:  "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: Service\n",
			want: []Problem{{Line: 2, Field: "kind", Message: `kind: must be "KubeProxyConfiguration", not "Service"`}},
		},
		{
			name: "missing apiVersion and kind",
			doc:  "mode: iptables\n",
			want: []Problem{
				{Message: `missing apiVersion: must be "kubeproxy.config.k8s.io/v1alpha1"`},
				{Message: `missing kind: must be "KubeProxyConfiguration"`},
			},
		},
		{
			name: "JSON input, line of the key",
			doc:  "{\n \"apiVersion\": \"kubeproxy.config.k8s.io/v1alpha1\",\n \"kind\": \"KubeProxyConfiguration\",\n \"iptables\": {\n  \"bogus\": 1\n }\n}\n",
			want: []Problem{{Line: 5, Field: "iptables.bogus", Message: `unknown field "iptables.bogus"`}},
		},
		{
			name: "not a mapping",
			doc:  "just a string\n",
			want: []Problem{{Message: "not a KubeProxyConfiguration"}},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Decode([]byte(tc.doc))
			var de *DecodeError
			if !errors.As(err, &de) {
				t.Fatalf("Decode error = %v, want a *DecodeError", err)
			}
			if len(de.Problems) != len(tc.want) {
				t.Fatalf("got %d problems, want %d:\n%v", len(de.Problems), len(tc.want), err)
			}
			for i, want := range tc.want {
				got := de.Problems[i]
				if got.Line != want.Line || got.Field != want.Field || !strings.Contains(got.Message, want.Message) {
					t.Errorf("problem %d = %+v, want %+v", i, got, want)
				}
			}
		})
	}
}

func TestDecodeKeepsValues(t *testing.T) {
	c, err := Decode([]byte(`{"apiVersion": "kubeproxy.config.k8s.io/v1alpha1", "kind": "KubeProxyConfiguration",
		"iptables": {"masqueradeBit": 3, "syncPeriod": "45s"}, "featureGates": {"A": true}}`))
	if err != nil {
		t.Fatal(err)
	}
	want := &v1alpha1.KubeProxyConfiguration{}
	want.APIVersion, want.Kind = kubeProxyConfigAPIVersion, kubeProxyConfigKind
	want.IPTables.MasqueradeBit = ptr(int32(3))
	want.IPTables.SyncPeriod.Duration = 45e9
	want.FeatureGates = map[string]bool{"A": true}
	if !reflect.DeepEqual(c, want) {
		t.Errorf("Decode = %+v, want %+v", c, want)
	}
}

func TestLoadMissingFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "absent.yaml")
	_, err := Load(path)
	if !errors.Is(err, os.ErrNotExist) || !strings.Contains(err.Error(), path) {
		t.Errorf("Load(%q) error = %v, want a not-exist error naming the file", path, err)
	}
}

func TestSplitPath(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want []string
	}{
		{"a", []string{"a"}},
		{"a.b.c", []string{"a", "b", "c"}},
		{"a[2]", []string{"a", "[2]"}},
		{"a.b[0].c", []string{"a", "b", "[0]", "c"}},
		{"a[1][2]", []string{"a", "[1]", "[2]"}},
	} {
		if got := splitPath(tc.in); !reflect.DeepEqual(got, tc.want) {
			t.Errorf("splitPath(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
}
