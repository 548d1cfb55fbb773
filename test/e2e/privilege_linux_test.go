package e2e

import (
	"fmt"
	"math/rand/v2"
	"net/http"
	"net/netip"
	"os"
	"regexp"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	v1 "k8s.io/api/core/v1"
	"k8s.io/client-go/kubernetes/scheme"

	"github.com/kproxy/kproxy/deploy"
	"github.com/kproxy/kproxy/test/netns"
	"github.com/kproxy/kproxy/test/netns/echo"
	"github.com/kproxy/kproxy/test/proxytest"
)

// daemonSetManifest is the Linux DaemonSet, relative to this package.
const daemonSetManifest = "../../deploy/linux/daemonset.yaml"

// capBits are the capability numbers of linux/capability.h that a
// DaemonSet may add (others fail the test: add them here).
var capBits = map[string]uint{"CHOWN": 0, "DAC_OVERRIDE": 1, "FOWNER": 3, "KILL": 5, "SETGID": 6, "SETUID": 7,
	"SETPCAP": 8, "NET_BIND_SERVICE": 10, "NET_BROADCAST": 11, "NET_ADMIN": 12, "NET_RAW": 13, "IPC_LOCK": 14,
	"SYS_MODULE": 16, "SYS_CHROOT": 18, "SYS_PTRACE": 19, "SYS_ADMIN": 21, "SYS_NICE": 23, "SYS_RESOURCE": 24}

// daemonSetPrivileges reads the kproxy container's securityContext from
// deploy/linux/daemonset.yaml and returns the setpriv command line that
// gives a process the same privileges as a container runtime does (for
// root: the added capabilities are the bounding set, hence effective and
// permitted; none inheritable, as runtimes do since CVE-2022-24769;
// allowPrivilegeEscalation false is no_new_privs) and the capability mask
// /proc then shows.
func daemonSetPrivileges(t *testing.T) (wrapper []string, mask string) {
	t.Helper()
	data, err := os.ReadFile(daemonSetManifest)
	if err != nil {
		t.Fatal(err)
	}
	objs, err := deploy.Decode(scheme.Codecs.UniversalDeserializer(), data)
	if err != nil {
		t.Fatalf("%s: %v", daemonSetManifest, err)
	}
	var sc *v1.SecurityContext
	for _, o := range objs {
		if ds, ok := o.(*appsv1.DaemonSet); ok {
			for _, c := range ds.Spec.Template.Spec.Containers {
				if c.Name == "kproxy" {
					sc = c.SecurityContext
				}
			}
		}
	}
	if sc == nil || sc.Capabilities == nil || (sc.Privileged != nil && *sc.Privileged) ||
		fmt.Sprint(sc.Capabilities.Drop) != "[ALL]" || sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation {
		t.Fatalf("%s: the kproxy container's securityContext %+v is not the one this test models (unprivileged, drop ALL, allowPrivilegeEscalation false)", daemonSetManifest, sc)
	}
	if sc.RunAsUser != nil && *sc.RunAsUser != 0 {
		t.Fatalf("%s: runAsUser %d: this test models root", daemonSetManifest, *sc.RunAsUser)
	}
	var bits uint64
	set := "-all"
	for _, c := range sc.Capabilities.Add {
		n, ok := capBits[strings.TrimPrefix(string(c), "CAP_")]
		if !ok {
			t.Fatalf("%s adds capability %s, unknown to this test", daemonSetManifest, c)
		}
		bits |= 1 << n
		set += ",+" + strings.ToLower(strings.TrimPrefix(string(c), "CAP_"))
	}
	return []string{"setpriv", "--bounding-set=" + set, "--inh-caps=-all", "--no-new-privs", "--"}, fmt.Sprintf("%016x", bits)
}

// procStatus reads the capability and no_new_privs lines of a process.
func procStatus(t *testing.T, pid int) map[string]string {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for _, l := range strings.Split(string(b), "\n") {
		k, v, ok := strings.Cut(l, ":")
		if ok && (strings.HasPrefix(k, "Cap") || k == "NoNewPrivs" || k == "Uid") {
			out[k] = strings.TrimSpace(v)
		}
	}
	return out
}

// deniedLine matches log lines of a call the kernel refused for lack of
// a privilege.
var deniedLine = regexp.MustCompile(`(?i)permission denied|operation not permitted|EPERM|EACCES`)

