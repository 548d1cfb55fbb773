package controlplane

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// DialFunc dials addr on network, like net.Dialer.DialContext.
type DialFunc func(ctx context.Context, network, addr string) (net.Conn, error)

// Options configure Start. Zero values pick the defaults named per field.
type Options struct {
	// Binaries are the servers to run (from EnsureBinaries). Required.
	Binaries Binaries

	// ListenIP is the address kube-apiserver listens on and advertises, and
	// the IP SAN of its serving certificate. It must exist where the processes
	// run (inside the namespace of CommandPrefix). Default 127.0.0.1.
	ListenIP netip.Addr
	// CommandPrefix runs both processes through another command, typically
	// NetnsExecPrefix(name) to place them in a network namespace. The last
	// element must exec the server (as "ip netns exec" does) so that stopping
	// the process stops the server.
	CommandPrefix []string
	// AllowCurrentNamespace permits an empty CommandPrefix, so the servers
	// listen in this process's own network namespace. Leave it false in tests
	// that run on a developer's machine: Start refuses rather than listen in
	// the machine's initial namespace by accident.
	AllowCurrentNamespace bool
	// Dial is how this process reaches ListenIP and etcd's loopback address
	// (for readiness checks and RESTConfig). Default: a plain net.Dialer,
	// which only works with AllowCurrentNamespace; with a namespace prefix
	// pass NetnsDialer for the same namespace.
	Dial DialFunc

	// SecurePort is kube-apiserver's HTTPS port. Default 6443.
	SecurePort int
	// EtcdClientPort and EtcdPeerPort are etcd's ports on 127.0.0.1 (inside
	// the namespace). Defaults 2379 and 2380.
	EtcdClientPort int
	EtcdPeerPort   int
	// ServiceClusterIPRange is --service-cluster-ip-range. Default 10.96.0.0/16.
	// Two comma-separated CIDRs make the cluster dual-stack.
	ServiceClusterIPRange string
	// ServiceNodePortRange is --service-node-port-range. Default 30000-32767.
	ServiceNodePortRange string
	// AuthorizationModes is --authorization-mode. Default "RBAC".
	AuthorizationModes string
	// EndpointReconcilerType is --endpoint-reconciler-type. Default "none"
	// (no kubelets: the kubernetes Service's endpoints stay out of the way);
	// a cluster with nodes wants "lease".
	EndpointReconcilerType string
	// Users are more identities of --token-auth-file (kubelets, controllers),
	// each with a random token (ControlPlane.UserKubeconfig).
	Users []User
	// ExtraAPIServerArgs are appended to kube-apiserver's arguments (a later
	// flag wins over an earlier one).
	ExtraAPIServerArgs []string

	// Dir holds certificates, tokens, etcd data and logs. Default: a new
	// temporary directory that Stop removes. A Dir given here is kept.
	Dir string
	// Output, when set, also receives both servers' output, each line
	// prefixed with the server's name. The output always goes to
	// <Dir>/etcd.log and <Dir>/kube-apiserver.log. Both servers write to
	// it, so it must be safe for concurrent use.
	Output io.Writer
	// ReadyTimeout bounds each wait for a server to become ready. Default 2m.
	ReadyTimeout time.Duration
	// StopTimeout is how long a server gets to exit after SIGTERM before it
	// is killed. Default 20s.
	StopTimeout time.Duration
}

// NetnsExecPrefix is the CommandPrefix that runs a server inside the named
// network namespace (created with "ip netns add NAME").
func NetnsExecPrefix(name string) []string {
	return []string{"ip", "netns", "exec", name}
}

