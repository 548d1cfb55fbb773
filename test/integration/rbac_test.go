package integration

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/kproxy/kproxy/test/controlplane"
)

func deployDir(t *testing.T) string {
	t.Helper()
	wd, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	root, err := controlplane.RepoRoot(wd)
	if err != nil {
		t.Fatal(err)
	}
	return filepath.Join(root, "deploy", "rbac")
}

// TestLoadRBACFromDeploy reads the real deploy/ files: the identity they
// bind is the one the control plane's kproxy token carries.
func TestLoadRBACFromDeploy(t *testing.T) {
	r, err := LoadRBAC(deployDir(t))
	if err != nil {
		t.Fatal(err)
	}
	if r.User() != controlplane.KproxyUser {
		t.Errorf("deploy/ binds %q, the control plane authenticates kproxy as %q", r.User(), controlplane.KproxyUser)
	}
	if len(r.ClusterRole.Rules) == 0 {
		t.Error("deploy/'s ClusterRole grants nothing")
	}
}

const (
	goodSA = `apiVersion: v1
kind: ServiceAccount
metadata:
  name: kproxy
  namespace: kube-system
`
	goodRole = `# comment
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata:
  name: kproxy
rules:
- apiGroups: [""]
  resources: [services]
  verbs: [list, watch]
`
	goodBinding = `apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata:
  name: kproxy
roleRef:
  apiGroup: rbac.authorization.k8s.io
  kind: ClusterRole
  name: kproxy
subjects:
- kind: ServiceAccount
  name: kproxy
  namespace: kube-system
`
)

func TestLoadRBACRejects(t *testing.T) {
	for _, tc := range []struct {
		name              string
		sa, role, binding string
		want              string
	}{
		{"good", goodSA, goodRole, goodBinding, ""},
		{"unknown field", goodSA, strings.Replace(goodRole, "rules:", "rulez: []\nrules:", 1), goodBinding, "unknown field"},
		{"two objects", goodSA, goodRole + "---\n" + goodRole, goodBinding, "2 objects"},
		{"only comments", goodSA, "# nothing\n", goodBinding, "0 objects"},
		{"no ClusterRole", goodSA, goodSA, goodBinding, "want a ServiceAccount, a ClusterRole"},
		{"binding to another role", goodSA, goodRole, strings.Replace(goodBinding, "  name: kproxy\nsubjects", "  name: admin\nsubjects", 1), "want ClusterRole kproxy"},
		{"binding to another account", goodSA, goodRole, strings.Replace(goodBinding, "  name: kproxy\n  namespace: kube-system", "  name: other\n  namespace: kube-system", 1), "does not bind ServiceAccount kube-system/kproxy"},
		{"not YAML", goodSA, "{", goodBinding, "clusterrole.yaml"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			for name, data := range map[string]string{"serviceaccount.yaml": tc.sa, "clusterrole.yaml": tc.role, "clusterrolebinding.yaml": tc.binding} {
				if err := os.WriteFile(filepath.Join(dir, name), []byte(data), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			_, err := LoadRBAC(dir)
			switch {
			case tc.want == "" && err != nil:
				t.Fatalf("LoadRBAC: %v", err)
			case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
				t.Fatalf("LoadRBAC = %v, want an error containing %q", err, tc.want)
			}
		})
	}
	if _, err := LoadRBAC(t.TempDir()); err == nil {
		t.Error("LoadRBAC of an empty directory succeeded")
	}
}

func TestAllows(t *testing.T) {
	r := &RBAC{ClusterRole: &rbacv1.ClusterRole{Rules: []rbacv1.PolicyRule{
		{APIGroups: []string{""}, Resources: []string{"services", "nodes"}, Verbs: []string{"list", "watch"}},
		{APIGroups: []string{"events.k8s.io"}, Resources: []string{"events"}, Verbs: []string{"create", "patch"}},
		{APIGroups: []string{""}, Resources: []string{"configmaps"}, ResourceNames: []string{"kproxy"}, Verbs: []string{"get"}},
		{APIGroups: []string{"apps"}, Resources: []string{"*/status"}, Verbs: []string{"*"}},
		{APIGroups: []string{"*"}, Resources: []string{"leases"}, Verbs: []string{"get"}},
		{NonResourceURLs: []string{"/healthz", "/api/*"}, Verbs: []string{"get"}},
	}}}
	for _, tc := range []struct {
		req  controlplane.Request
		want bool
	}{
		{controlplane.Request{Verb: "list", Resource: "services"}, true},
		{controlplane.Request{Verb: "watch", Resource: "nodes", Name: "node1"}, true},
		{controlplane.Request{Verb: "get", Resource: "nodes", Name: "node1"}, false},
		{controlplane.Request{Verb: "list", APIGroup: "discovery.k8s.io", Resource: "services"}, false},
		{controlplane.Request{Verb: "list", Resource: "services", Subresource: "status"}, false},
		{controlplane.Request{Verb: "create", APIGroup: "events.k8s.io", Resource: "events", Namespace: "default"}, true},
		{controlplane.Request{Verb: "create", Resource: "events"}, false},
		{controlplane.Request{Verb: "get", Resource: "configmaps", Name: "kproxy"}, true},
		{controlplane.Request{Verb: "get", Resource: "configmaps", Name: "other"}, false},
		{controlplane.Request{Verb: "get", Resource: "configmaps"}, false},
		{controlplane.Request{Verb: "update", APIGroup: "apps", Resource: "deployments", Subresource: "status"}, true},
		{controlplane.Request{Verb: "update", APIGroup: "apps", Resource: "deployments"}, false},
		{controlplane.Request{Verb: "get", APIGroup: "coordination.k8s.io", Resource: "leases"}, true},
		{controlplane.Request{Verb: "get", RequestURI: "/healthz"}, true},
		{controlplane.Request{Verb: "get", RequestURI: "/healthz?verbose=1"}, true},
		{controlplane.Request{Verb: "get", RequestURI: "/api/v1"}, true},
		{controlplane.Request{Verb: "get", RequestURI: "/apis"}, false},
		{controlplane.Request{Verb: "post", RequestURI: "/healthz"}, false},
	} {
		if got := r.Allows(tc.req); got != tc.want {
			t.Errorf("Allows(%s) = %v, want %v", tc.req.Call(), got, tc.want)
		}
	}
}

func TestApplyCreatesThenUpdates(t *testing.T) {
	dir := t.TempDir()
	for name, data := range map[string]string{"serviceaccount.yaml": goodSA, "clusterrole.yaml": goodRole, "clusterrolebinding.yaml": goodBinding} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	r, err := LoadRBAC(dir)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	client := fake.NewClientset()
	if err := r.Apply(ctx, client); err != nil {
		t.Fatal(err)
	}
	// A changed role is applied over the stored one.
	r.ClusterRole.Rules[0].Verbs = []string{"get"}
	if err := r.Apply(ctx, client); err != nil {
		t.Fatalf("second Apply: %v", err)
	}
	role, err := client.RbacV1().ClusterRoles().Get(ctx, "kproxy", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if got := role.Rules[0].Verbs; len(got) != 1 || got[0] != "get" {
		t.Errorf("stored role verbs %v, want [get]", got)
	}
	if _, err := client.CoreV1().ServiceAccounts("kube-system").Get(ctx, "kproxy", metav1.GetOptions{}); err != nil {
		t.Error(err)
	}
	b, err := client.RbacV1().ClusterRoleBindings().Get(ctx, "kproxy", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(b.Subjects) != 1 || b.Subjects[0].Name != "kproxy" {
		t.Errorf("stored binding subjects %v", b.Subjects)
	}
}
