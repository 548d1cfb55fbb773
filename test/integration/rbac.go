package integration

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	v1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"

	"github.com/kproxy/kproxy/deploy"
	"github.com/kproxy/kproxy/test/controlplane"
)

// RBACFiles are the files of deploy/rbac that grant kproxy its permissions.
var RBACFiles = []string{"serviceaccount.yaml", "clusterrole.yaml", "clusterrolebinding.yaml"}

// RBAC is kproxy's identity and permissions as deploy/ defines them.
type RBAC struct {
	ServiceAccount     *v1.ServiceAccount
	ClusterRole        *rbacv1.ClusterRole
	ClusterRoleBinding *rbacv1.ClusterRoleBinding
}

// LoadRBAC reads RBACFiles from deployDir and decodes them strictly with the
// Kubernetes scheme (an unknown or duplicate field is an error). Each file
// must hold exactly one object of the expected kind, and the binding must
// tie the ClusterRole to the ServiceAccount.
func LoadRBAC(deployDir string) (*RBAC, error) {
	codecs := serializer.NewCodecFactory(scheme.Scheme, serializer.EnableStrict)
	var r RBAC
	for _, name := range RBACFiles {
		path := filepath.Join(deployDir, name)
		data, err := os.ReadFile(path)
		if err != nil {
			return nil, fmt.Errorf("reading kproxy's RBAC: %w", err)
		}
		objs, err := deploy.Decode(codecs.UniversalDeserializer(), data)
		if err != nil {
			return nil, fmt.Errorf("decoding %s: %w", path, err)
		}
		if len(objs) != 1 {
			return nil, fmt.Errorf("%s: %d objects, want 1", path, len(objs))
		}
		switch o := objs[0].(type) {
		case *v1.ServiceAccount:
			r.ServiceAccount = o
		case *rbacv1.ClusterRole:
			r.ClusterRole = o
		case *rbacv1.ClusterRoleBinding:
			r.ClusterRoleBinding = o
		default:
			return nil, fmt.Errorf("%s: unexpected %T", path, o)
		}
	}
	if r.ServiceAccount == nil || r.ClusterRole == nil || r.ClusterRoleBinding == nil {
		return nil, fmt.Errorf("%s: want a ServiceAccount, a ClusterRole and a ClusterRoleBinding", deployDir)
	}
	if err := r.check(); err != nil {
		return nil, fmt.Errorf("%s: %w", deployDir, err)
	}
	return &r, nil
}

// check verifies that the binding grants the ClusterRole to the ServiceAccount.
func (r *RBAC) check() error {
	b := r.ClusterRoleBinding
	if b.RoleRef.APIGroup != rbacv1.GroupName || b.RoleRef.Kind != "ClusterRole" || b.RoleRef.Name != r.ClusterRole.Name {
		return fmt.Errorf("ClusterRoleBinding %s refers to %s %s, want ClusterRole %s", b.Name, b.RoleRef.Kind, b.RoleRef.Name, r.ClusterRole.Name)
	}
	if !slices.Contains(b.Subjects, rbacv1.Subject{Kind: rbacv1.ServiceAccountKind, Name: r.ServiceAccount.Name, Namespace: r.ServiceAccount.Namespace}) {
		return fmt.Errorf("ClusterRoleBinding %s does not bind ServiceAccount %s/%s", b.Name, r.ServiceAccount.Namespace, r.ServiceAccount.Name)
	}
	return nil
}

// User is the name the API server gives the ServiceAccount's requests.
func (r *RBAC) User() string {
	return "system:serviceaccount:" + r.ServiceAccount.Namespace + ":" + r.ServiceAccount.Name
}

