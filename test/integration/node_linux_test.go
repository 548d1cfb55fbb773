package integration

import (
	"context"
	"encoding/json"
	"net/http"
	"slices"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kproxy/kproxy/test/proxytest"
)

// taintToBeDeleted is the cluster autoscaler's taint on a node it is about
// to remove.
const taintToBeDeleted = "ToBeDeletedByClusterAutoscaler"

// TestNodeBeingDeleted: /healthz turns 503 (nodeEligible false) while
// node1's Node carries the ToBeDeletedByClusterAutoscaler taint and while
// it is being deleted (a deletion timestamp, held by a finalizer), and 200
// again when the taint goes; /livez stays 200 and traffic keeps flowing
// throughout.
func TestNodeBeingDeleted(t *testing.T) {
	e := newEnv(t)
	ctx := testCtx(t, 2*time.Minute)
	const limit = 10 * time.Second
	sentinel := clusterIP(e.sentinel, v1.IPv4Protocol)
	ready := expectation{backends: []string{proxytest.PodA2}}

	e.awaitHealth(ctx, "/healthz", http.StatusOK, true, limit)

	e.updateNode(ctx, func(n *v1.Node) {
		n.Spec.Taints = append(n.Spec.Taints, v1.Taint{Key: taintToBeDeleted, Value: "1732980000", Effect: v1.TaintEffectNoSchedule})
	})
	took := e.awaitHealth(ctx, "/healthz", http.StatusServiceUnavailable, false, limit)
	t.Logf("tainted %s: /healthz 503 after %v", taintToBeDeleted, took.Round(time.Millisecond))
	e.awaitHealth(ctx, "/livez", http.StatusOK, false, limit)
	e.await(proxytest.Client1, "tcp", sentinel, ready, limit)

	e.updateNode(ctx, func(n *v1.Node) {
		n.Spec.Taints = slices.DeleteFunc(n.Spec.Taints, func(t v1.Taint) bool { return t.Key == taintToBeDeleted })
	})
	took = e.awaitHealth(ctx, "/healthz", http.StatusOK, true, limit)
	t.Logf("taint removed: /healthz 200 after %v", took.Round(time.Millisecond))

	// Being deleted: a finalizer keeps the object, with a deletion
	// timestamp, until it is removed.
	const finalizer = "kproxy.test/hold"
	e.updateNode(ctx, func(n *v1.Node) { n.Finalizers = append(n.Finalizers, finalizer) })
	if err := e.Admin.CoreV1().Nodes().Delete(ctx, proxytest.Node1, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		// Let the API server finish the deletion (the environment is
		// thrown away anyway; this keeps its state consistent).
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		n, err := e.Admin.CoreV1().Nodes().Get(ctx, proxytest.Node1, metav1.GetOptions{})
		if err == nil {
			n.Finalizers = nil
			_, _ = e.Admin.CoreV1().Nodes().Update(ctx, n, metav1.UpdateOptions{})
		}
	})
	took = e.awaitHealth(ctx, "/healthz", http.StatusServiceUnavailable, false, limit)
	t.Logf("Node deleted (deletion timestamp set): /healthz 503 after %v", took.Round(time.Millisecond))
	e.awaitHealth(ctx, "/livez", http.StatusOK, false, limit)
	e.await(proxytest.Client1, "tcp", sentinel, ready, limit)
	if !e.proxy.Running() {
		t.Fatalf("kproxy exited: %v", e.proxy.Process().Err())
	}
}

// awaitHealth polls a health path of kproxy in node1 until it answers code
// (and, for /healthz, nodeEligible as given), or limit passes. It returns
// how long that took.
func (e *env) awaitHealth(ctx context.Context, path string, code int, eligible bool, limit time.Duration) time.Duration {
	e.t.Helper()
	begin := time.Now()
	deadline := begin.Add(limit)
	for {
		got, body, err := e.Health(ctx, proxytest.Node1, path)
		if err == nil && got == code {
			if path != "/healthz" {
				return time.Since(begin)
			}
			var h struct {
				NodeEligible *bool `json:"nodeEligible"`
			}
			if json.Unmarshal([]byte(body), &h) == nil && h.NodeEligible != nil && *h.NodeEligible == eligible {
				return time.Since(begin)
			}
		}
		if time.Now().After(deadline) {
			e.t.Fatalf("%s: want %d (nodeEligible %v) within %v; last: %d %s (%v)", path, code, eligible, limit, got, body, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// updateNode reads node1's Node, changes it with fn and writes it back.
func (e *env) updateNode(ctx context.Context, fn func(*v1.Node)) {
	e.t.Helper()
	nodes := e.Admin.CoreV1().Nodes()
	n, err := nodes.Get(ctx, proxytest.Node1, metav1.GetOptions{})
	if err != nil {
		e.t.Fatal(err)
	}
	fn(n)
	if _, err := nodes.Update(ctx, n, metav1.UpdateOptions{}); err != nil {
		e.t.Fatalf("updating Node %s: %v", proxytest.Node1, err)
	}
}
