package controlplane

import (
	"net/netip"
	"slices"
	"strings"
	"testing"
)

var fakeBinaries = Binaries{Etcd: "/bin/etcd", KubeAPIServer: "/bin/kube-apiserver"}

func TestOptionsWithDefaults(t *testing.T) {
	inNetns := func(mod func(*Options)) Options {
		o := Options{Binaries: fakeBinaries, CommandPrefix: NetnsExecPrefix("cp")}
		if mod != nil {
			mod(&o)
		}
		return o
	}
	tests := []struct {
		name    string
		in      Options
		wantErr []string // substrings; empty means valid
		check   func(t *testing.T, o Options)
	}{
		{
			name: "defaults",
			in:   inNetns(nil),
			check: func(t *testing.T, o Options) {
				if o.ListenIP != netip.MustParseAddr("127.0.0.1") || o.SecurePort != 6443 ||
					o.EtcdClientPort != 2379 || o.EtcdPeerPort != 2380 ||
					o.ServiceClusterIPRange != "10.96.0.0/16" || o.ServiceNodePortRange != "30000-32767" ||
					o.Dial == nil || o.ReadyTimeout <= 0 || o.StopTimeout <= 0 {
					t.Errorf("defaults not filled in: %+v", o)
				}
			},
		},
		{
			name: "IPv4-mapped listen IP is unmapped",
			in:   inNetns(func(o *Options) { o.ListenIP = netip.MustParseAddr("::ffff:10.0.0.1") }),
			check: func(t *testing.T, o Options) {
				if o.ListenIP != netip.MustParseAddr("10.0.0.1") {
					t.Errorf("ListenIP = %s, want 10.0.0.1", o.ListenIP)
				}
			},
		},
		{
			name:    "no prefix refuses the current namespace",
			in:      Options{Binaries: fakeBinaries},
			wantErr: []string{"CommandPrefix is empty"},
		},
		{
			name: "no prefix allowed explicitly",
			in:   Options{Binaries: fakeBinaries, AllowCurrentNamespace: true},
		},
		{
			name:    "missing binaries",
			in:      Options{CommandPrefix: NetnsExecPrefix("cp")},
			wantErr: []string{"Binaries"},
		},
		{
			name: "every bad field is reported",
			in: inNetns(func(o *Options) {
				o.ListenIP = netip.MustParseAddr("0.0.0.0")
				o.SecurePort = 70000
				o.EtcdClientPort, o.EtcdPeerPort = 4000, 4000
				o.ServiceClusterIPRange = "10.96.0.0"
			}),
			wantErr: []string{"ListenIP 0.0.0.0", "SecurePort 70000", "both 4000", "ServiceClusterIPRange"},
		},
		{
			name:    "zoned listen IP",
			in:      inNetns(func(o *Options) { o.ListenIP = netip.MustParseAddr("fe80::1%eth0") }),
			wantErr: []string{"zoned"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := tt.in.withDefaults()
			if len(tt.wantErr) == 0 {
				if err != nil {
					t.Fatalf("withDefaults: %v", err)
				}
			} else {
				if err == nil {
					t.Fatal("withDefaults succeeded, want an error")
				}
				for _, w := range tt.wantErr {
					if !strings.Contains(err.Error(), w) {
						t.Errorf("error %q does not mention %q", err, w)
					}
				}
			}
			if tt.check != nil {
				tt.check(t, got)
			}
		})
	}
}

func TestFirstServiceIP(t *testing.T) {
	tests := []struct {
		in, want string
		wantErr  bool
	}{
		{in: "10.96.0.0/16", want: "10.96.0.1"},
		{in: "10.96.5.7/16", want: "10.96.0.1"},
		{in: "fd00:96::/112,10.96.0.0/16", want: "fd00:96::1"},
		{in: "bogus", wantErr: true},
	}
	for _, tt := range tests {
		got, err := firstServiceIP(tt.in)
		if (err != nil) != tt.wantErr {
			t.Errorf("firstServiceIP(%q) error = %v, wantErr %v", tt.in, err, tt.wantErr)
			continue
		}
		if !tt.wantErr && got.String() != tt.want {
			t.Errorf("firstServiceIP(%q) = %s, want %s", tt.in, got, tt.want)
		}
	}
}

