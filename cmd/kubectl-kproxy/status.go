package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"sort"
	"strconv"
	"strings"
	"sync"
	"text/tabwriter"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"github.com/spf13/pflag"
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	sigsyaml "sigs.k8s.io/yaml"
)

// The DaemonSets' pods (deploy/ and the chart): label k8s-app, value per OS.
const (
	appLabel     = "k8s-app"
	linuxApp     = "kproxy"
	windowsApp   = "kproxy-windows"
	healthzPort  = 10256 // the containers' port named healthz, when absent
	metricsPort  = 10249 // the containers' port named metrics, when absent
	fetchTimeout = 5 * time.Second
	parallel     = 8
)

// NodeStatus is one row of kubectl kproxy status: a node and its kproxy.
// A field kproxy's pod did not tell (its metrics port is loopback-only, as
// by default, or it did not answer) is empty or nil, and Notes says why.
type NodeStatus struct {
	Node        string     `json:"node"`
	OS          string     `json:"os"`
	Pod         string     `json:"pod,omitempty"`
	Mode        string     `json:"mode,omitempty"`
	ModeFrom    string     `json:"modeFrom,omitempty"` // "metrics" or "configmap"
	Version     string     `json:"version,omitempty"`
	LastSync    *time.Time `json:"lastSync,omitempty"`
	Quarantined *int       `json:"quarantinedServicePorts,omitempty"`
	// Health: healthy (/healthz 200), unhealthy (503), "not eligible"
	// (503 with nodeEligible false: the node is being deleted or
	// drained), no pod, unreachable.
	Health string   `json:"health"`
	Notes  []string `json:"notes,omitempty"`
}

func runStatus(ctx context.Context, args []string, conn *connection, stdout, stderr io.Writer) int {
	fs := pflag.NewFlagSet("kubectl kproxy status", pflag.ContinueOnError)
	fs.SetOutput(stderr)
	conn.addFlags(fs)
	output := fs.StringP("output", "o", "text", "text (a table) or json.")
	fs.Usage = func() {
		_, _ = fmt.Fprintf(stderr, "kubectl kproxy status: every node's kproxy, through the API server's pod proxy\n(/healthz on the healthz port, /metrics on the metrics port; mode from\nkproxy_proxy_mode_info, else from the pod's ConfigMap).\n\nFlags:\n%s", fs.FlagUsages())
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, pflag.ErrHelp) {
			return 0
		}
		return 1
	}
	if fs.NArg() > 0 || (*output != "text" && *output != "json") {
		_, _ = fmt.Fprintf(stderr, "kubectl kproxy status: takes no arguments and -o text or json\n")
		return 1
	}
	client, err := conn.client()
	if err != nil {
		_, _ = fmt.Fprintf(stderr, "kubectl kproxy status: %v\n", err)
		return 1
	}
	rows, err := Status(ctx, client, conn.namespace, time.Now())
	if err != nil {
		_, _ = fmt.Fprintf(stderr, "kubectl kproxy status: %v\n", err)
		return 1
	}
	if *output == "json" {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		if err := enc.Encode(rows); err != nil {
			return 1
		}
	} else {
		writeTable(stdout, rows, time.Now())
	}
	for _, r := range rows {
		if r.Health != "healthy" {
			return 2 // some node's kproxy is not healthy: scripts can tell
		}
	}
	return 0
}

// Status lists the Nodes, the kproxy pods in namespace, and for each pod
// its /healthz and /metrics through the API server's pod proxy; every
// node gets a row, a node without a kproxy pod too. It fails only when
// the Nodes or the pods cannot be listed.
func Status(ctx context.Context, client kubernetes.Interface, namespace string, now time.Time) ([]NodeStatus, error) {
	nodes, err := client.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, fmt.Errorf("listing nodes: %w", err)
	}
	pods, err := client.CoreV1().Pods(namespace).List(ctx, metav1.ListOptions{
		LabelSelector: fmt.Sprintf("%s in (%s,%s)", appLabel, linuxApp, windowsApp)})
	if err != nil {
		return nil, fmt.Errorf("listing kproxy's pods in %s: %w", namespace, err)
	}
	byNode := map[string]*v1.Pod{}
	for i := range pods.Items {
		p := &pods.Items[i]
		if p.Spec.NodeName == "" || p.DeletionTimestamp != nil {
			continue
		}
		if old, ok := byNode[p.Spec.NodeName]; !ok || p.CreationTimestamp.After(old.CreationTimestamp.Time) {
			byNode[p.Spec.NodeName] = p // during a rollout, the newer pod
		}
	}
	rows := make([]NodeStatus, len(nodes.Items))
	var wg sync.WaitGroup
	sem := make(chan struct{}, parallel)
	for i := range nodes.Items {
		n := &nodes.Items[i]
		rows[i] = NodeStatus{Node: n.Name, OS: n.Labels[v1.LabelOSStable]}
		pod := byNode[n.Name]
		if pod == nil {
			rows[i].Health = "no pod"
			rows[i].Notes = append(rows[i].Notes, fmt.Sprintf("no kproxy pod on this node in %s", namespace))
			continue
		}
		wg.Add(1)
		go func(r *NodeStatus) {
			defer wg.Done()
			sem <- struct{}{}
			defer func() { <-sem }()
			probePod(ctx, client, pod, r)
		}(&rows[i])
	}
	wg.Wait()
	sort.Slice(rows, func(i, j int) bool { return rows[i].Node < rows[j].Node })
	return rows, nil
}