// withDefaults validates o and fills in its defaults.
func (o Options) withDefaults() (Options, error) {
	var errs []error
	if o.Binaries.Etcd == "" || o.Binaries.KubeAPIServer == "" {
		errs = append(errs, errors.New("Binaries: etcd and kube-apiserver paths are required (see EnsureBinaries)"))
	}
	if len(o.CommandPrefix) == 0 && !o.AllowCurrentNamespace {
		errs = append(errs, errors.New("CommandPrefix is empty: refusing to listen in this process's network namespace "+
			"(use NetnsExecPrefix, or set AllowCurrentNamespace when already inside a dedicated namespace)"))
	}
	if !o.ListenIP.IsValid() {
		o.ListenIP = netip.MustParseAddr("127.0.0.1")
	}
	o.ListenIP = o.ListenIP.Unmap()
	if o.ListenIP.IsUnspecified() || o.ListenIP.IsMulticast() {
		errs = append(errs, fmt.Errorf("ListenIP %s: must be a unicast address", o.ListenIP))
	}
	if o.ListenIP.Zone() != "" {
		errs = append(errs, fmt.Errorf("ListenIP %s: zoned addresses are not supported", o.ListenIP))
	}
	if o.SecurePort == 0 {
		o.SecurePort = 6443
	}
	if o.EtcdClientPort == 0 {
		o.EtcdClientPort = 2379
	}
	if o.EtcdPeerPort == 0 {
		o.EtcdPeerPort = 2380
	}
	for _, p := range []struct {
		name string
		v    int
	}{{"SecurePort", o.SecurePort}, {"EtcdClientPort", o.EtcdClientPort}, {"EtcdPeerPort", o.EtcdPeerPort}} {
		if p.v < 1 || p.v > 65535 {
			errs = append(errs, fmt.Errorf("%s %d: out of range 1-65535", p.name, p.v))
		}
	}
	if o.EtcdClientPort == o.EtcdPeerPort {
		errs = append(errs, fmt.Errorf("EtcdClientPort and EtcdPeerPort are both %d", o.EtcdClientPort))
	}
	if o.ServiceClusterIPRange == "" {
		o.ServiceClusterIPRange = "10.96.0.0/16"
	}
	if _, err := firstServiceIP(o.ServiceClusterIPRange); err != nil {
		errs = append(errs, err)
	}
	if o.ServiceNodePortRange == "" {
		o.ServiceNodePortRange = "30000-32767"
	}
	if o.AuthorizationModes == "" {
		o.AuthorizationModes = "RBAC"
	}
	if o.EndpointReconcilerType == "" {
		o.EndpointReconcilerType = "none"
	}
	seen := map[string]bool{AdminUser: true, KproxyUser: true}
	for _, u := range o.Users {
		if u.Name == "" || strings.ContainsAny(u.Name, ",\"\n") || seen[u.Name] {
			errs = append(errs, fmt.Errorf("Users: %q is empty, repeated or holds a comma, quote or newline", u.Name))
		}
		seen[u.Name] = true
		for _, g := range u.Groups {
			if g == "" || strings.ContainsAny(g, ",\"\n") {
				errs = append(errs, fmt.Errorf("Users: %s: group %q is empty or holds a comma, quote or newline", u.Name, g))
			}
		}
	}
	if o.ReadyTimeout <= 0 {
		o.ReadyTimeout = 2 * time.Minute
	}
	if o.StopTimeout <= 0 {
		o.StopTimeout = 20 * time.Second
	}
	if o.Dial == nil {
		o.Dial = (&net.Dialer{Timeout: 10 * time.Second}).DialContext
	}
	return o, errors.Join(errs...)
}

// firstServiceIP returns the first usable address of the first CIDR in r (the
// kubernetes Service's ClusterIP).
func firstServiceIP(r string) (netip.Addr, error) {
	first, _, _ := strings.Cut(r, ",")
	p, err := netip.ParsePrefix(strings.TrimSpace(first))
	if err != nil {
		return netip.Addr{}, fmt.Errorf("ServiceClusterIPRange %q: %w", r, err)
	}
	return p.Masked().Addr().Next(), nil
}

// layout names the files of one control plane under its directory.
type layout struct{ dir string }

func (l layout) path(name string) string { return filepath.Join(l.dir, name) }
func (l layout) caCert() string          { return l.path("ca.crt") }
func (l layout) servingCert() string     { return l.path("apiserver.crt") }
func (l layout) servingKey() string      { return l.path("apiserver.key") }
func (l layout) saKey() string           { return l.path("sa.key") }
func (l layout) saPub() string           { return l.path("sa.pub") }
func (l layout) kubeletClientCert() string {
	return l.path("apiserver-kubelet-client.crt")
}
func (l layout) kubeletClientKey() string { return l.path("apiserver-kubelet-client.key") }
func (l layout) tokens() string           { return l.path("tokens.csv") }
func (l layout) auditPolicy() string      { return l.path("audit-policy.yaml") }
func (l layout) auditLog() string         { return l.path("audit.log") }
func (l layout) etcdData() string         { return l.path("etcd-data") }
func (l layout) certDir() string          { return l.path("apiserver-certs") }
func (l layout) log(name string) string   { return l.path(name + ".log") }

func (o Options) etcdClientURL() string {
	return "http://" + net.JoinHostPort("127.0.0.1", strconv.Itoa(o.EtcdClientPort))
}

func (o Options) etcdPeerURL() string {
	return "http://" + net.JoinHostPort("127.0.0.1", strconv.Itoa(o.EtcdPeerPort))
}

