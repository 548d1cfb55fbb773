package iptables

import (
	"strconv"
	"strings"

	"github.com/kproxy/kproxy/pkg/intent"
	"github.com/kproxy/kproxy/pkg/proxy"
)

// probePrefix names the scratch chains of a probe. They are owned chains
// (Prefix), so a probe left behind is deleted by the next full sync.
const probePrefix = Prefix + "PROBE-"

// Probe renders restore input that writes the rules of ports — their
// chains and their dispatch entries, exactly as a plan writes them — into
// scratch nat chains nothing jumps to, and the input that removes them
// again. Committing create makes the kernel validate those rules (matches,
// targets, limits) with no effect on traffic: the applier uses it to find
// which service ports the kernel rejects when a restore fails. Chains the
// rules jump to outside the probe (the fixed chains) get empty scratch
// copies, so a probe also works before kproxy's first sync.
//
// It records nothing.
func (p *Planner) Probe(ports []*intent.Port) (create, remove []byte) {
	names := map[string]string{} // real chain → scratch chain
	var order []string
	scratch := func(real string) string {
		if s, ok := names[real]; ok {
			return s
		}
		s := probePrefix + strconv.Itoa(len(names))
		names[real] = s
		order = append(order, s)
		return s
	}
	dispatch := scratch("dispatch")
	var body strings.Builder
	rename := func(line string) {
		fields := strings.Split(line, " ")
		for i := 1; i < len(fields); i++ {
			if (fields[i-1] == "-j" || fields[i-1] == "-g") && strings.HasPrefix(fields[i], Prefix) {
				fields[i] = scratch(fields[i])
			}
		}
		body.WriteString(strings.Join(fields, " "))
		body.WriteByte('\n')
	}
	rd := *p.r
	rd.local = p.record.local
	for _, ip := range ports {
		out := rd.render(ip)
		for _, c := range out.chains {
			s := scratch(c.name)
			for _, line := range strings.Split(strings.TrimSuffix(string(c.body), "\n"), "\n") {
				rest, ok := strings.CutPrefix(line, "-A "+c.name+" ")
				if !ok {
					continue
				}
				rename("-A " + s + " " + rest)
			}
		}
		for _, e := range out.entries {
			rename("-A " + dispatch + " " + e.spec)
		}
	}
	var c, r strings.Builder
	c.WriteString("*nat\n")
	r.WriteString("*nat\n")
	for _, s := range order {
		c.WriteString(":" + s + " - [0:0]\n")
		r.WriteString(":" + s + " - [0:0]\n")
	}
	c.WriteString(body.String())
	for _, s := range order {
		r.WriteString("-X " + s + "\n")
	}
	c.WriteString("COMMIT\n")
	r.WriteString("COMMIT\n")
	return []byte(c.String()), []byte(r.String())
}

// EstimateRules estimates the rules one service port needs (per endpoint
// one DNAT rule, two with session affinity, in each endpoint list; a few per
// frontend and source range), without rendering it: what the per-Service
// rule budget counts.
func EstimateRules(sp *proxy.ServicePort) int {
	per := 1
	if sp.AffinityTimeoutSeconds > 0 {
		per = 2
	}
	n := per*(len(sp.ClusterEndpoints)+len(sp.LocalEndpoints)) + 2
	n += 1 + len(sp.ExternalIPs) + len(sp.LoadBalancerIPs)
	if sp.NodePort > 0 {
		n++
	}
	if len(sp.ExternalIPs)+len(sp.LoadBalancerIPs) > 0 || sp.NodePort > 0 {
		n += 4 + per*len(sp.LocalEndpoints)
	}
	return n + len(sp.LoadBalancerSourceRanges) + 2*len(sp.LoadBalancerIPs)
}