// TestLeastPrivilege runs kproxy in node1's namespace with the privileges
// deploy/linux/daemonset.yaml gives it: root, with only NET_ADMIN and
// NET_RAW (bounding set, effective and permitted) and no_new_privs. It programs both families (the
// sentinel answers), serves traffic to a ClusterIP from a pod and to a
// NodePort from outside, follows an endpoint change, deletes the stale
// UDP conntrack entry of a client that keeps its source port (netlink),
// and serves /livez and /metrics. Its iptables-restore children have the
// same two capabilities. The log has no refused call but the OOM score,
// which the DaemonSet leaves to the kubelet (lowering it needs
// CAP_SYS_RESOURCE).
func TestLeastPrivilege(t *testing.T) {
	netns.Require(t, "setpriv")
	top := proxytest.Default()
	svc := top.Service("privileged", 107, proxytest.WithNodePort())
	objects := func(pods ...string) []any {
		s, err := top.Slices(svc, proxytest.Ready(pods...)...)
		if err != nil {
			t.Fatal(err)
		}
		return []any{svc, s[0], s[1]}
	}
	e := newEnv(t, envOptions{config: proxytest.DefaultConfig(), objects: objects(proxytest.PodB1), noStart: true})
	wrapper, capMask := daemonSetPrivileges(t)
	if capMask != "0000000000003000" {
		t.Logf("note: the DaemonSet's capabilities are %s, not NET_ADMIN and NET_RAW (0000000000003000)", capMask)
	}
	e.p.Wrapper = wrapper
	e.start()
	ctx := e.ctx(2 * time.Minute)

	pid := e.p.Process().Pid()
	st := procStatus(t, pid)
	for _, k := range []string{"CapEff", "CapPrm", "CapBnd"} {
		if st[k] != capMask {
			t.Errorf("kproxy %s %s, want %s (NET_ADMIN and NET_RAW only)", k, st[k], capMask)
		}
	}
	if st["CapInh"] != "0000000000000000" || st["CapAmb"] != "0000000000000000" || st["NoNewPrivs"] != "1" {
		t.Errorf("kproxy CapInh %s CapAmb %s NoNewPrivs %s, want none, none, 1", st["CapInh"], st["CapAmb"], st["NoNewPrivs"])
	}
	if !strings.HasPrefix(st["Uid"], "0\t") {
		t.Errorf("kproxy Uid %q, want root (as the DaemonSet runs it)", st["Uid"])
	}

	node1, _ := e.top.Node(proxytest.Node1)
	port := 20000 + rand.IntN(20000) // fixed UDP client ports, one per family
	for i, fam := range families() {
		e.requireAnswers(ctx, proxytest.Client1, clusterIP(svc, fam), 3, proxytest.PodB1)
		e.requireAnswers(ctx, proxytest.Outside, netip.AddrPortFrom(node1.Addr(fam), uint16(svc.Spec.Ports[0].NodePort)), 3, proxytest.PodB1)
		if r := e.probe(ctx, "udp", clusterIP(svc, fam), echo.ProbeOptions{LocalPort: port + i}); r.Outcome != echo.Answer || r.Reply.Name != proxytest.PodB1 {
			t.Fatalf("%s UDP before the change: %v, want pod-b1", fam, r)
		}
	}

	// An endpoint change: a partial sync, and the UDP clients' stale
	// conntrack entries deleted over netlink (without that, a client that
	// keeps its source port keeps reaching pod-b1 for the UDP timeout).
	sawChild := make(chan map[string]string, 1)
	go func() {
		if child := restoreChild(pid, 10*time.Second); child > 0 {
			sawChild <- procStatus(t, child)
		}
		close(sawChild)
	}()
	e.write("objects.yaml", objects(proxytest.PodB2)...)
	for i, fam := range families() {
		deadline := time.Now().Add(5 * time.Second)
		var last echo.Result
		for time.Now().Before(deadline) {
			last = e.probe(ctx, "udp", clusterIP(svc, fam), echo.ProbeOptions{LocalPort: port + i, Timeout: 300 * time.Millisecond})
			if last.Outcome == echo.Answer && last.Reply.Name == proxytest.PodB2 {
				break
			}
			time.Sleep(100 * time.Millisecond)
		}
		if last.Outcome != echo.Answer || last.Reply.Name != proxytest.PodB2 {
			t.Errorf("%s UDP client with a fixed port: %v 5 s after the change, want pod-b2 (stale conntrack entry not deleted?)", fam, last)
		}
		e.requireAnswers(ctx, proxytest.Outside, netip.AddrPortFrom(node1.Addr(fam), uint16(svc.Spec.Ports[0].NodePort)), 3, proxytest.PodB2)
	}
	if cst, ok := <-sawChild; ok {
		if cst["CapEff"] != capMask || cst["CapBnd"] != capMask {
			t.Errorf("kproxy's iptables-restore child: CapEff %s CapBnd %s, want %s", cst["CapEff"], cst["CapBnd"], capMask)
		}
	} else {
		t.Log("note: the change's iptables-restore ended before its capabilities could be read")
	}

	if code, body, err := e.get(ctx, "http://127.0.0.1:10256/livez"); err != nil || code != http.StatusOK {
		t.Errorf("/livez %d %q %v", code, body, err)
	}
	code, body, err := e.get(ctx, "http://127.0.0.1:10249/metrics")
	if err != nil || code != http.StatusOK {
		t.Errorf("/metrics %d %v", code, err)
	}
	for _, fam := range families() {
		if !strings.Contains(body, fmt.Sprintf(`kubeproxy_sync_proxy_rules_last_timestamp_seconds{ip_family="%s"}`, fam)) {
			t.Errorf("/metrics: no successful %s sync:\n%s", fam, grepLines(body, "last_timestamp"))
		}
	}
	for _, l := range strings.Split(grepLines(body, "restore_failures_total{"), "\n") {
		if l != "" && !strings.HasSuffix(l, " 0") {
			t.Errorf("/metrics: %s", l)
		}
	}

	var denied []string
	for _, l := range strings.Split(WithoutDumps(e.p.Process().Output()), "\n") {
		if deniedLine.MatchString(l) && !strings.Contains(l, "Could not set the OOM score adjustment") {
			denied = append(denied, l)
		}
	}
	if len(denied) > 0 {
		t.Errorf("kproxy was refused calls with NET_ADMIN and NET_RAW only:\n%s", strings.Join(denied, "\n"))
	}
}

// restoreChild waits until process pid has an iptables-restore child and
// returns the child's pid (0 if none came within limit).
func restoreChild(pid int, limit time.Duration) int {
	deadline := time.Now().Add(limit)
	for time.Now().Before(deadline) {
		if c := childRunning(pid, "restore"); c > 0 {
			return c
		}
		time.Sleep(time.Millisecond)
	}
	return 0
}
