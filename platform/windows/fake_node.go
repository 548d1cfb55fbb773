package windows

import "net/netip"

// FakeNode returns a fake HNS set up like a Windows node on a flannel VXLAN
// overlay (network "vxlan0", this node 10.0.0.1 with pods in 10.244.1.0/24,
// one pod 10.244.1.5, two other nodes' subnets, source VIP 10.244.1.250),
// leaving out of what it returns the fields in drops, and the
// CheckOptions to run CheckHNS against it. `kproxy check-hns --fake` uses
// it; so do the tests.
func FakeNode(drops EchoDrops) (*FakeHNS, CheckOptions) {
	f := NewFakeHNS(Version{Major: 15, Minor: 5})
	id := f.AddNetwork(Network{Name: "vxlan0", Type: NetworkTypeOverlay, RemoteSubnets: []RemoteSubnet{
		{DestinationPrefix: "10.244.2.0/24", ProviderAddress: "10.0.0.2", IsolationID: 4096},
		{DestinationPrefix: "10.244.3.0/24", ProviderAddress: "10.0.0.3", IsolationID: 4096},
	}})
	f.AddLocalEndpoint(id, netip.MustParseAddr("10.244.1.5"), "pod-a")
	f.DropOnRead(drops)
	return f, CheckOptions{
		HNS:       f,
		NodeIP:    netip.MustParseAddr("10.0.0.1"),
		SourceVIP: netip.MustParseAddr("10.244.1.250"),
		PodCIDRs:  []netip.Prefix{netip.MustParsePrefix("10.244.1.0/24")},
		Interfaces: func() ([]HostInterface, error) {
			return []HostInterface{{Name: "Ethernet", MAC: "00-15-5d-00-00-01", Addrs: []netip.Addr{netip.MustParseAddr("10.0.0.1")}}}, nil
		},
	}
}
