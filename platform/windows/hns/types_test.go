package hns

import "testing"

func TestCapabilitiesFor(t *testing.T) {
	for _, tc := range []struct {
		v    Version
		want Capabilities
	}{
		{Version{Major: 9, Minor: 2}, Capabilities{}},
		{Version{Major: 9, Minor: 3}, Capabilities{DSR: true}},
		{Version{Major: 10, Minor: 1}, Capabilities{}},
		{Version{Major: 11, Minor: 10}, Capabilities{DSR: true, IPv6: true}},
		{Version{Major: 12, Minor: 0}, Capabilities{DSR: true, IPv6: true, SessionAffinity: true}},
		{Version{Major: 15, Minor: 4}, Capabilities{DSR: true, IPv6: true, SessionAffinity: true}},
		{Version{Major: 15, Minor: 5}, Capabilities{DSR: true, IPv6: true, SessionAffinity: true, ModifyLoadBalancer: true}},
		{Version{Major: 16, Minor: 0}, Capabilities{DSR: true, IPv6: true, SessionAffinity: true, ModifyLoadBalancer: true}},
	} {
		if got := CapabilitiesFor(tc.v); got != tc.want {
			t.Errorf("CapabilitiesFor(%s) = %+v, want %+v", tc.v, got, tc.want)
		}
	}
}
