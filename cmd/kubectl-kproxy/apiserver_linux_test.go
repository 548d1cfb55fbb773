package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/kproxy/kproxy/test/controlplane"
	"github.com/kproxy/kproxy/test/netns"
)

// TestStatusThroughAPIServer runs Status against a real kube-apiserver
// (test/controlplane, in a network namespace of the test's): the Node and
// Pod lists with the label selector, the ConfigMap, and the API server's
// pod proxy for real. No kubelet runs, so the test plays its part: it sets
// pod kproxy-a's status (Running, its IP an address of the namespace) and
// serves kproxy's /healthz and /metrics (kproxy's real metrics registry)
// on that address; pod kproxy-b has no IP, as a pod whose node is down.
// The cluster-backed test (kubelets, test/cluster) will add real kproxy
// pods started by the DaemonSet.
func TestStatusThroughAPIServer(t *testing.T) {
	why := ""
	if os.Geteuid() != 0 {
		why = "needs root (a network namespace for the API server)"
	} else if _, err := exec.LookPath("ip"); err != nil {
		why = "needs ip (iproute2)"
	}
	if why != "" {
		if os.Getenv("CI") == "true" {
			t.Fatal(why + " (CI=true makes this a failure)")
		}
		t.Skip(why)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	bins, err := controlplane.EnsureBinaries(ctx, t.Logf)
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatal(err)
		}
		t.Skipf("no control plane binaries (make controlplane): %v", err)
	}
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	name := netns.Prefix + "plugin-" + hex.EncodeToString(b)
	ipCmd := func(args ...string) {
		t.Helper()
		if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
			t.Fatalf("ip %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
	ipCmd("netns", "add", name)
	t.Cleanup(func() {
		if out, err := exec.Command("ip", "netns", "del", name).CombinedOutput(); err != nil {
			t.Errorf("ip netns del %s: %v\n%s", name, err, out)
		}
	})
	listen := netip.MustParseAddr("10.250.0.10")
	podIP := "10.250.0.20"
	ipCmd("-n", name, "link", "set", "lo", "up")
	ipCmd("-n", name, "addr", "add", listen.String()+"/32", "dev", "lo")
	ipCmd("-n", name, "addr", "add", podIP+"/32", "dev", "lo")
	cp, err := controlplane.Start(ctx, controlplane.Options{Binaries: bins, ListenIP: listen,
		CommandPrefix: controlplane.NetnsExecPrefix(name), Dial: controlplane.NetnsDialer(name)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := cp.Stop(); err != nil {
			t.Errorf("stopping the control plane: %v", err)
		}
	})
	rc, err := cp.RESTConfig(controlplane.Admin)
	if err != nil {
		t.Fatal(err)
	}
	c, err := kubernetes.NewForConfig(rc)
	if err != nil {
		t.Fatal(err)
	}

	// kproxy's two servers on the pod's address, inside the namespace.
	ns, err := netns.Open(name)
	if err != nil {
		t.Fatal(err)
	}
	last := time.Now().Add(-3 * time.Second).Truncate(time.Millisecond).UTC()
	healthOK, _ := json.Marshal(healthBody{LastUpdated: last, CurrentTime: time.Now()})
	metricsText := scrape(t, "nftables", last, map[v1.IPFamily]int{v1.IPv4Protocol: 2})
	serve := func(port string, h http.HandlerFunc) {
		var ln net.Listener
		if err := ns.Do(func() error {
			var err error
			ln, err = net.Listen("tcp", podIP+":"+port)
			return err
		}); err != nil {
			t.Fatal(err)
		}
		srv := &http.Server{Handler: h, ReadHeaderTimeout: 5 * time.Second}
		go func() { _ = srv.Serve(ln) }()
		t.Cleanup(func() { _ = srv.Close() })
	}
	serve("10256", func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/healthz" {
			http.NotFound(w, r)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write(healthOK)
	})
	serve("10249", func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/metrics" {
			http.NotFound(w, r)
			return
		}
		_, _ = w.Write(metricsText)
	})

	const sys = "kube-system"
	for _, n := range []v1.Node{node("n1", "linux"), node("n2", "linux"), node("w1", "windows")} {
		if _, err := c.CoreV1().Nodes().Create(ctx, &n, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	cm := &v1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "kproxy-abc", Namespace: sys},
		Data: map[string]string{"linux.yaml": "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\nmode: iptables\n"}}
	if _, err := c.CoreV1().ConfigMaps(sys).Create(ctx, cm, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	// No controller manager makes the namespace's default ServiceAccount,
	// which admission wants for a pod.
	if _, err := c.CoreV1().ServiceAccounts(sys).Create(ctx, &v1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "default"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	other := kproxyPod("not-kproxy", "n2", "something-else", "kproxy-abc")
	for _, p := range []v1.Pod{kproxyPod("kproxy-a", "n1", linuxApp, "kproxy-abc"), kproxyPod("kproxy-b", "n2", linuxApp, "kproxy-abc"), other} {
		p.ResourceVersion, p.CreationTimestamp = "", metav1.Time{}
		if _, err := c.CoreV1().Pods(sys).Create(ctx, &p, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	a, err := c.CoreV1().Pods(sys).Get(ctx, "kproxy-a", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	a.Status.Phase = v1.PodRunning
	a.Status.PodIP = podIP
	a.Status.PodIPs = []v1.PodIP{{IP: podIP}}
	if _, err := c.CoreV1().Pods(sys).UpdateStatus(ctx, a, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}

	rows, err := Status(ctx, c, sys, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	byNode := map[string]NodeStatus{}
	for _, r := range rows {
		byNode[r.Node] = r
		t.Logf("%+v", r)
	}
	if len(rows) != 3 {
		t.Errorf("%d rows, want 3 (one per Node)", len(rows))
	}
	n1 := byNode["n1"]
	if n1.Pod != "kproxy-a" || n1.Health != "healthy" || n1.Mode != "nftables" || n1.ModeFrom != "metrics" || n1.Version != "v0.4.2" ||
		n1.Quarantined == nil || *n1.Quarantined != 2 || n1.LastSync == nil || !n1.LastSync.Equal(last) {
		t.Errorf("n1: %+v; want kproxy-a healthy, nftables from its metrics, v0.4.2, 2 quarantined, last sync %v", n1, last)
	}
	n2 := byNode["n2"]
	if n2.Pod != "kproxy-b" || n2.Health != "unreachable" || n2.Mode != "iptables" || n2.ModeFrom != "configmap" || n2.Version != "v0.4.1 (image)" {
		t.Errorf("n2: %+v; want kproxy-b unreachable, iptables from the ConfigMap, the image's tag", n2)
	}
	if w1 := byNode["w1"]; w1.Pod != "" || w1.Health != "no pod" {
		t.Errorf("w1: %+v; want no pod", w1)
	}
}
