package integration

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	v1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/kproxy/kproxy/test/controlplane"
	"github.com/kproxy/kproxy/test/e2e"
	"github.com/kproxy/kproxy/test/netns"
	"github.com/kproxy/kproxy/test/proxytest"
)

// ControlPlaneHost is the name of the control plane's namespace on the node
// network (netns.Cluster.AddLANHost).
const ControlPlaneHost = "control-plane"

// The control plane's addresses on the node network; kube-apiserver listens
// on the IPv4 one.
var (
	ControlPlaneIPv4 = netip.MustParseAddr("192.168.50.10")
	ControlPlaneIPv6 = netip.MustParseAddr("fd00:50::10")
)

// Ports of kproxy's HTTP servers inside its node's namespace.
const (
	MetricsAddr = "127.0.0.1:10249"
	HealthzAddr = "0.0.0.0:10256"
)

// Options configure Start.
type Options struct {
	// Cluster is the namespace topology (netns.New or netns.Setup). Required.
	Cluster *netns.Cluster
	// Binaries are the control plane's servers (controlplane.Ensure). Required.
	Binaries controlplane.Binaries
	// DeployDir holds kproxy's RBAC files, RBACFiles (default: <repository
	// root>/deploy/rbac).
	DeployDir string
	// Dir receives the control plane's files and kproxy's kubeconfig
	// (default: a temporary directory that Close removes).
	Dir string
	// QPS and Burst of the admin client (defaults 200 and 400).
	QPS   float32
	Burst int
	// Logf receives progress lines (optional).
	Logf func(format string, args ...any)
}

// Env is a control plane on a namespace topology's node network, with
// kproxy's RBAC from deploy/ and the topology's Nodes in it.
type Env struct {
	Cluster      *netns.Cluster
	ControlPlane *controlplane.ControlPlane
	// NS is the control plane's namespace.
	NS *netns.NS
	// Admin is a client with the Admin identity (system:masters).
	Admin kubernetes.Interface
	// Writer writes Services and EndpointSlices through Admin.
	Writer *Writer
	RBAC   *RBAC
	// Kubeconfig is the path of kproxy's kubeconfig: the API server's
	// address on the node network and the Kproxy identity's token.
	Kubeconfig string

	dir     string
	ownsDir bool
	logf    func(string, ...any)
	// starting are the periods kube-apiserver was starting (StartAPIServer).
	starting []window
}

// window is a period of time.
type window struct{ from, to time.Time }

func (w window) contains(t time.Time) bool { return !t.Before(w.from) && !t.After(w.to) }

// Start adds the control-plane namespace to the node network, starts etcd
// and kube-apiserver in it (Service ranges from the topology, so the
// proxytest builders' ClusterIPs are valid), applies kproxy's RBAC from
// deploy/ and creates the topology's Nodes. On error nothing is left
// running (the namespace goes with the Cluster).
func Start(ctx context.Context, o Options) (*Env, error) {
	if o.Cluster == nil {
		return nil, errors.New("integration: Options.Cluster is required")
	}
	e := &Env{Cluster: o.Cluster, dir: o.Dir, logf: o.Logf}
	if e.logf == nil {
		e.logf = func(string, ...any) {}
	}
	if o.DeployDir == "" {
		wd, err := os.Getwd()
		if err != nil {
			return nil, fmt.Errorf("integration: %w", err)
		}
		root, err := controlplane.RepoRoot(wd)
		if err != nil {
			return nil, fmt.Errorf("integration: %w", err)
		}
		o.DeployDir = filepath.Join(root, "deploy", "rbac")
	}
	rbac, err := LoadRBAC(o.DeployDir)
	if err != nil {
		return nil, err
	}
	if rbac.User() != controlplane.KproxyUser {
		return nil, fmt.Errorf("integration: deploy/ binds %s, but the control plane's kproxy token is %s", rbac.User(), controlplane.KproxyUser)
	}
	e.RBAC = rbac
	if e.dir == "" {
		if e.dir, err = os.MkdirTemp("", "kproxy-integration-"); err != nil {
			return nil, fmt.Errorf("integration: %w", err)
		}
		e.ownsDir = true
	}
	if err := e.start(ctx, o); err != nil {
		return nil, errors.Join(err, e.Close())
	}
	return e, nil
}

