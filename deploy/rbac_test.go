package deploy

import (
	"context"
	"fmt"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"
	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/klog/v2"

	"github.com/kproxy/kproxy/pkg/source"
)

// apiCall is one kind of request kproxy makes, as RBAC sees it.
type apiCall struct {
	verb, group, resource string
}

func (c apiCall) String() string {
	g := c.group
	if g == "" {
		g = "core"
	}
	return c.verb + " " + g + "/" + c.resource
}

// callsOf reduces recorded client actions to the distinct API calls.
func callsOf(actions []k8stesting.Action) []apiCall {
	seen := map[apiCall]bool{}
	for _, a := range actions {
		res := a.GetResource().Resource
		if sub := a.GetSubresource(); sub != "" {
			res += "/" + sub
		}
		seen[apiCall{verb: a.GetVerb(), group: a.GetResource().Group, resource: res}] = true
	}
	out := make([]apiCall, 0, len(seen))
	for c := range seen {
		out = append(out, c)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].String() < out[j].String() })
	return out
}

// syncedHandler is a source.Handler that only reports OnSynced.
type syncedHandler struct{ synced chan struct{} }

func (syncedHandler) OnService(_, _ *v1.Service)                    {}
func (syncedHandler) OnEndpointSlice(_, _ *discovery.EndpointSlice) {}
func (syncedHandler) OnNode(_, _ *v1.Node)                          {}
func (h syncedHandler) OnSynced()                                   { close(h.synced) }

// sourceCalls runs kproxy's API-server source against a fake clientset until
// its informers have listed and are watching, and returns the calls made.
func sourceCalls(t *testing.T) []apiCall {
	t.Helper()
	const node = "node-a"
	client := fake.NewClientset(
		&v1.Node{ObjectMeta: metav1.ObjectMeta{Name: node}},
		&v1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "web"}, Spec: v1.ServiceSpec{ClusterIP: "10.96.0.10"}},
		&discovery.EndpointSlice{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "web-1",
			Labels: map[string]string{discovery.LabelServiceName: "web"}}, AddressType: discovery.AddressTypeIPv4},
	)
	watching := make(chan string, 16)
	client.PrependWatchReactor("*", func(a k8stesting.Action) (bool, watch.Interface, error) {
		select {
		case watching <- a.GetResource().Resource:
		default:
		}
		return false, nil, nil // the fake's tracker serves the watch
	})

	h := syncedHandler{synced: make(chan struct{})}
	ctx, cancel := context.WithCancel(klog.NewContext(context.Background(), logr.Discard()))
	done := make(chan error, 1)
	go func() { done <- source.RunAPIServer(ctx, client, node, 0, h) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("RunAPIServer: %v", err)
		}
	}()

	// A deadlock guard, not a measurement: the fake answers at once.
	guard := time.NewTimer(time.Minute)
	defer guard.Stop()
	pending := map[string]bool{"services": true, "endpointslices": true, "nodes": true}
	for synced := false; len(pending) > 0 || !synced; {
		select {
		case r := <-watching:
			delete(pending, r)
		case <-h.synced:
			synced, h.synced = true, nil
		case <-guard.C:
			t.Fatalf("the source did not sync and watch everything: still waiting for watches of %v (synced %v)", pending, synced)
		}
	}
	return callsOf(client.Actions())
}

// allows reports whether rule grants call. Wildcards are honoured so that
// the check stays right if someone adds one (TestClusterRoleIsMinimal
// rejects them anyway).
func allows(rule rbacv1.PolicyRule, c apiCall) bool {
	match := func(list []string, v string) bool {
		return slices.Contains(list, v) || slices.Contains(list, "*")
	}
	return len(rule.ResourceNames) == 0 && match(rule.Verbs, c.verb) && match(rule.APIGroups, c.group) && match(rule.Resources, c.resource)
}

func allowedBy(rules []rbacv1.PolicyRule, c apiCall) bool {
	for _, r := range rules {
		if allows(r, c) {
			return true
		}
	}
	return false
}

// grants expands rules into every call they allow (without wildcards).
func grants(rules []rbacv1.PolicyRule) []apiCall {
	var out []apiCall
	for _, r := range rules {
		for _, g := range r.APIGroups {
			for _, res := range r.Resources {
				for _, v := range r.Verbs {
					out = append(out, apiCall{verb: v, group: g, resource: res})
				}
			}
		}
	}
	return out
}

// clusterRoleFor follows ClusterRoleBindings from a service account to its
// ClusterRole; exactly one binding must exist.
func clusterRoleFor(r *rendered, namespace, sa string) (*rbacv1.ClusterRole, error) {
	var found []*rbacv1.ClusterRole
	for _, b := range r.clusterRoleBindings {
		for _, s := range b.Subjects {
			if s.Kind != rbacv1.ServiceAccountKind || s.Name != sa || s.Namespace != namespace {
				continue
			}
			if b.RoleRef.Kind != "ClusterRole" || b.RoleRef.APIGroup != rbacv1.GroupName {
				return nil, fmt.Errorf("ClusterRoleBinding %s: roleRef %+v", b.Name, b.RoleRef)
			}
			cr, ok := r.clusterRoles[b.RoleRef.Name]
			if !ok {
				return nil, fmt.Errorf("ClusterRoleBinding %s names ClusterRole %q, which is not in the kustomization", b.Name, b.RoleRef.Name)
			}
			found = append(found, cr)
		}
	}
	if len(found) != 1 {
		return nil, fmt.Errorf("service account %s/%s is bound to %d ClusterRoles, want 1", namespace, sa, len(found))
	}
	return found[0], nil
}