// probePod fills r from pod: its health, its metrics, else its ConfigMap
// and image.
func probePod(ctx context.Context, client kubernetes.Interface, pod *v1.Pod, r *NodeStatus) {
	r.Pod = pod.Name
	hp, mp := containerPort(pod, "healthz", healthzPort), containerPort(pod, "metrics", metricsPort)
	code, body, err := proxyGet(ctx, client, pod, hp, "healthz")
	r.Health, r.LastSync = parseHealth(code, body, err)
	if err != nil {
		r.Notes = append(r.Notes, fmt.Sprintf("/healthz: %v", err))
	}
	code, body, err = proxyGet(ctx, client, pod, mp, "metrics")
	switch {
	case err != nil:
		r.Notes = append(r.Notes, fmt.Sprintf("/metrics on port %d unreachable (its metricsBindAddress is 127.0.0.1 by default; 0.0.0.0 lets the API server reach it): %v", mp, err))
	case code != http.StatusOK:
		r.Notes = append(r.Notes, fmt.Sprintf("/metrics: HTTP %d", code))
	default:
		m, err := ParseMetrics(body)
		if err != nil {
			r.Notes = append(r.Notes, err.Error())
		} else {
			m.apply(r)
		}
	}
	if r.Mode == "" {
		if mode, err := configMapMode(ctx, client, pod); err != nil {
			r.Notes = append(r.Notes, err.Error())
		} else {
			r.Mode, r.ModeFrom = mode, "configmap"
		}
	}
	if r.Version == "" {
		r.Version = imageTag(pod)
	}
}

// proxyGet GETs path from the pod's port through the API server's pod
// proxy (pods/proxy). err is set when there is no HTTP answer of the pod
// (the API server's own errors included).
func proxyGet(ctx context.Context, client kubernetes.Interface, pod *v1.Pod, port int, path string) (int, []byte, error) {
	ctx, cancel := context.WithTimeout(ctx, fetchTimeout)
	defer cancel()
	res := client.CoreV1().RESTClient().Get().Namespace(pod.Namespace).Resource("pods").
		Name(pod.Name + ":" + strconv.Itoa(port)).SubResource("proxy").Suffix(path).Do(ctx)
	var code int
	res.StatusCode(&code)
	body, err := res.Raw()
	if err != nil && code == http.StatusServiceUnavailable && json.Valid(body) && strings.Contains(string(body), "lastUpdated") {
		return code, body, nil // kproxy's own 503, with its health body
	}
	if err != nil {
		return code, nil, fmt.Errorf("through the API server's pod proxy: %w", err)
	}
	return code, body, nil
}

// healthBody is kproxy's (and upstream's) /healthz answer.
type healthBody struct {
	LastUpdated  time.Time `json:"lastUpdated"`
	CurrentTime  time.Time `json:"currentTime"`
	NodeEligible *bool     `json:"nodeEligible,omitempty"`
}

// parseHealth tells the health of a /healthz answer, and its lastUpdated
// (the last sync) when it has one.
func parseHealth(code int, body []byte, err error) (string, *time.Time) {
	if err != nil {
		return "unreachable", nil
	}
	var h healthBody
	var last *time.Time
	if json.Unmarshal(body, &h) == nil && !h.LastUpdated.IsZero() {
		last = &h.LastUpdated
	}
	switch {
	case code == http.StatusOK:
		return "healthy", last
	case h.NodeEligible != nil && !*h.NodeEligible:
		return "not eligible", last
	case code == http.StatusServiceUnavailable:
		return "unhealthy", last
	}
	return fmt.Sprintf("HTTP %d", code), last
}

// Metrics are what status reads from one scrape of kproxy's /metrics.
type Metrics struct {
	Mode        string
	Version     string
	LastSync    *time.Time // the latest of the families'
	Quarantined *int       // summed over the families
}

