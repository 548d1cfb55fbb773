package source

import (
	"context"
	"fmt"
	"sync"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
)

// clusterIdentity tells whether the API server that answers after an outage
// still serves the cluster kproxy was watching. Resuming a watch is only
// safe in the same cluster: a control plane rebuilt behind the same address
// (a new or restored etcd) may have reached a higher resourceVersion than
// the one kproxy resumes from, and the watch would then succeed while
// missing every object created before it, and never delete the old ones.
//
// The identity is the UID of the default/kubernetes Service: every
// kube-apiserver creates it when a cluster starts, and it keeps its UID for
// the cluster's life. Reading it is one list call with a field selector
// (services "list" is in kproxy's ClusterRole), made at start and after each
// outage by each kind, which remembers the identity of the cluster its own
// objects came from.
type clusterIdentity struct {
	probe func(ctx context.Context) (types.UID, error)

	mu  sync.Mutex
	uid types.UID // "" until first read
}

// remember reads the identity once (until a read succeeds).
func (c *clusterIdentity) remember(ctx context.Context) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.uid != "" {
		return
	}
	if uid, err := c.probe(ctx); err == nil {
		c.uid = uid
	}
}

// same reports whether the API server serves the cluster remembered. When
// either identity is unknown (never read, or the read fails now) it answers
// false: listing again is always correct, only more expensive.
func (c *clusterIdentity) same(ctx context.Context) bool {
	uid, err := c.probe(ctx)
	c.mu.Lock()
	defer c.mu.Unlock()
	if err != nil || uid == "" {
		return false
	}
	known := c.uid
	c.uid = uid
	return known == uid
}

// kubernetesServiceUID reads the UID of the default/kubernetes Service ("" when
// there is none).
func kubernetesServiceUID(client kubernetes.Interface) func(context.Context) (types.UID, error) {
	return func(ctx context.Context) (types.UID, error) {
		l, err := client.CoreV1().Services(metav1.NamespaceDefault).List(ctx, metav1.ListOptions{
			FieldSelector: "metadata.name=kubernetes", ResourceVersion: "0",
		})
		if err != nil {
			return "", fmt.Errorf("reading the cluster's identity (Service default/kubernetes): %w", err)
		}
		for _, s := range l.Items {
			if s.Name == "kubernetes" { // fake clientsets ignore field selectors
				return s.UID, nil
			}
		}
		return "", nil
	}
}
