package integration

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
	networking "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer/protobuf"
	"k8s.io/apimachinery/pkg/util/uuid"
	"k8s.io/client-go/kubernetes/scheme"
)

// loadWriters is how many puts the storage loader keeps in flight.
const loadWriters = 16

// storageCodec encodes objects as kube-apiserver stores them: protobuf,
// with the "k8s\x00" prefix and the type in the envelope.
var storageCodec = protobuf.NewSerializer(scheme.Scheme, scheme.Scheme)

// loadStorage puts the bench's N Services and their slices straight into
// etcd, as kube-apiserver would have stored them after creating them
// (ClusterIPs chosen here from the Service range, past the addresses
// Services already hold; defaults filled in; the slices owned by their
// Service as the EndpointSlice controller writes them). The API server
// sees them through its watch on etcd like any write, kproxy lists and
// watches them through the API server, and the changes the benchmark
// measures are ordinary API writes. Creating 200,000 objects through the
// API takes most of an hour on this machine (each Service also allocates
// an IPAddress object); etcd's JSON gateway takes them in transactions of
// etcdTxnOps in about a minute. Each ClusterIP gets its IPAddress object,
// as the IP allocator creates it (without it the allocator's repair loop
// would spend minutes creating 100,000 of them during the measurement);
// the allocator's own cache may still miss them for a while, so nothing
// creates a Service through the API afterwards: the probe Service is
// created before.
func (w *benchWorld) loadStorage(ctx context.Context, svcRange netip.Prefix) {
	b := w.b
	taken := map[netip.Addr]bool{}
	list, err := w.Admin.CoreV1().Services("").List(ctx, metav1.ListOptions{})
	if err != nil {
		b.Fatal(err)
	}
	for _, s := range list.Items {
		for _, ip := range s.Spec.ClusterIPs {
			if a, err := netip.ParseAddr(ip); err == nil {
				taken[a] = true
			}
		}
	}
	ips := make([]netip.Addr, 0, w.n)
	for a := svcRange.Addr().Next().Next(); len(ips) < w.n; a = a.Next() {
		if !svcRange.Contains(a) {
			b.Fatalf("the Service range %s holds fewer than %d free addresses", svcRange, w.n)
		}
		if !taken[a] {
			ips = append(ips, a)
		}
	}

	begin := time.Now()
	load0 := loadAvg()
	now := metav1.NewTime(time.Now().Truncate(time.Second))
	var next atomic.Int64
	var mu sync.Mutex
	var errs []error
	var wg sync.WaitGroup
	client, url := w.ControlPlane.EtcdClient(), w.ControlPlane.EtcdURL()
	for range loadWriters {
		wg.Go(func() {
			for {
				i := int(next.Add(1)) - 1
				if i >= w.n || ctx.Err() != nil {
					return
				}
				svc, ipa, slice := storedBenchObjects(i, ips[i], w.eps, now)
				for _, o := range []struct {
					key string
					obj runtime.Object
				}{
					{"/registry/services/specs/" + benchNamespace + "/" + svc.Name, svc},
					{"/registry/ipaddresses/" + ipa.Name, ipa},
					{"/registry/endpointslices/" + benchNamespace + "/" + slice.Name, slice},
				} {
					v, err := runtime.Encode(storageCodec, o.obj)
					if err == nil {
						err = etcdPutOne(ctx, client, url, o.key, v)
					}
					if err != nil {
						mu.Lock()
						errs = append(errs, fmt.Errorf("%s: %w", o.key, err))
						mu.Unlock()
						return
					}
				}
			}
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		b.Fatal(err)
	}
	// Wait until the API server serves them all (a consistent list).
	for deadline := time.Now().Add(5 * time.Minute); ; {
		l, err := w.Admin.DiscoveryV1().EndpointSlices(benchNamespace).List(ctx, metav1.ListOptions{Limit: 1})
		sl, err2 := w.Admin.CoreV1().Services(benchNamespace).List(ctx, metav1.ListOptions{Limit: 1})
		err = errors.Join(err, err2)
		if err == nil && l.RemainingItemCount != nil && int(*l.RemainingItemCount)+len(l.Items) >= w.n &&
			sl.RemainingItemCount != nil && int(*sl.RemainingItemCount)+len(sl.Items) >= w.n {
			break
		}
		if time.Now().After(deadline) {
			b.Fatalf("the API server does not list the %d slices put into etcd: %v", w.n, err)
		}
		time.Sleep(time.Second)
	}
	took := time.Since(begin)
	w.loadTook = took
	b.Logf("put %d Services × %d endpoints (%d objects with the IPAddresses) into etcd in %v (%.0f objects/s; load average %s → %s)",
		w.n, w.eps, 3*w.n, took.Round(100*time.Millisecond), float64(3*w.n)/took.Seconds(), load0, loadAvg())
	b.ReportMetric(took.Seconds(), "load-s")
}

// storedBenchObjects are Service i, its ClusterIP's IPAddress and its IPv4
// slice as kube-apiserver stores them: type meta set, defaults filled in,
// no resourceVersion.
func storedBenchObjects(i int, ip netip.Addr, eps int, created metav1.Time) (*v1.Service, *networking.IPAddress, *discovery.EndpointSlice) {
	single, cluster := v1.IPFamilyPolicySingleStack, v1.ServiceInternalTrafficPolicyCluster
	svc := benchService(i)
	svc.TypeMeta = metav1.TypeMeta{APIVersion: "v1", Kind: "Service"}
	svc.UID = uuid.NewUUID()
	svc.CreationTimestamp = created
	svc.Spec.ClusterIP = ip.String()
	svc.Spec.ClusterIPs = []string{ip.String()}
	svc.Spec.IPFamilies = []v1.IPFamily{v1.IPv4Protocol}
	svc.Spec.IPFamilyPolicy = &single
	svc.Spec.SessionAffinity = v1.ServiceAffinityNone
	svc.Spec.InternalTrafficPolicy = &cluster
	ipa := &networking.IPAddress{
		TypeMeta: metav1.TypeMeta{APIVersion: "networking.k8s.io/v1", Kind: "IPAddress"},
		ObjectMeta: metav1.ObjectMeta{Name: ip.String(), UID: uuid.NewUUID(), CreationTimestamp: created,
			Labels: map[string]string{networking.LabelIPAddressFamily: string(v1.IPv4Protocol), networking.LabelManagedBy: "ipallocator.k8s.io"}},
		Spec: networking.IPAddressSpec{ParentRef: &networking.ParentReference{Resource: "services", Namespace: svc.Namespace, Name: svc.Name}},
	}
	slice := benchSlice(svc, i*eps, eps)
	AsController(svc, created.Time, slice)
	slice.TypeMeta = metav1.TypeMeta{APIVersion: "discovery.k8s.io/v1", Kind: "EndpointSlice"}
	slice.UID = uuid.NewUUID()
	slice.CreationTimestamp = created
	slice.Generation = 1
	return svc, ipa, slice
}

// etcdPutOne puts one key through etcd's JSON gateway.
func etcdPutOne(ctx context.Context, c *http.Client, url, key string, value []byte) error {
	data, err := json.Marshal(map[string]string{
		"key":   base64.StdEncoding.EncodeToString([]byte(key)),
		"value": base64.StdEncoding.EncodeToString(value),
	})
	if err != nil {
		return err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url+"/v3/kv/put", bytes.NewReader(data))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := c.Do(req)
	if err != nil {
		return fmt.Errorf("etcd put: %w", err)
	}
	defer resp.Body.Close()
	out, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK || !bytes.Contains(out, []byte(`"header"`)) {
		return fmt.Errorf("etcd put: %s: %s", resp.Status, bytes.TrimSpace(out))
	}
	return nil
}