// kproxyCalls are the API calls kproxy makes: those of its API-server
// source (checked exactly here) and those of a whole kproxy run against a
// fake API server (appCalls: source, event recorder, servers), distinct and
// sorted.
func kproxyCalls(t *testing.T) []apiCall {
	calls := sourceCalls(t)
	// The source alone: list and watch of the three kinds, nothing else. If
	// this changes, the ClusterRole (and docs/reference.md, "Permissions") must follow.
	want := []apiCall{
		{"list", "", "nodes"}, {"list", "", "services"}, {"list", "discovery.k8s.io", "endpointslices"},
		{"watch", "", "nodes"}, {"watch", "", "services"}, {"watch", "discovery.k8s.io", "endpointslices"},
	}
	sort.Slice(want, func(i, j int) bool { return want[i].String() < want[j].String() })
	if !slices.Equal(calls, want) {
		t.Errorf("the API-server source made the calls %v, want %v", calls, want)
	}
	seen := map[apiCall]bool{}
	var out []apiCall
	for _, c := range append(calls, appCalls(t)...) {
		if !seen[c] {
			seen[c] = true
			out = append(out, c)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].String() < out[j].String() })
	return out
}

func TestClusterRoleMatchesAPICalls(t *testing.T) {
	r := renderMain(t)
	calls := kproxyCalls(t)
	t.Logf("kproxy's API calls: %v", calls)
	for _, name := range []string{linuxDaemonSet, windowsDaemonSet} {
		ds := r.daemonSet(t, name)
		role, err := clusterRoleFor(r, ds.Namespace, ds.Spec.Template.Spec.ServiceAccountName)
		if err != nil {
			t.Fatalf("DaemonSet %s: %v", name, err)
		}
		for _, c := range calls {
			if !allowedBy(role.Rules, c) {
				t.Errorf("DaemonSet %s: ClusterRole %s does not allow %v, which kproxy does", name, role.Name, c)
			}
		}
		for _, g := range grants(role.Rules) {
			if !slices.Contains(calls, g) {
				t.Errorf("DaemonSet %s: ClusterRole %s allows %v, which kproxy never does", name, role.Name, g)
			}
		}
	}
}

// TestClusterRoleIsMinimal rejects grants broader than a list of calls can
// express: wildcards, resource names, non-resource URLs, aggregation.
func TestClusterRoleIsMinimal(t *testing.T) {
	r := renderMain(t)
	for _, role := range r.clusterRoles {
		if role.AggregationRule != nil {
			t.Errorf("ClusterRole %s aggregates other roles", role.Name)
		}
		for i, rule := range role.Rules {
			all := slices.Concat(rule.APIGroups, rule.Resources, rule.Verbs)
			if slices.Contains(all, "*") || len(rule.ResourceNames) > 0 || len(rule.NonResourceURLs) > 0 {
				t.Errorf("ClusterRole %s rule %d is broader than named calls: %+v", role.Name, i, rule)
			}
		}
	}
}

// TestRuleMatching shows the matcher the tests above rely on can say no.
func TestRuleMatching(t *testing.T) {
	rule := rbacv1.PolicyRule{APIGroups: []string{""}, Resources: []string{"services", "nodes"}, Verbs: []string{"list", "watch"}}
	for _, tc := range []struct {
		rule rbacv1.PolicyRule
		call apiCall
		want bool
	}{
		{rule, apiCall{"list", "", "services"}, true},
		{rule, apiCall{"watch", "", "nodes"}, true},
		{rule, apiCall{"get", "", "nodes"}, false},
		{rule, apiCall{"list", "apps", "services"}, false},
		{rule, apiCall{"list", "", "endpoints"}, false},
		{rule, apiCall{"list", "", "nodes/status"}, false},
		{rbacv1.PolicyRule{APIGroups: []string{"*"}, Resources: []string{"*"}, Verbs: []string{"*"}}, apiCall{"delete", "apps", "daemonsets"}, true},
		{rbacv1.PolicyRule{APIGroups: []string{""}, Resources: []string{"nodes"}, Verbs: []string{"list"}, ResourceNames: []string{"n"}}, apiCall{"list", "", "nodes"}, false},
	} {
		if got := allows(tc.rule, tc.call); got != tc.want {
			t.Errorf("rule %+v allows %v: %v, want %v", tc.rule, tc.call, got, tc.want)
		}
	}
	if !strings.Contains(apiCall{"list", "", "nodes"}.String(), "core/nodes") {
		t.Errorf("the core group renders as %q", apiCall{"list", "", "nodes"})
	}
}
