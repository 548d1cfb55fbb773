package conformance

import (
	"errors"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"time"
)

// PodColumns is the kubectl custom-columns expression whose output
// ParsePods reads: the proxy pods of both kinds, with their app label.
const PodColumns = "custom-columns=APP:.metadata.labels.k8s-app,POD:.metadata.name,NODE:.spec.nodeName," +
	"IMAGE:.spec.containers[0].image,RESTARTS:.status.containerStatuses[0].restartCount,STARTED:.status.startTime"

// PodSelector selects the pods of both proxies (deploy/'s kproxy DaemonSet
// and kubeadm's kube-proxy).
const PodSelector = "k8s-app in (kproxy,kube-proxy)"

// ProxyPod is one proxy pod as kubectl lists it.
type ProxyPod struct {
	// App is the pod's k8s-app label: kproxy or kube-proxy.
	App, Name, Node, Image string
	// Restarts is the first container's restart count, -1 when the pod
	// has no container status yet.
	Restarts int
	Started  string
}

// Evidence is one look at which proxy programs the nodes: the proxy pods
// and each node's last-sync timestamps (one per IP family, seconds since
// the epoch) read from the proxy's metrics on the node.
type Evidence struct {
	Pods  []ProxyPod
	Syncs map[string][]Sync
	// Problems are what could not be read (kubectl or a node's metrics).
	Problems []string
}

// ParsePods reads kubectl's PodColumns output (a header line, then one
// line per pod).
func ParsePods(out string) ([]ProxyPod, error) {
	var pods []ProxyPod
	for i, line := range strings.Split(strings.TrimSpace(out), "\n") {
		f := strings.Fields(line)
		if i == 0 || len(f) == 0 {
			if i == 0 && (len(f) == 0 || f[0] != "APP") && strings.TrimSpace(out) != "" {
				return nil, fmt.Errorf("kubectl's pod list has no APP header: %q", line)
			}
			continue
		}
		if len(f) != 6 {
			return nil, fmt.Errorf("kubectl's pod list: line %q has %d columns, want 6", line, len(f))
		}
		p := ProxyPod{App: f[0], Name: f[1], Node: f[2], Image: f[3], Restarts: -1, Started: f[5]}
		if f[4] != "<none>" {
			n, err := strconv.Atoi(f[4])
			if err != nil {
				return nil, fmt.Errorf("kubectl's pod list: pod %s: restarts %q: %w", p.Name, f[4], err)
			}
			p.Restarts = n
		}
		pods = append(pods, p)
	}
	return pods, nil
}

// Sync is one sample of a node's last-sync timestamp metric.
type Sync struct {
	// Labels are the sample's, as written ({ip_family="IPv4"}).
	Labels string
	// Seconds since the epoch; 0 before the first sync.
	Seconds float64
}

// ParseSyncs reads the last-sync timestamp samples of one node's metrics.
func ParseSyncs(metrics string) []Sync {
	var out []Sync
	for _, m := range MetricLine.FindAllStringSubmatch(metrics, -1) {
		if f, err := strconv.ParseFloat(m[3], 64); err == nil {
			out = append(out, Sync{Labels: m[2], Seconds: f})
		}
	}
	return out
}

// String is evidence.txt's text for e.
func (e Evidence) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%-11s %-20s %-8s %-50s %-8s %s\n", "APP", "POD", "NODE", "IMAGE", "RESTARTS", "STARTED")
	for _, p := range e.Pods {
		fmt.Fprintf(&b, "%-11s %-20s %-8s %-50s %-8d %s\n", p.App, p.Name, p.Node, p.Image, p.Restarts, p.Started)
	}
	nodes := make([]string, 0, len(e.Syncs))
	for n := range e.Syncs {
		nodes = append(nodes, n)
	}
	sort.Strings(nodes)
	for _, n := range nodes {
		if len(e.Syncs[n]) == 0 {
			fmt.Fprintf(&b, "%s: no last-sync timestamp in the metrics\n", n)
		}
		for _, s := range e.Syncs[n] {
			fmt.Fprintf(&b, "%s: last sync%s %.3f (%s)\n", n, s.Labels, s.Seconds, unixTime(s.Seconds))
		}
	}
	for _, p := range e.Problems {
		fmt.Fprintf(&b, "problem: %s\n", p)
	}
	return b.String()
}

func unixTime(f float64) string {
	if f == 0 {
		return "never"
	}
	return time.Unix(int64(f), 0).UTC().Format(time.RFC3339)
}

// CheckEvidence says whether the run's proof holds: before and after the
// suite, every node runs exactly one pod of proxy, the same pod without a
// restart in between, and no pod of another proxy; and every node's proxy
// synced during the suite (its last-sync timestamp moved).
func CheckEvidence(proxy string, nodes []string, before, after Evidence) error {
	var errs []error
	for _, when := range []struct {
		name string
		e    Evidence
	}{{"before the suite", before}, {"after the suite", after}} {
		for _, p := range when.e.Problems {
			errs = append(errs, fmt.Errorf("%s: %s", when.name, p))
		}
		for _, p := range when.e.Pods {
			if p.App != proxy {
				errs = append(errs, fmt.Errorf("%s: %s pod %s runs on %s, want only %s", when.name, p.App, p.Name, p.Node, proxy))
			}
		}
	}
	podOn := func(e Evidence, node string) (ProxyPod, int) {
		var found ProxyPod
		n := 0
		for _, p := range e.Pods {
			if p.App == proxy && p.Node == node {
				found, n = p, n+1
			}
		}
		return found, n
	}
	for _, node := range nodes {
		b, nb := podOn(before, node)
		a, na := podOn(after, node)
		if nb != 1 || na != 1 {
			errs = append(errs, fmt.Errorf("%s: %d %s pods before the suite and %d after, want 1", node, nb, proxy, na))
			continue
		}
		if a.Name != b.Name || a.Restarts != b.Restarts || a.Restarts < 0 {
			errs = append(errs, fmt.Errorf("%s: %s pod %s (restarts %d) before the suite, %s (restarts %d) after: it did not run the whole suite",
				node, proxy, b.Name, b.Restarts, a.Name, a.Restarts))
		}
		last := func(e Evidence) float64 {
			m := 0.0
			for _, s := range e.Syncs[node] {
				m = max(m, s.Seconds)
			}
			return m
		}
		if lb, la := last(before), last(after); la == 0 || la <= lb {
			errs = append(errs, fmt.Errorf("%s: the proxy's last sync did not move during the suite (%s before, %s after)", node, unixTime(lb), unixTime(la)))
		}
	}
	return errors.Join(errs...)
}