// Apply creates the three objects with client (updating any that exists),
// in dependency order. A new API server creates the kube-system namespace
// shortly after it is ready, so a missing namespace is retried for up to
// 30 s.
func (r *RBAC) Apply(ctx context.Context, client kubernetes.Interface) error {
	sa := r.ServiceAccount.DeepCopy()
	err := retryNotFound(ctx, 30*time.Second, func() error {
		_, err := client.CoreV1().ServiceAccounts(sa.Namespace).Create(ctx, sa, metav1.CreateOptions{})
		if apierrors.IsAlreadyExists(err) {
			return nil // nothing in it to update
		}
		return err
	})
	if err != nil {
		return fmt.Errorf("applying ServiceAccount %s/%s: %w", sa.Namespace, sa.Name, err)
	}
	roles := client.RbacV1().ClusterRoles()
	role := r.ClusterRole.DeepCopy()
	if _, err := roles.Create(ctx, role, metav1.CreateOptions{}); apierrors.IsAlreadyExists(err) {
		cur, getErr := roles.Get(ctx, role.Name, metav1.GetOptions{})
		if getErr != nil {
			return fmt.Errorf("applying ClusterRole %s: %w", role.Name, getErr)
		}
		cur.Rules = role.Rules
		_, err = roles.Update(ctx, cur, metav1.UpdateOptions{})
		if err != nil {
			return fmt.Errorf("applying ClusterRole %s: %w", role.Name, err)
		}
	} else if err != nil {
		return fmt.Errorf("applying ClusterRole %s: %w", role.Name, err)
	}
	bindings := client.RbacV1().ClusterRoleBindings()
	b := r.ClusterRoleBinding.DeepCopy()
	if _, err := bindings.Create(ctx, b, metav1.CreateOptions{}); apierrors.IsAlreadyExists(err) {
		cur, getErr := bindings.Get(ctx, b.Name, metav1.GetOptions{})
		if getErr != nil {
			return fmt.Errorf("applying ClusterRoleBinding %s: %w", b.Name, getErr)
		}
		cur.Subjects = b.Subjects // roleRef is immutable; check() fixed it
		if _, err := bindings.Update(ctx, cur, metav1.UpdateOptions{}); err != nil {
			return fmt.Errorf("applying ClusterRoleBinding %s: %w", b.Name, err)
		}
	} else if err != nil {
		return fmt.Errorf("applying ClusterRoleBinding %s: %w", b.Name, err)
	}
	return nil
}

// retryNotFound calls fn until it returns something other than NotFound, or
// limit passes.
func retryNotFound(ctx context.Context, limit time.Duration, fn func() error) error {
	deadline := time.Now().Add(limit)
	for {
		err := fn()
		if !apierrors.IsNotFound(err) || time.Now().After(deadline) {
			return err
		}
		select {
		case <-ctx.Done():
			return errors.Join(err, ctx.Err())
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// Allows reports whether the ClusterRole grants req (RBAC's matching: "*"
// wildcards, "resource/subresource", resourceNames, nonResourceURLs with a
// trailing "*"). It does not look at other bindings.
func (r *RBAC) Allows(req controlplane.Request) bool {
	for _, rule := range r.ClusterRole.Rules {
		if ruleAllows(rule, req) {
			return true
		}
	}
	return false
}

func ruleAllows(rule rbacv1.PolicyRule, req controlplane.Request) bool {
	if !matches(rule.Verbs, req.Verb) {
		return false
	}
	if req.Resource == "" { // a non-resource URL: /api, /version, ...
		path, _, _ := strings.Cut(req.RequestURI, "?")
		for _, u := range rule.NonResourceURLs {
			if u == rbacv1.NonResourceAll || u == path ||
				(strings.HasSuffix(u, "*") && strings.HasPrefix(path, strings.TrimSuffix(u, "*"))) {
				return true
			}
		}
		return false
	}
	if !matches(rule.APIGroups, req.APIGroup) {
		return false
	}
	res := req.Resource
	if req.Subresource != "" {
		res += "/" + req.Subresource
	}
	resourceOK := false
	for _, r := range rule.Resources {
		if r == rbacv1.ResourceAll || r == res || (req.Subresource != "" && r == "*/"+req.Subresource) {
			resourceOK = true
			break
		}
	}
	if !resourceOK {
		return false
	}
	return len(rule.ResourceNames) == 0 || (req.Name != "" && slices.Contains(rule.ResourceNames, req.Name))
}

func matches(list []string, v string) bool {
	return slices.Contains(list, "*") || slices.Contains(list, v)
}
