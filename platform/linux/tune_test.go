package linux

import (
	"net/netip"
	"reflect"
	"testing"
	"time"
)

func TestConntrackSysctls(t *testing.T) {
	for _, tc := range []struct {
		name string
		s    ConntrackSettings
		want []Sysctl
	}{
		{"nothing asked", ConntrackSettings{}, nil},
		{"kube-proxy's defaults on 2 CPUs", ConntrackSettings{Max: 131072, TCPEstablishedTimeout: 24 * time.Hour, TCPCloseWaitTimeout: time.Hour}, []Sysctl{
			{"net/netfilter/nf_conntrack_max", "131072"},
			{"net/netfilter/nf_conntrack_tcp_timeout_established", "86400"},
			{"net/netfilter/nf_conntrack_tcp_timeout_close_wait", "3600"},
		}},
		{"UDP and liberal TCP", ConntrackSettings{TCPBeLiberal: true, UDPTimeout: 30 * time.Second, UDPStreamTimeout: 2 * time.Minute}, []Sysctl{
			{"net/netfilter/nf_conntrack_tcp_be_liberal", "1"},
			{"net/netfilter/nf_conntrack_udp_timeout", "30"},
			{"net/netfilter/nf_conntrack_udp_timeout_stream", "120"},
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := tc.s.Sysctls(); !reflect.DeepEqual(got, tc.want) {
				t.Errorf("got %v, want %v", got, tc.want)
			}
		})
	}
}

func TestTuneConntrackWritesThroughHost(t *testing.T) {
	h := &FakeHost{}
	err := TuneConntrack(h, ConntrackSettings{TCPEstablishedTimeout: time.Hour, UDPTimeout: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{"net/netfilter/nf_conntrack_tcp_timeout_established": "3600", "net/netfilter/nf_conntrack_udp_timeout": "60"}
	if !reflect.DeepEqual(h.Sysctls, want) {
		t.Errorf("sysctls %v", h.Sysctls)
	}
}

func TestHasIPv6(t *testing.T) {
	for _, tc := range []struct {
		addrs []string
		want  bool
	}{
		{[]string{"127.0.0.1", "192.168.50.1", "::1", "fe80::1"}, false},
		{[]string{"192.168.50.1"}, false},
		{[]string{"192.168.50.1", "fd00:50::1"}, true},
		{[]string{"2001:db8::5"}, true},
	} {
		h := &FakeHost{}
		for _, a := range tc.addrs {
			h.Addrs = append(h.Addrs, netip.MustParseAddr(a))
		}
		if got := HasIPv6(h); got != tc.want {
			t.Errorf("HasIPv6(%v) = %v, want %v", tc.addrs, got, tc.want)
		}
	}
}
