package differential

import (
	"context"
	"fmt"
	"net/netip"
	"strings"
	"sync"
	"time"

	v1 "k8s.io/api/core/v1"

	"github.com/kproxy/kproxy/test/netns"
	"github.com/kproxy/kproxy/test/proxytest"
)

// AttemptTimeout bounds one attempt: silence that long is a timeout. Over
// IPv6 a TCP client whose first SYN is rejected may only fail on the
// retransmission's answer, a second later; 1.5 s leaves room for it.
const AttemptTimeout = 1500 * time.Millisecond

// Runner makes probes from the hosts of a topology.
type Runner struct {
	Cluster *netns.Cluster
	// Parallel is the number of probes made at once (default 20).
	Parallel int
	hosts    map[netip.Addr]string
	once     sync.Once
}

// hostOf names the host owning addr (HostOf, cached).
func (r *Runner) hostOf(a netip.Addr) string {
	r.once.Do(func() {
		top := r.Cluster.Topology
		r.hosts = map[netip.Addr]string{}
		for _, h := range MultiAddressHosts {
			for _, fam := range []v1.IPFamily{v1.IPv4Protocol, v1.IPv6Protocol} {
				for i := 0; i < ExtraAddresses; i++ {
					if x, err := ExtraAddress(top, h, fam, i); err == nil {
						r.hosts[x] = h
					}
				}
			}
		}
	})
	if h, ok := r.hosts[a.Unmap()]; ok {
		return h
	}
	return HostOf(r.Cluster.Topology, a)
}

// AddExtraAddresses gives every MultiAddressHosts host its extra client
// addresses (ExtraAddress), and the pods' nodes a route to each.
func AddExtraAddresses(ctx context.Context, c *netns.Cluster) error {
	top := c.Topology
	for _, host := range MultiAddressHosts {
		h, ok := top.Host(host)
		if !ok {
			return fmt.Errorf("differential: no host %s in the topology", host)
		}
		var mine, node []string
		for _, fam := range []v1.IPFamily{v1.IPv4Protocol, v1.IPv6Protocol} {
			for i := 0; i < ExtraAddresses; i++ {
				a, err := ExtraAddress(top, host, fam, i)
				if err != nil {
					return err
				}
				// IPv6 extras are deprecated (preferred_lft 0): the
				// kernel never picks them as a source, only a bound
				// socket uses them (IPv4 picks the first address).
				bits, nodad := 32, ""
				if fam == v1.IPv6Protocol {
					bits, nodad = 128, " nodad preferred_lft 0"
				}
				if h.Role == proxytest.RoleOutside {
					bits = top.NodeNetwork(fam).Bits()
				} else {
					node = append(node, fmt.Sprintf("route add %s/%d dev v-%s", a, bits, host))
				}
				mine = append(mine, fmt.Sprintf("addr add %s/%d dev eth0%s", a, bits, nodad))
			}
		}
		ns, err := c.MustNS(host)
		if err != nil {
			return err
		}
		if err := ns.IP(ctx, mine...); err != nil {
			return err
		}
		if len(node) > 0 {
			nodeNS, err := c.MustNS(h.Node)
			if err != nil {
				return err
			}
			if err := nodeNS.IP(ctx, node...); err != nil {
				return err
			}
		}
	}
	return nil
}

// Probe makes a probe's attempts, wave by wave as its Sampler decides,
// and summarizes them.
func (r *Runner) Probe(ctx context.Context, p Probe) Result {
	s := NewSampler(p, nil)
	ns, err := r.Cluster.MustNS(p.From)
	if err != nil {
		return Summarize(p, []Attempt{{Kind: Error, Detail: err.Error()}})
	}
	proto := strings.ToLower(string(p.Protocol))
	// A host with extra addresses sends from its own address unless the
	// probe uses the extras.
	var own netip.Addr
	if h, ok := r.Cluster.Topology.Host(p.From); ok && contains(MultiAddressHosts, p.From) && p.Frontend != NodePortLocalhost {
		own = h.Addr(p.Family)
	}
	one := func(idx int) Attempt {
		local := own
		if p.Addresses > 1 {
			var err error
			if local, err = ExtraAddress(r.Cluster.Topology, p.From, p.Family, idx); err != nil {
				return Attempt{Kind: Error, Detail: err.Error()}
			}
		}
		var a Attempt
		if err := ns.Do(func() error {
			a = attempt(proto, p.Addr.Addr(), local, p.Addr.Port(), AttemptTimeout)
			return nil
		}); err != nil {
			a = Attempt{Kind: Error, Detail: err.Error()}
		}
		if p.Addresses > 1 {
			a.Source = local.String()
		}
		if a.Kind == Answer {
			if seen, err := netip.ParseAddr(a.Seen); err == nil {
				a.Seen = r.hostOf(seen)
			}
		}
		if from, err := netip.ParseAddr(a.ICMPFrom); err == nil {
			a.ICMPFrom = r.hostOf(from)
		}
		return a
	}
	for ctx.Err() == nil {
		addrs, per := s.Next()
		if len(addrs) == 0 {
			break
		}
		out := make([][]Attempt, len(addrs))
		var wg sync.WaitGroup
		for i, idx := range addrs {
			wg.Go(func() {
				for j := 0; j < per; j++ {
					out[i] = append(out[i], one(idx))
				}
			})
		}
		wg.Wait()
		for _, as := range out {
			s.Record(as...)
		}
	}
	return Summarize(p, s.Attempts)
}

// ProbeAll makes every probe, Parallel at once, and returns the results by
// probe key.
func (r *Runner) ProbeAll(ctx context.Context, probes []Probe) map[string]Result {
	n := r.Parallel
	if n <= 0 {
		n = 20
	}
	out := make(map[string]Result, len(probes))
	var mu sync.Mutex
	sem := make(chan struct{}, n)
	var wg sync.WaitGroup
	for _, p := range probes {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			res := r.Probe(ctx, p)
			mu.Lock()
			out[p.Key()] = res
			mu.Unlock()
		})
	}
	wg.Wait()
	return out
}
