package controlplane

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
)

// The real control plane, in a network namespace this test creates:
//
//	host namespace (this test)            netns kproxy-cp-<random>
//	  client-go ── NetnsDialer ──────────▶ lo: 127.0.0.1, <ListenIP>
//	  (socket made inside the netns)         kube-apiserver  <ListenIP>:6443
//	                                         etcd            127.0.0.1:2379
//
// Nothing listens in the host namespace: the servers run behind
// "ip netns exec", and the test's sockets are created inside the namespace
// by a thread that entered it (NetnsDialer), so no traffic or listener ever
// touches the machine's own namespace.

// requirePrivileged skips without root or iproute2, except under CI=true
// where either is a failure.
func requirePrivileged(t *testing.T) {
	t.Helper()
	fail := t.Skipf
	if os.Getenv("CI") == "true" {
		fail = t.Fatalf
	}
	if os.Geteuid() != 0 {
		fail("needs root to create network namespaces (CI=true makes this a failure)")
	}
	if _, err := exec.LookPath("ip"); err != nil {
		fail("needs the ip command (iproute2): %v", err)
	}
}

// testBinaries returns the built servers. A cold build takes minutes, so
// outside CI the test skips when they are missing unless
// KPROXY_CONTROLPLANE_BUILD=1. Under CI=true it builds them ("make
// controlplane" should have, before "go test"): with a warm build cache that
// is a link of about 30 s; a build that would run past the test deadline is
// cancelled and fails with advice instead of a timeout panic.
func testBinaries(t *testing.T) Binaries {
	t.Helper()
	bins, err := Ensure(context.Background(), BuildOptions{NoBuild: true})
	if err == nil {
		return bins
	}
	if !errors.Is(err, ErrNotBuilt) {
		t.Fatal(err)
	}
	if os.Getenv("CI") != "true" && os.Getenv("KPROXY_CONTROLPLANE_BUILD") != "1" {
		t.Skipf("%v; or set KPROXY_CONTROLPLANE_BUILD=1 to build from the test", err)
	}
	ctx := context.Background()
	if dl, ok := t.Deadline(); ok {
		// Leave time for the test itself (about 30 s) and for reporting.
		var cancel context.CancelFunc
		ctx, cancel = context.WithDeadline(ctx, dl.Add(-2*time.Minute))
		defer cancel()
	}
	if bins, err = Ensure(ctx, BuildOptions{Logf: t.Logf}); err != nil {
		if ctx.Err() != nil {
			t.Fatalf("building the control plane did not finish before the test deadline (a cold build takes about "+
				"8 minutes on 2 cores): run go run ./test/controlplane/build before go test, or raise -timeout: %v", err)
		}
		t.Fatal(err)
	}
	return bins
}

func ipCmd(t *testing.T, args ...string) {
	t.Helper()
	if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
		t.Fatalf("ip %s: %v\n%s", strings.Join(args, " "), err, out)
	}
}

// newNetns creates a network namespace with loopback up and addr on it, and
// deletes it when the test ends.
func newNetns(t *testing.T, addr netip.Addr) string {
	t.Helper()
	b := make([]byte, 4)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	name := "kproxy-cp-" + hex.EncodeToString(b)
	ipCmd(t, "netns", "add", name)
	t.Cleanup(func() {
		if out, err := exec.Command("ip", "netns", "del", name).CombinedOutput(); err != nil {
			t.Errorf("deleting netns %s: %v\n%s", name, err, out)
		}
	})
	// Guard: the new namespace must be neither this process's namespace nor
	// PID 1's (skipped when a sandbox hides PID 1).
	var created syscall.Stat_t
	if err := syscall.Stat("/run/netns/"+name, &created); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{"/proc/self/ns/net", "/proc/1/ns/net"} {
		var other syscall.Stat_t
		if err := syscall.Stat(p, &other); err != nil {
			if p == "/proc/self/ns/net" {
				t.Fatal(err)
			}
			continue
		}
		if created.Ino == other.Ino && created.Dev == other.Dev {
			t.Fatalf("netns %s is the same namespace as %s; refusing to continue", name, p)
		}
	}
	ipCmd(t, "-n", name, "link", "set", "lo", "up")
	ipCmd(t, "-n", name, "addr", "add", netip.PrefixFrom(addr, addr.BitLen()).String(), "dev", "lo")
	return name
}

