package app

import (
	"sort"

	v1 "k8s.io/api/core/v1"
	"k8s.io/klog/v2"

	"github.com/kproxy/kproxy/pkg/proxy"
)

// logChanges logs, at -v=2, the new desired state of each changed service
// port (up to maxLoggedPorts; all of them at -v=4).
func logChanges(log klog.Logger, snap *proxy.Snapshot, ch proxy.Changes) {
	names := make([]proxy.ServicePortName, 0, len(ch.Ports))
	for n := range ch.Ports {
		names = append(names, n)
	}
	sort.Slice(names, func(i, j int) bool { return names[i].Less(names[j]) })
	limit := maxLoggedPorts
	if log.V(4).Enabled() {
		limit = len(names)
	}
	for i, n := range names {
		if i == limit {
			log.V(2).Info("More service ports changed; -v=4 logs them all", "count", len(names)-limit)
			break
		}
		found := false
		for _, fam := range []v1.IPFamily{v1.IPv4Protocol, v1.IPv6Protocol} {
			if p := snap.Family(fam).Get(n); p != nil {
				found = true
				log.V(2).Info("Desired state", "servicePort", n.String(), "family", fam, "state", proxy.PortYAML(p))
			}
		}
		if !found {
			log.V(2).Info("Desired state: service port removed", "servicePort", n.String())
		}
	}
}