func (e *Env) start(ctx context.Context, o Options) error {
	ns, err := e.Cluster.AddLANHost(ctx, ControlPlaneHost, ControlPlaneIPv4, ControlPlaneIPv6)
	if err != nil {
		return err
	}
	e.NS = ns
	top := e.Cluster.Topology
	begin := time.Now()
	e.ControlPlane, err = controlplane.Start(ctx, controlplane.Options{
		Binaries:              o.Binaries,
		ListenIP:              ControlPlaneIPv4,
		CommandPrefix:         controlplane.NetnsExecPrefix(ns.Name),
		Dial:                  controlplane.NetnsDialer(ns.Name),
		ServiceClusterIPRange: top.ServiceCIDR4.String() + "," + top.ServiceCIDR6.String(),
		Dir:                   filepath.Join(e.dir, "controlplane"),
	})
	if err != nil {
		return fmt.Errorf("integration: %w", err)
	}
	e.logf("integration: control plane ready at %s in %v", e.ControlPlane.URL, time.Since(begin).Round(time.Millisecond))
	rc, err := e.ControlPlane.RESTConfig(controlplane.Admin)
	if err != nil {
		return fmt.Errorf("integration: %w", err)
	}
	rc.QPS, rc.Burst = 200, 400
	if o.QPS > 0 {
		rc.QPS = o.QPS
	}
	if o.Burst > 0 {
		rc.Burst = o.Burst
	}
	rc.UserAgent = "kproxy-integration-test"
	if e.Admin, err = kubernetes.NewForConfig(rc); err != nil {
		return fmt.Errorf("integration: admin client: %w", err)
	}
	e.Writer = &Writer{Client: e.Admin, Topology: top}
	kc, err := e.ControlPlane.Kubeconfig(controlplane.Kproxy)
	if err != nil {
		return fmt.Errorf("integration: %w", err)
	}
	e.Kubeconfig = filepath.Join(e.dir, "kproxy.kubeconfig")
	if err := os.WriteFile(e.Kubeconfig, kc, 0o600); err != nil {
		return fmt.Errorf("integration: writing kproxy's kubeconfig: %w", err)
	}
	return e.Bootstrap(ctx)
}

// Bootstrap applies kproxy's RBAC and creates the topology's Nodes: what a
// new cluster needs before kproxy can run on node1.
func (e *Env) Bootstrap(ctx context.Context) error {
	if err := e.RBAC.Apply(ctx, e.Admin); err != nil {
		return fmt.Errorf("integration: %w", err)
	}
	for _, n := range e.Cluster.Topology.NodeObjects() {
		if _, err := e.Admin.CoreV1().Nodes().Create(ctx, n, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
			return fmt.Errorf("integration: creating Node %s: %w", n.Name, err)
		}
	}
	return nil
}

// Close stops the control plane and removes the directory Start created.
// The namespace is removed with the Cluster.
func (e *Env) Close() error {
	var errs []error
	if e.ControlPlane != nil {
		errs = append(errs, e.ControlPlane.Stop())
	}
	if e.ownsDir {
		errs = append(errs, os.RemoveAll(e.dir))
	}
	return errors.Join(errs...)
}

// Proxy returns a kproxy runner for a node of the topology ("" for the
// proxy node), watching this control plane through Kubeconfig, with the
// metrics and health servers on MetricsAddr and HealthzAddr. extra flags
// come last (a later flag wins).
func (e *Env) Proxy(binary, host, logDir string, extra ...string) *e2e.Proxy {
	flags := []string{
		"--kubeconfig", e.Kubeconfig,
		"--metrics-bind-address", MetricsAddr,
		"--healthz-bind-address", HealthzAddr,
	}
	return &e2e.Proxy{Cluster: e.Cluster, Binary: binary, Host: host, LogDir: logDir, Extra: append(flags, extra...)}
}

// StartAPIServer starts kube-apiserver after ControlPlane.StopAPIServer
// and remembers the period it took to become ready: a client that
// reconnects at once may be refused while the server's RBAC caches fill
// (kube-apiserver serves requests before /readyz succeeds), which CheckRBAC
// tells apart from refusals by RBAC rules.
func (e *Env) StartAPIServer(ctx context.Context) error {
	from := time.Now()
	err := e.ControlPlane.StartAPIServer(ctx)
	// Audit timestamps are taken by the server: allow a second of slack.
	e.starting = append(e.starting, window{from: from.Add(-time.Second), to: time.Now().Add(time.Second)})
	if err != nil {
		return fmt.Errorf("integration: %w", err)
	}
	return nil
}

