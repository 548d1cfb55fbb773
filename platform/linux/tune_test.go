package linux

import (
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
