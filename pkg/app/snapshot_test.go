package app

import (
	"context"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/kproxy/kproxy/pkg/config"
)

// TestSnapshotWaitsForTheNode: a snapshot from the API server (kproxy
// explain, kubectl kproxy explain) holds the node even when the Node's list
// comes after the Services' and EndpointSlices' (it once did not: explain
// then said the node did not exist, at random).
func TestSnapshotWaitsForTheNode(t *testing.T) {
	node := &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node1"},
		Status: v1.NodeStatus{Addresses: []v1.NodeAddress{{Type: v1.NodeInternalIP, Address: "192.168.50.11"}}}}
	client := fake.NewClientset(node)
	client.PrependReactor("list", "nodes", func(k8stesting.Action) (bool, runtime.Object, error) {
		time.Sleep(300 * time.Millisecond) // a slow Node list; the reactor chain goes on
		return false, nil, nil
	})
	o := config.NewOptions()
	o.NodeName = "node1"
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	snap, err := SnapshotFrom(ctx, o, client, "fake")
	if err != nil {
		t.Fatal(err)
	}
	if !snap.Node.Known || len(snap.Node.Addresses) != 1 {
		t.Errorf("the snapshot's node: %+v, want node1 with its address", snap.Node)
	}
}