// KproxyRequests returns the requests kproxy's identity made, from the
// audit log (kept across Reset).
func (e *Env) KproxyRequests() ([]controlplane.Request, error) {
	return e.ControlPlane.AuditRequests(controlplane.KproxyUser)
}

// RBACReport is what CheckRBAC found.
type RBACReport struct {
	// Calls are the distinct calls kproxy made (controlplane.Request.Call).
	Calls []string
	// WhileStarting are refusals of calls deploy/'s ClusterRole grants, made
	// while kube-apiserver was starting (see StartAPIServer): not caused by
	// RBAC rules.
	WhileStarting []controlplane.Request
}

// CheckRBAC checks kproxy's requests so far, from the audit log: every call
// must be granted by deploy/'s ClusterRole alone, and the API server must
// have allowed every request except, for calls the ClusterRole grants,
// while it was starting. An error lists every request that breaks this.
func (e *Env) CheckRBAC() (RBACReport, error) {
	var rep RBACReport
	reqs, err := e.KproxyRequests()
	if err != nil {
		return rep, err
	}
	var errs []error
	for _, r := range reqs {
		switch {
		case !e.RBAC.Allows(r):
			errs = append(errs, fmt.Errorf("not granted by deploy/'s ClusterRole %s: %s", e.RBAC.ClusterRole.Name, r))
		case r.Decision == "allow":
		case e.whileStarting(r.Received):
			rep.WhileStarting = append(rep.WhileStarting, r)
		default:
			errs = append(errs, fmt.Errorf("refused by the API server: %s", r))
		}
	}
	if len(reqs) == 0 {
		errs = append(errs, errors.New("the audit log holds no request from kproxy"))
	}
	// Cross-check with the control plane's own reader of denials.
	denials, err := e.ControlPlane.AuditDenials()
	if err != nil {
		return rep, err
	}
	tolerated := map[string]bool{}
	for _, r := range rep.WhileStarting {
		tolerated[r.AuditID] = true
	}
	for _, d := range denials {
		if d.User == controlplane.KproxyUser && !tolerated[d.AuditID] && !slices.ContainsFunc(errs, func(err error) bool { return strings.Contains(err.Error(), d.RequestURI) }) {
			errs = append(errs, fmt.Errorf("denied: %s", d))
		}
	}
	rep.Calls = controlplane.Calls(reqs)
	return rep, errors.Join(errs...)
}

func (e *Env) whileStarting(t time.Time) bool {
	for _, w := range e.starting {
		if w.contains(t) {
			return true
		}
	}
	return false
}

// BlockAPI makes the API server unreachable from the node network (TCP
// resets for its port; the test's own connections, made inside the
// control-plane namespace, still work), and UnblockAPI undoes it. Used
// around Reset so that kproxy never meets a new cluster before its RBAC
// exists.
func (e *Env) BlockAPI(ctx context.Context) error {
	return e.apiRule(ctx, "-I")
}

// UnblockAPI removes BlockAPI's rule.
func (e *Env) UnblockAPI(ctx context.Context) error {
	return e.apiRule(ctx, "-D")
}

func (e *Env) apiRule(ctx context.Context, op string) error {
	port := strings.TrimPrefix(e.ControlPlane.URL[strings.LastIndex(e.ControlPlane.URL, ":"):], ":")
	_, err := e.NS.Exec(ctx, "iptables", "-w", op, "INPUT", "!", "-i", "lo", "-p", "tcp", "--dport", port,
		"-j", "REJECT", "--reject-with", "tcp-reset")
	return err
}

// Reset makes a new cluster behind the same address: the API server is
// blocked for the node network, etcd's data is wiped, both servers start
// again, Bootstrap runs, and the API server is unblocked.
func (e *Env) Reset(ctx context.Context) error {
	if err := e.BlockAPI(ctx); err != nil {
		return err
	}
	if err := e.ControlPlane.Reset(ctx); err != nil {
		return errors.Join(fmt.Errorf("integration: %w", err), e.UnblockAPI(ctx))
	}
	if err := e.Bootstrap(ctx); err != nil {
		return errors.Join(err, e.UnblockAPI(ctx))
	}
	return e.UnblockAPI(ctx)
}