// netnsPIDs lists the processes left in a namespace.
func netnsPIDs(t *testing.T, name string) string {
	t.Helper()
	out, err := exec.Command("ip", "netns", "pids", name).CombinedOutput()
	if err != nil {
		t.Fatalf("ip netns pids %s: %v\n%s", name, err, out)
	}
	return strings.TrimSpace(string(out))
}

func TestControlPlaneInNetns(t *testing.T) {
	requirePrivileged(t)
	bins := testBinaries(t)

	tests := []struct {
		name      string
		listen    netip.Addr
		lifecycle bool // also exercise RBAC, outage, reset
	}{
		{name: "IPv4", listen: netip.MustParseAddr("10.250.0.10"), lifecycle: true},
		{name: "IPv6", listen: netip.MustParseAddr("fd00:250::10")},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
			defer cancel()
			ns := newNetns(t, tt.listen)
			dir := t.TempDir()

			start := time.Now()
			cp, err := Start(ctx, Options{
				Binaries:      bins,
				ListenIP:      tt.listen,
				CommandPrefix: NetnsExecPrefix(ns),
				Dial:          NetnsDialer(ns),
				Dir:           dir,
			})
			if err != nil {
				t.Fatalf("Start: %v", err)
			}
			t.Logf("start to ready: %s (%s)", time.Since(start).Round(10*time.Millisecond), cp.URL)
			t.Cleanup(func() {
				if t.Failed() {
					for _, f := range []string{"etcd.log", "kube-apiserver.log"} {
						t.Logf("--- end of %s ---\n%s", f, logTail(filepath.Join(dir, f), 4000))
					}
				}
				if err := cp.Stop(); err != nil {
					t.Errorf("Stop: %v", err)
				}
				if pids := netnsPIDs(t, ns); pids != "" {
					t.Errorf("processes left in netns %s after Stop: %s", ns, pids)
				}
			})

			admin := clientset(t, cp, Admin)
			svc := createService(ctx, t, admin, "demo")
			if !netip.MustParsePrefix("10.96.0.0/16").Contains(netip.MustParseAddr(svc.Spec.ClusterIP)) {
				t.Errorf("ClusterIP %s is outside the service range", svc.Spec.ClusterIP)
			}
			if !tt.lifecycle {
				return
			}
			testRBACAndAudit(ctx, t, cp, ns)
			testOutage(ctx, t, cp, svc)
			testReset(ctx, t, cp)
		})
	}
}

func clientset(t *testing.T, cp *ControlPlane, id Identity) *kubernetes.Clientset {
	t.Helper()
	rc, err := cp.RESTConfig(id)
	if err != nil {
		t.Fatal(err)
	}
	rc.Timeout = 10 * time.Second
	cs, err := kubernetes.NewForConfig(rc)
	if err != nil {
		t.Fatal(err)
	}
	return cs
}

func createService(ctx context.Context, t *testing.T, cs kubernetes.Interface, name string) *v1.Service {
	t.Helper()
	svc, err := cs.CoreV1().Services("default").Create(ctx, &v1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default"},
		Spec: v1.ServiceSpec{
			Selector: map[string]string{"app": name},
			Ports:    []v1.ServicePort{{Name: "http", Port: 80, Protocol: v1.ProtocolTCP, TargetPort: intstr.FromInt32(8080)}},
		},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("creating Service %s: %v", name, err)
	}
	return svc
}

// eventually polls f (bounded: 100 tries, 200 ms apart) until it returns nil.
func eventually(t *testing.T, what string, f func() error) {
	t.Helper()
	var err error
	for i := 0; i < 100; i++ {
		if err = f(); err == nil {
			return
		}
		time.Sleep(200 * time.Millisecond)
	}
	t.Fatalf("%s: still failing after 20s: %v", what, err)
}