func TestServerArgs(t *testing.T) {
	l := layout{dir: "/cp"}
	tests := []struct {
		name     string
		opts     Options
		wantURL  string
		etcd     []string
		apiserve []string
	}{
		{
			name:    "IPv4",
			opts:    Options{Binaries: fakeBinaries, CommandPrefix: NetnsExecPrefix("cp"), ListenIP: netip.MustParseAddr("10.250.0.10")},
			wantURL: "https://10.250.0.10:6443",
			etcd: []string{
				"--listen-client-urls=http://127.0.0.1:2379",
				"--initial-cluster=kproxy-test=http://127.0.0.1:2380",
				"--data-dir=" + l.etcdData(),
			},
			apiserve: []string{
				"--etcd-servers=http://127.0.0.1:2379",
				"--bind-address=10.250.0.10",
				"--advertise-address=10.250.0.10",
				"--secure-port=6443",
				"--authorization-mode=RBAC",
				"--endpoint-reconciler-type=none",
				"--token-auth-file=" + l.tokens(),
				"--audit-log-path=" + l.auditLog(),
				"--audit-policy-file=" + l.auditPolicy(),
				"--service-account-signing-key-file=" + l.saKey(),
				"--service-account-key-file=" + l.saPub(),
				"--service-cluster-ip-range=10.96.0.0/16",
				"--tls-cert-file=" + l.servingCert(),
			},
		},
		{
			name: "IPv6, custom ports, extra flags last",
			opts: Options{
				Binaries: fakeBinaries, CommandPrefix: NetnsExecPrefix("cp"), ListenIP: netip.MustParseAddr("fd00::10"),
				SecurePort: 7443, EtcdClientPort: 12379, EtcdPeerPort: 12380,
				ExtraAPIServerArgs: []string{"--v=4"},
			},
			wantURL:  "https://[fd00::10]:7443",
			etcd:     []string{"--listen-client-urls=http://127.0.0.1:12379", "--listen-peer-urls=http://127.0.0.1:12380"},
			apiserve: []string{"--bind-address=fd00::10", "--secure-port=7443", "--etcd-servers=http://127.0.0.1:12379"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			o, err := tt.opts.withDefaults()
			if err != nil {
				t.Fatal(err)
			}
			if got := o.apiURL(); got != tt.wantURL {
				t.Errorf("apiURL = %q, want %q", got, tt.wantURL)
			}
			ea, aa := etcdArgs(o, l), apiserverArgs(o, l)
			for _, w := range tt.etcd {
				if !slices.Contains(ea, w) {
					t.Errorf("etcd args lack %q: %q", w, ea)
				}
			}
			for _, w := range tt.apiserve {
				if !slices.Contains(aa, w) {
					t.Errorf("kube-apiserver args lack %q: %q", w, aa)
				}
			}
			if n := len(o.ExtraAPIServerArgs); n > 0 && !slices.Equal(aa[len(aa)-n:], o.ExtraAPIServerArgs) {
				t.Errorf("extra args are not last: %q", aa)
			}
		})
	}
}

func TestTokenFile(t *testing.T) {
	got := string(tokenFile("AAA", "BBB", []User{{Name: "system:node:node1", Groups: []string{"system:nodes", "system:authenticated"}}}, []string{"CCC"}))
	want := "AAA,kproxy-test-admin,uid-kproxy-test-admin,\"system:masters\"\n" +
		"BBB,system:serviceaccount:kube-system:kproxy,uid-kproxy,\"system:serviceaccounts,system:serviceaccounts:kube-system\"\n" +
		"CCC,system:node:node1,uid-system-node-node1,\"system:nodes,system:authenticated\"\n"
	if got != want {
		t.Errorf("tokenFile =\n%s\nwant\n%s", got, want)
	}
}

// TestUsersValidated: a user name or group that would break the token
// file's CSV, or a repeated name, is refused.
func TestUsersValidated(t *testing.T) {
	base := Options{Binaries: Binaries{Etcd: "e", KubeAPIServer: "a"}, AllowCurrentNamespace: true}
	for _, users := range [][]User{
		{{Name: ""}},
		{{Name: "a,b"}},
		{{Name: "x"}, {Name: "x"}},
		{{Name: AdminUser}},
		{{Name: "x", Groups: []string{"g\"h"}}},
	} {
		o := base
		o.Users = users
		if _, err := o.withDefaults(); err == nil {
			t.Errorf("Users %+v accepted", users)
		}
	}
	o := base
	o.Users = []User{{Name: "system:kube-scheduler"}}
	if got, err := o.withDefaults(); err != nil || got.AuthorizationModes != "RBAC" || got.EndpointReconcilerType != "none" {
		t.Errorf("withDefaults = %+v, %v; want RBAC and none by default", got, err)
	}
}