// Get makes an HTTP GET from inside a host's namespace and returns the
// status and body.
func (e *Env) Get(ctx context.Context, host, url string) (int, []byte, error) {
	ns, err := e.Cluster.MustNS(host)
	if err != nil {
		return 0, nil, err
	}
	c := &http.Client{
		Timeout: 5 * time.Second,
		Transport: &http.Transport{
			DialContext:       controlplane.NetnsDialer(ns.Name),
			DisableKeepAlives: true,
			Proxy:             nil,
		},
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return 0, nil, err
	}
	resp, err := c.Do(req)
	if err != nil {
		return 0, nil, fmt.Errorf("GET %s from %s: %w", url, host, err)
	}
	defer func() { _ = resp.Body.Close() }()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 16<<20))
	if err != nil {
		return resp.StatusCode, body, fmt.Errorf("GET %s from %s: %w", url, host, err)
	}
	return resp.StatusCode, body, nil
}

// Scrape reads kproxy's /metrics in a host's namespace.
func (e *Env) Scrape(ctx context.Context, host string) (Metrics, error) {
	code, body, err := e.Get(ctx, host, "http://"+MetricsAddr+"/metrics")
	if err != nil {
		return nil, err
	}
	if code != http.StatusOK {
		return nil, fmt.Errorf("/metrics in %s: status %d: %.200s", host, code, body)
	}
	return ParseMetrics(string(body))
}

// Health returns the status and body of kproxy's /healthz or /livez in a
// host's namespace.
func (e *Env) Health(ctx context.Context, host, path string) (int, string, error) {
	_, port, _ := strings.Cut(HealthzAddr, ":")
	code, body, err := e.Get(ctx, host, "http://127.0.0.1:"+port+path)
	return code, string(body), err
}

// SeedFlavour gives a node a host firewall in one iptables flavour
// ("legacy" or "nft"), as e2e does: FORWARD policy DROP and a stateful
// INPUT rule, in both families. kproxy follows the flavour the host uses,
// so this picks the flavour it programs.
func SeedFlavour(ctx context.Context, c *netns.Cluster, host, flavour string) error {
	for _, bin := range []string{"iptables-" + flavour, "ip6tables-" + flavour} {
		for _, args := range [][]string{
			{"-w", "-P", "FORWARD", "DROP"},
			{"-w", "-A", "INPUT", "-m", "conntrack", "--ctstate", "RELATED,ESTABLISHED", "-j", "ACCEPT"},
		} {
			if _, err := c.Exec(ctx, host, append([]string{bin}, args...)...); err != nil {
				return err
			}
		}
	}
	return nil
}

// Save returns iptables-save output of one table, family ("4" or "6") and
// flavour in a host's namespace.
func Save(ctx context.Context, c *netns.Cluster, host string, fam v1.IPFamily, flavour, table string) (string, error) {
	bin := "iptables-" + flavour + "-save"
	if fam == v1.IPv6Protocol {
		bin = "ip6tables-" + flavour + "-save"
	}
	out, err := c.Exec(ctx, host, bin, "-t", table)
	return string(out), err
}

// ProcMemory reads VmRSS and VmHWM of a process.
func ProcMemory(pid int) (Memory, error) {
	data, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		return Memory{}, fmt.Errorf("reading memory of pid %d: %w", pid, err)
	}
	return parseProcStatus(string(data))
}

// AcceptPodForwarding adds to a node, in one iptables flavour and both
// families, what a CNI plugin adds (flannel does exactly this): forward
// pod traffic despite SeedFlavour's FORWARD policy DROP. Upstream
// kube-proxy relies on it for pod → ClusterIP connections; kproxy accepts
// them itself.
func AcceptPodForwarding(ctx context.Context, c *netns.Cluster, host, flavour string) error {
	top := c.Topology
	for _, fam := range []struct {
		bin  string
		cidr string
	}{{"iptables-" + flavour, top.ClusterCIDR4.String()}, {"ip6tables-" + flavour, top.ClusterCIDR6.String()}} {
		for _, dir := range []string{"-s", "-d"} {
			if _, err := c.Exec(ctx, host, fam.bin, "-w", "-A", "FORWARD", dir, fam.cidr, "-j", "ACCEPT"); err != nil {
				return err
			}
		}
	}
	return nil
}