// ParseMetrics reads the Prometheus text format of kproxy's /metrics.
func ParseMetrics(text []byte) (Metrics, error) {
	parser := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := parser.TextToMetricFamilies(strings.NewReader(string(text)))
	if err != nil {
		return Metrics{}, fmt.Errorf("parsing /metrics: %w", err)
	}
	var m Metrics
	label := func(s *dto.Metric, name string) string {
		for _, l := range s.GetLabel() {
			if l.GetName() == name {
				return l.GetValue()
			}
		}
		return ""
	}
	if f := fams["kproxy_proxy_mode_info"]; f != nil && len(f.GetMetric()) > 0 {
		m.Mode = label(f.GetMetric()[0], "mode")
	}
	if f := fams["kproxy_build_info"]; f != nil && len(f.GetMetric()) > 0 {
		m.Version = label(f.GetMetric()[0], "version")
	}
	if f := fams["kubeproxy_sync_proxy_rules_last_timestamp_seconds"]; f != nil {
		for _, s := range f.GetMetric() {
			if v := s.GetGauge().GetValue(); v > 0 {
				t := time.UnixMilli(int64(math.Round(v * 1000))).UTC() // a float64 of seconds: milliseconds are exact
				if m.LastSync == nil || t.After(*m.LastSync) {
					m.LastSync = &t
				}
			}
		}
	}
	if f := fams["kproxy_sync_quarantined_service_ports"]; f != nil {
		n := 0
		for _, s := range f.GetMetric() {
			n += int(s.GetGauge().GetValue())
		}
		m.Quarantined = &n
	}
	return m, nil
}

// apply puts what the metrics told into r (the metrics' last sync wins
// over /healthz's: it is per family and exact).
func (m Metrics) apply(r *NodeStatus) {
	if m.Mode != "" {
		r.Mode, r.ModeFrom = m.Mode, "metrics"
	}
	if m.Version != "" {
		r.Version = m.Version
	}
	if m.LastSync != nil {
		r.LastSync = m.LastSync
	}
	r.Quarantined = m.Quarantined
}

// configMapMode reads the mode from the ConfigMap the pod's config volume
// mounts (its config.conf item), with kproxy's default per OS when empty.
func configMapMode(ctx context.Context, client kubernetes.Interface, pod *v1.Pod) (string, error) {
	for _, vol := range pod.Spec.Volumes {
		if vol.ConfigMap == nil {
			continue
		}
		key := ""
		for _, it := range vol.ConfigMap.Items {
			if it.Path == "config.conf" {
				key = it.Key
			}
		}
		if key == "" {
			continue
		}
		cm, err := client.CoreV1().ConfigMaps(pod.Namespace).Get(ctx, vol.ConfigMap.Name, metav1.GetOptions{})
		if err != nil {
			return "", fmt.Errorf("mode: reading ConfigMap %s: %w", vol.ConfigMap.Name, err)
		}
		var c struct {
			Mode string `json:"mode"`
		}
		if err := sigsyaml.Unmarshal([]byte(cm.Data[key]), &c); err != nil {
			return "", fmt.Errorf("mode: ConfigMap %s key %s: %w", cm.Name, key, err)
		}
		if c.Mode == "" {
			if pod.Spec.NodeSelector[v1.LabelOSStable] == "windows" {
				return "kernelspace", nil
			}
			return "iptables", nil
		}
		return c.Mode, nil
	}
	return "", errors.New("mode: the pod mounts no ConfigMap with a config.conf")
}

func containerPort(pod *v1.Pod, name string, def int) int {
	for _, c := range pod.Spec.Containers {
		for _, p := range c.Ports {
			if p.Name == name {
				return int(p.ContainerPort)
			}
		}
	}
	return def
}

// imageTag is the tag of the kproxy container's image ("" without one).
func imageTag(pod *v1.Pod) string {
	for _, c := range pod.Spec.Containers {
		img := c.Image
		if i := strings.LastIndex(img, "@"); i >= 0 {
			img = img[:i]
		}
		if i := strings.LastIndex(img, ":"); i > strings.LastIndex(img, "/") {
			return img[i+1:] + " (image)"
		}
	}
	return ""
}

// writeTable prints the rows as kubectl prints tables, then each row's
// notes.
func writeTable(w io.Writer, rows []NodeStatus, now time.Time) {
	tw := tabwriter.NewWriter(w, 0, 8, 2, ' ', 0)
	_, _ = fmt.Fprintln(tw, "NODE\tOS\tPOD\tMODE\tVERSION\tLAST SYNC\tQUARANTINED\tHEALTH")
	dash := func(s string) string {
		if s == "" {
			return "-"
		}
		return s
	}
	for _, r := range rows {
		last := "-"
		if r.LastSync != nil {
			last = now.Sub(*r.LastSync).Round(time.Second).String() + " ago"
		}
		q := "?"
		if r.Quarantined != nil {
			q = strconv.Itoa(*r.Quarantined)
		} else if r.Pod == "" {
			q = "-"
		}
		_, _ = fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", r.Node, dash(r.OS), dash(r.Pod), dash(r.Mode), dash(r.Version), last, q, r.Health)
	}
	_ = tw.Flush()
	for _, r := range rows {
		for _, n := range r.Notes {
			_, _ = fmt.Fprintf(w, "%s: %s\n", r.Node, n)
		}
	}
}