// testRBACAndAudit: the Kproxy identity gets exactly what a ClusterRoleBinding
// to ServiceAccount kube-system/kproxy grants, and every refusal is in the
// audit log.
func testRBACAndAudit(ctx context.Context, t *testing.T, cp *ControlPlane, ns string) {
	admin, kproxy := clientset(t, cp, Admin), clientset(t, cp, Kproxy)

	if _, err := kproxy.CoreV1().Services("").List(ctx, metav1.ListOptions{}); !apierrors.IsForbidden(err) {
		t.Fatalf("kproxy listing services before any binding: err = %v, want Forbidden", err)
	}
	if _, err := admin.RbacV1().ClusterRoles().Create(ctx, &rbacv1.ClusterRole{
		ObjectMeta: metav1.ObjectMeta{Name: "kproxy-test"},
		Rules:      []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"services"}, Verbs: []string{"list", "watch"}}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := admin.RbacV1().ClusterRoleBindings().Create(ctx, &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "kproxy-test"},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "kproxy-test"},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Namespace: "kube-system", Name: "kproxy"}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}

	// The kubeconfig is what kproxy itself would be given.
	kc, err := cp.Kubeconfig(Kproxy)
	if err != nil {
		t.Fatal(err)
	}
	rc, err := clientcmd.RESTConfigFromKubeConfig(kc)
	if err != nil {
		t.Fatal(err)
	}
	rc.Dial = NetnsDialer(ns)
	fromKubeconfig, err := kubernetes.NewForConfig(rc)
	if err != nil {
		t.Fatal(err)
	}
	// RBAC's informers see the new binding within moments.
	eventually(t, "kproxy listing services after the binding", func() error {
		_, err := fromKubeconfig.CoreV1().Services("").List(ctx, metav1.ListOptions{})
		return err
	})
	if _, err := kproxy.CoreV1().Secrets("kube-system").Get(ctx, "anything", metav1.GetOptions{}); !apierrors.IsForbidden(err) {
		t.Errorf("kproxy reading a secret: err = %v, want Forbidden", err)
	}

	denials, err := cp.AuditDenials()
	if err != nil {
		t.Fatal(err)
	}
	var sawList, sawSecret bool
	for _, d := range denials {
		switch {
		case d.User != KproxyUser:
			t.Errorf("unexpected denial for another user: %s", d)
		case d.Verb == "list" && d.Resource == "services" && d.Code == 403:
			sawList = true
		case d.Verb == "get" && d.Resource == "secrets" && d.Namespace == "kube-system" && d.Name == "anything":
			sawSecret = true
		}
	}
	if !sawList || !sawSecret {
		t.Errorf("audit denials lack the refused list services (%v) or get secret (%v):\n%v", sawList, sawSecret, denials)
	}
}

// testOutage stops and restarts kube-apiserver: requests fail while it is
// down, and etcd keeps the objects.
func testOutage(ctx context.Context, t *testing.T, cp *ControlPlane, svc *v1.Service) {
	admin := clientset(t, cp, Admin)
	if err := cp.StopAPIServer(); err != nil {
		t.Fatal(err)
	}
	down, cancel := context.WithTimeout(ctx, 3*time.Second)
	_, err := admin.CoreV1().Services("default").Get(down, svc.Name, metav1.GetOptions{})
	cancel()
	if err == nil {
		t.Fatal("API server still answers after StopAPIServer")
	}
	start := time.Now()
	if err := cp.StartAPIServer(ctx); err != nil {
		t.Fatalf("StartAPIServer: %v", err)
	}
	t.Logf("API server restart to ready: %s", time.Since(start).Round(10*time.Millisecond))
	got, err := admin.CoreV1().Services("default").Get(ctx, svc.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatalf("Service after API server restart: %v", err)
	}
	if got.UID != svc.UID || got.Spec.ClusterIP != svc.Spec.ClusterIP {
		t.Errorf("Service after restart has UID %s ClusterIP %s, want %s %s", got.UID, got.Spec.ClusterIP, svc.UID, svc.Spec.ClusterIP)
	}
}

// testReset wipes etcd: a new cluster behind the same address and tokens.
func testReset(ctx context.Context, t *testing.T, cp *ControlPlane) {
	start := time.Now()
	if err := cp.Reset(ctx); err != nil {
		t.Fatalf("Reset: %v", err)
	}
	t.Logf("reset (wipe etcd, restart both) to ready: %s", time.Since(start).Round(10*time.Millisecond))
	admin, kproxy := clientset(t, cp, Admin), clientset(t, cp, Kproxy)
	if _, err := admin.CoreV1().Services("default").Get(ctx, "demo", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("Service demo after Reset: err = %v, want NotFound", err)
	}
	if _, err := kproxy.CoreV1().Services("").List(ctx, metav1.ListOptions{}); !apierrors.IsForbidden(err) {
		t.Errorf("kproxy after Reset: err = %v, want Forbidden (the binding went with the old cluster)", err)
	}
	eventually(t, "the new cluster's kubernetes Service", func() error {
		_, err := admin.CoreV1().Services("default").Get(ctx, "kubernetes", metav1.GetOptions{})
		return err
	})
	createService(ctx, t, admin, "demo")
}