// GrantServiceCIDRs lets the kproxy identity read ServiceCIDRs, which
// kube-proxy v1.37 watches (kubeadm's system:node-proxier grants it;
// kproxy does not need it, so deploy/'s ClusterRole does not): upstream
// kube-proxy then runs with kproxy's kubeconfig.
func (e *Env) GrantServiceCIDRs(ctx context.Context) error {
	role := &rbacv1.ClusterRole{
		ObjectMeta: metav1.ObjectMeta{Name: "test-kube-proxy-servicecidrs"},
		Rules: []rbacv1.PolicyRule{{APIGroups: []string{"networking.k8s.io"}, Resources: []string{"servicecidrs"},
			Verbs: []string{"get", "list", "watch"}}},
	}
	binding := &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: role.Name},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: role.Name},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.UserKind, APIGroup: rbacv1.GroupName, Name: controlplane.KproxyUser}},
	}
	if _, err := e.Admin.RbacV1().ClusterRoles().Create(ctx, role, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("creating ClusterRole %s: %w", role.Name, err)
	}
	if _, err := e.Admin.RbacV1().ClusterRoleBindings().Create(ctx, binding, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("creating ClusterRoleBinding %s: %w", binding.Name, err)
	}
	return nil
}

// WaitProgrammed waits, after p.Start, until the proxy p (kproxy or
// upstream kube-proxy, in the proxy node) has programmed its node: its
// /healthz is 200, both families have synced
// (kubeproxy_sync_proxy_rules_last_timestamp_seconds is set: as
// upstream, /healthz is 200 before the first sync) and every sentinel
// address answers from the node. what names the proxy in errors, which
// carry the end of its output when it exited.
func (e *Env) WaitProgrammed(ctx context.Context, p *e2e.Proxy, what string, sentinel ...netip.AddrPort) error {
	node := e.Cluster.Topology.ProxyNode
	exited := func() error {
		return fmt.Errorf("%s exited: %v\n%s", what, p.Process().Err(), e2e.LastLines(p.Process().Output(), 40))
	}
	for {
		code, body, err := e.Health(ctx, node, "/healthz")
		if err == nil && code == 200 {
			break
		}
		select {
		case <-p.Process().Done():
			return exited()
		case <-ctx.Done():
			return fmt.Errorf("%s: /healthz never 200 (last %d %s %v)\n%s", what, code, body, err, e2e.LastLines(p.Process().Output(), 40))
		case <-time.After(200 * time.Millisecond):
		}
	}
	for {
		m, err := e.Scrape(ctx, node)
		if err == nil {
			v4, ok4 := m.Get("kubeproxy_sync_proxy_rules_last_timestamp_seconds", "ip_family", "IPv4")
			v6, ok6 := m.Get("kubeproxy_sync_proxy_rules_last_timestamp_seconds", "ip_family", "IPv6")
			if ok4 && ok6 && v4 > 0 && v6 > 0 {
				break
			}
		}
		select {
		case <-p.Process().Done():
			return exited()
		case <-ctx.Done():
			return fmt.Errorf("%s: never synced both families (%v)", what, err)
		case <-time.After(100 * time.Millisecond):
		}
	}
	if err := e2e.WaitReady(ctx, e.Cluster, node, sentinel...); err != nil {
		return fmt.Errorf("%s never programmed the sentinel: %w", what, err)
	}
	return nil
}

// Sentinel creates the readiness Service "kpt-ready" (e2e.Sentinel:
// ClusterIP, one endpoint on the proxy node) through the API and returns
// the stored Service.
func (e *Env) Sentinel(ctx context.Context) (*v1.Service, error) {
	svc, err := e.Writer.CreateService(ctx, e.Cluster.Topology.Service("kpt-ready", e2e.SentinelIndex))
	if err != nil {
		return nil, err
	}
	if _, err := e.Writer.SetEndpoints(ctx, svc, proxytest.Ready(proxytest.PodA2)...); err != nil {
		return nil, err
	}
	return svc, nil
}
