package check

import (
	"net/netip"

	"github.com/kproxy/kproxy/platform/windows"
	"github.com/kproxy/kproxy/platform/windows/fakehns"
	"github.com/kproxy/kproxy/platform/windows/hns"
)

// FakeNode returns a fake HNS set up like a Windows node on a flannel VXLAN
// overlay (network "vxlan0", this node 10.0.0.1 with pods in 10.244.1.0/24,
// one pod 10.244.1.5, two other nodes' subnets, source VIP 10.244.1.250),
// leaving out of what it returns the fields in drops, and the Options to
// run Run against it. `kproxy check-hns --fake` uses it; so do the tests.
func FakeNode(drops hns.Fields) (*fakehns.Fake, Options) {
	f := fakehns.New(hns.Version{Major: 15, Minor: 5})
	id := f.AddNetwork(hns.Network{Name: "vxlan0", Type: hns.NetworkTypeOverlay, RemoteSubnets: []hns.RemoteSubnet{
		{DestinationPrefix: "10.244.2.0/24", ProviderAddress: "10.0.0.2", IsolationID: 4096},
		{DestinationPrefix: "10.244.3.0/24", ProviderAddress: "10.0.0.3", IsolationID: 4096},
	}})
	f.AddLocalEndpoint(id, netip.MustParseAddr("10.244.1.5"), "pod-a")
	f.DropOnRead(drops)
	return f, Options{
		HNS:       f,
		NodeIP:    netip.MustParseAddr("10.0.0.1"),
		SourceVIP: netip.MustParseAddr("10.244.1.250"),
		PodCIDRs:  []netip.Prefix{netip.MustParsePrefix("10.244.1.0/24")},
		Interfaces: func() ([]windows.HostInterface, error) {
			return []windows.HostInterface{{Name: "Ethernet", MAC: "00-15-5d-00-00-01", Addrs: []netip.Addr{netip.MustParseAddr("10.0.0.1")}}}, nil
		},
	}
}