// apiURL is the address clients use.
func (o Options) apiURL() string {
	return "https://" + net.JoinHostPort(o.ListenIP.String(), strconv.Itoa(o.SecurePort))
}

// etcdArgs are etcd's arguments. etcd listens on loopback only: nothing but
// kube-apiserver, in the same namespace, talks to it.
func etcdArgs(o Options, l layout) []string {
	return []string{
		"--name=kproxy-test",
		"--data-dir=" + l.etcdData(),
		"--listen-client-urls=" + o.etcdClientURL(),
		"--advertise-client-urls=" + o.etcdClientURL(),
		"--listen-peer-urls=" + o.etcdPeerURL(),
		"--initial-advertise-peer-urls=" + o.etcdPeerURL(),
		"--initial-cluster=kproxy-test=" + o.etcdPeerURL(),
		"--initial-cluster-state=new",
		// Test data is thrown away; fsync only slows the benchmarks down.
		"--unsafe-no-fsync=true",
		"--log-level=warn",
	}
}

// apiserverArgs are kube-apiserver's arguments.
func apiserverArgs(o Options, l layout) []string {
	args := []string{
		"--etcd-servers=" + o.etcdClientURL(),
		"--bind-address=" + o.ListenIP.String(),
		"--advertise-address=" + o.ListenIP.String(),
		"--secure-port=" + strconv.Itoa(o.SecurePort),
		"--tls-cert-file=" + l.servingCert(),
		"--tls-private-key-file=" + l.servingKey(),
		"--client-ca-file=" + l.caCert(),
		"--kubelet-client-certificate=" + l.kubeletClientCert(),
		"--kubelet-client-key=" + l.kubeletClientKey(),
		"--cert-dir=" + l.certDir(),
		"--token-auth-file=" + l.tokens(),
		"--authorization-mode=" + o.AuthorizationModes,
		"--service-cluster-ip-range=" + o.ServiceClusterIPRange,
		"--service-node-port-range=" + o.ServiceNodePortRange,
		"--service-account-key-file=" + l.saPub(),
		"--service-account-signing-key-file=" + l.saKey(),
		"--service-account-issuer=https://kubernetes.default.svc.cluster.local",
		"--endpoint-reconciler-type=" + o.EndpointReconcilerType,
		"--audit-policy-file=" + l.auditPolicy(),
		"--audit-log-path=" + l.auditLog(),
		// Blocking mode writes each event before the response goes out, so an
		// AuditDenials right after a request sees it.
		"--audit-log-mode=blocking",
		"--profiling=false",
		"--v=1",
	}
	return append(args, o.ExtraAPIServerArgs...)
}

// auditPolicy records every request at Metadata level (user, verb, resource,
// response code and the authorization decision annotations) without bodies.
const auditPolicy = `apiVersion: audit.k8s.io/v1
kind: Policy
omitStages:
- RequestReceived
rules:
- level: Metadata
`

// Identity is one of the two users the control plane authenticates.
type Identity string

const (
	// Admin is user AdminUser in group system:masters: unrestricted.
	Admin Identity = "admin"
	// Kproxy is user KproxyUser with the groups of a ServiceAccount: only
	// what RBAC grants to ServiceAccount kube-system/kproxy.
	Kproxy Identity = "kproxy"
)

const (
	// AdminUser is the Admin identity's user name.
	AdminUser = "kproxy-test-admin"
	// KproxyUser is the Kproxy identity's user name: the name RBAC matches
	// for a ServiceAccount subject kube-system/kproxy.
	KproxyUser = "system:serviceaccount:kube-system:kproxy"
)

// User is an identity of the token file beyond Admin and Kproxy.
type User struct {
	Name   string
	Groups []string
}

// tokenFile renders --token-auth-file: token,user,uid,"group1,group2".
// users and userTokens are parallel.
func tokenFile(adminToken, kproxyToken string, users []User, userTokens []string) []byte {
	out := fmt.Sprintf("%s,%s,%s,\"system:masters\"\n%s,%s,%s,\"system:serviceaccounts,system:serviceaccounts:kube-system\"\n",
		adminToken, AdminUser, "uid-kproxy-test-admin",
		kproxyToken, KproxyUser, "uid-kproxy")
	for i, u := range users {
		out += fmt.Sprintf("%s,%s,uid-%s,\"%s\"\n", userTokens[i], u.Name, strings.ReplaceAll(u.Name, ":", "-"), strings.Join(u.Groups, ","))
	}
	return []byte(out)
}
