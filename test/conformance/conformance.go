// Package conformance is make conformance: upstream's e2e suite (e2e.test
// of k8s.io/kubernetes v1.37.2, run by the ginkgo CLI) against make
// cluster's cluster, with the focus and skip list of upstream's kind
// network jobs plus what this kind of machine cannot run, each addition
// with its reason (Skips). It writes the suite's JUnit file, a summary
// table (Summary) and the proof of which proxy programmed the nodes
// (Evidence) into a report directory; Compare puts several runs side by
// side (make conformance-all, docs/conformance.md).
//
// The pure parts (the command line, the JUnit reading, the tables) are
// here; running it is run_linux.go.
package conformance

import (
	"encoding/xml"
	"fmt"
	"io"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"time"
)

// DefaultFocus is the focus of upstream's kind network jobs: every
// sig-network test and every conformance test.
const DefaultFocus = `\[sig-network\]|\[Conformance\]`

// Skip is one alternative of the skip regular expression and why it is there.
type Skip struct {
	Regexp string
	Why    string
}

// UpstreamSkips are the skips of upstream's kind nftables job
// (pull-kubernetes-e2e-kind-nftables): features not enabled there, tests
// that need a cloud load balancer, disrupt the cluster, are known flaky,
// need IPv6 or the internet, or localhost NodePorts (which the nftables mode
// does not have); and, because the job runs the suite in parallel,
// [Serial] tests.
var UpstreamSkips = []Skip{
	{`Alpha`, "upstream's kind job: alpha features are off"},
	{`Beta`, "upstream's kind job: beta features that are off by default"},
	{`LoadBalancer`, "upstream's kind job: no cloud load balancer"},
	{`Disruptive`, "upstream's kind job: tests that restart or break nodes"},
	{`Flaky`, "upstream's kind job: known flaky"},
	{`IPv6DualStack`, "upstream's kind job: single-stack IPv4 cluster"},
	{`Networking-IPv6`, "upstream's kind job: single-stack IPv4 cluster"},
	{`Internet.connection`, "upstream's kind job: no internet from the cluster"},
	{`LocalhostNodePorts`, "upstream's kind nftables job: the nftables mode has no localhost NodePorts"},
	{`\[Serial\]`, "upstream's kind jobs run the suite in parallel and skip serial tests"},
}

// MachineSkips are what this machine cannot run, beyond upstream's job.
var MachineSkips = []Skip{
	{`SCTP`, "the kernel has no SCTP (built without it; modules cannot be loaded)"},
	{`NetworkPolicy|Netpol`, "no NetworkPolicy engine: the CNI bridge plugin enforces no policy (upstream's kind has kindnet's)"},
	{`IPerf2`, "the test parses iperf 2.2's 17-field report; the agnhost image here has Debian bookworm's iperf 2.1.8 (9 fields) and no newer one is available"},
}

// SkipRegexp joins skips into one alternation.
func SkipRegexp(skips ...[]Skip) string {
	var parts []string
	for _, list := range skips {
		for _, s := range list {
			parts = append(parts, s.Regexp)
		}
	}
	return strings.Join(parts, "|")
}

// Run describes one run of the suite.
type Run struct {
	// E2ETest and Ginkgo are the binaries; Kubeconfig the admin's.
	E2ETest, Ginkgo, Kubeconfig string
	// Focus and Skip are the ginkgo regular expressions.
	Focus, Skip string
	// Nodes is the number of parallel ginkgo processes (>= 1).
	Nodes int
	// ReportDir receives junit_01.xml and the suite's other reports.
	ReportDir string
	// Timeout bounds the whole suite.
	Timeout time.Duration
	// NumNodes is the cluster's node count (--num-nodes).
	NumNodes int
}

// Argv is the ginkgo command line for r: the CLI's own flags, then e2e.test
// and its flags after "--".
func (r Run) Argv() []string {
	argv := []string{r.Ginkgo,
		"--nodes=" + strconv.Itoa(max(r.Nodes, 1)),
		"--timeout=" + r.Timeout.String(),
		"--focus=" + r.Focus,
		"--skip=" + r.Skip,
		"--no-color",
		"--poll-progress-after=20m",
		"--poll-progress-interval=5m",
		r.E2ETest, "--",
		"--kubeconfig=" + r.Kubeconfig,
		"--provider=skeleton",
		"--report-dir=" + r.ReportDir,
		"--num-nodes=" + strconv.Itoa(r.NumNodes),
		"--dump-logs-on-failure=false",
		"--prepull-images=false",
		"--dns-domain=cluster.local",
	}
	return argv
}

// Result is one test of a JUnit report.
type Result struct {
	Name string
	// State is passed, failed, skipped (run, then skipped by the test
	// itself: the message says why), not-run (filtered out by focus or
	// skip), or pending.
	State    string
	Duration time.Duration
	// Message is the failure or skip message (first lines).
	Message string
}

// Results is a report's tests and the suite's duration.
type Results struct {
	Tests    []Result
	Duration time.Duration
}

// Counts returns how many tests are in each state: the specs ([It]), and
// the suite's own nodes ([SynchronizedBeforeSuite], [ReportAfterSuite],
// ...) only when they fail, so that "passed" counts tests.
func (r Results) Counts() map[string]int {
	c := map[string]int{}
	for _, t := range r.Tests {
		if t.Spec() || t.State == "failed" {
			c[t.State]++
		}
	}
	return c
}

// Spec reports whether the result is a test ([It]) rather than one of the
// suite's setup, teardown and reporting nodes.
func (t Result) Spec() bool { return strings.HasPrefix(t.Name, "[It]") }

type junitSuites struct {
	XMLName xml.Name     `xml:"testsuites"`
	Suites  []junitSuite `xml:"testsuite"`
}

type junitSuite struct {
	Time  float64     `xml:"time,attr"`
	Cases []junitCase `xml:"testcase"`
}

type junitCase struct {
	Name    string  `xml:"name,attr"`
	Status  string  `xml:"status,attr"`
	Time    float64 `xml:"time,attr"`
	Skipped *struct {
		Message string `xml:"message,attr"`
	} `xml:"skipped"`
	Failure *struct {
		Message string `xml:"message,attr"`
		Text    string `xml:",chardata"`
	} `xml:"failure"`
	Error *struct {
		Message string `xml:"message,attr"`
		Text    string `xml:",chardata"`
	} `xml:"error"`
}

// ReadJUnit reads a ginkgo JUnit report (testsuites, or one testsuite).
// The suite's setup and teardown nodes ([SynchronizedBeforeSuite] and the
// like) are kept: their failure fails the run.
func ReadJUnit(r io.Reader) (Results, error) {
	data, err := io.ReadAll(r)
	if err != nil {
		return Results{}, err
	}
	var suites junitSuites
	if err := xml.Unmarshal(data, &suites); err != nil || len(suites.Suites) == 0 {
		var one junitSuite
		if err2 := xml.Unmarshal(data, &one); err2 != nil {
			return Results{}, fmt.Errorf("junit: %w", err)
		}
		suites.Suites = []junitSuite{one}
	}
	var out Results
	for _, s := range suites.Suites {
		out.Duration += time.Duration(s.Time * float64(time.Second))
		for _, c := range s.Cases {
			res := Result{Name: c.Name, Duration: time.Duration(c.Time * float64(time.Second))}
			switch {
			case c.Failure != nil || c.Error != nil || c.Status == "failed" || c.Status == "panicked" || c.Status == "interrupted" || c.Status == "timedout" || c.Status == "aborted":
				res.State = "failed"
				switch {
				case c.Failure != nil:
					res.Message = firstLines(strings.TrimSpace(c.Failure.Message+"\n"+c.Failure.Text), 6)
				case c.Error != nil:
					res.Message = firstLines(strings.TrimSpace(c.Error.Message+"\n"+c.Error.Text), 6)
				default:
					res.Message = c.Status
				}
			case c.Status == "pending":
				res.State = "pending"
			case c.Skipped != nil || c.Status == "skipped":
				msg := ""
				if c.Skipped != nil {
					msg = strings.TrimSpace(c.Skipped.Message)
				}
				// A spec the focus or skip left out is reported as skipped
				// without a reason and without having run.
				if c.Time == 0 && (msg == "" || msg == "skipped") {
					res.State = "not-run"
				} else {
					res.State = "skipped"
					res.Message = firstLines(strings.TrimPrefix(msg, "skipped - "), 2)
				}
			default:
				res.State = "passed"
			}
			out.Tests = append(out.Tests, res)
		}
	}
	sort.SliceStable(out.Tests, func(i, j int) bool { return out.Tests[i].Name < out.Tests[j].Name })
	return out, nil
}

func firstLines(s string, n int) string {
	lines := strings.Split(s, "\n")
	if len(lines) > n {
		lines = append(lines[:n], "...")
	}
	return strings.Join(lines, "\n")
}

// Header describes a run for its summary.
type Header struct {
	Proxy, Mode, Commit, Command string
	Started                      time.Time
	Focus, Skip                  string
	Skips                        []Skip
	Evidence                     string
}

// Summary renders a run's summary in Markdown: the counts, the evidence,
// then one row per test that ran (passed, failed, or skipped by itself with
// its reason); failures first.
func Summary(h Header, r Results) string {
	var b strings.Builder
	w := func(format string, args ...any) { fmt.Fprintf(&b, format+"\n", args...) }
	c := r.Counts()
	w("# make conformance: %s, %s mode", h.Proxy, h.Mode)
	w("")
	w("- started %s, suite %s, commit %s", h.Started.UTC().Format("2006-01-02 15:04 MST"), r.Duration.Round(time.Second), h.Commit)
	w("- command: `%s`", h.Command)
	w("- **%d passed, %d failed, %d skipped by the test itself**, %d not selected by focus and skip", c["passed"], c["failed"], c["skipped"], c["not-run"])
	w("- focus `%s`", h.Focus)
	w("- skip `%s`", h.Skip)
	if len(h.Skips) > 0 {
		w("")
		w("| skipped | why |")
		w("|---|---|")
		for _, s := range h.Skips {
			w("| `%s` | %s |", s.Regexp, s.Why)
		}
	}
	if h.Evidence != "" {
		w("")
		w("## Which proxy programmed the nodes")
		w("")
		w("```")
		w("%s", strings.TrimRight(h.Evidence, "\n"))
		w("```")
	}
	w("")
	w("## Tests")
	w("")
	w("| result | test | time |")
	w("|---|---|---|")
	order := map[string]int{"failed": 0, "passed": 1, "skipped": 2, "pending": 3}
	tests := append([]Result(nil), r.Tests...)
	sort.SliceStable(tests, func(i, j int) bool { return order[tests[i].State] < order[tests[j].State] })
	for _, t := range tests {
		if t.State == "not-run" || (!t.Spec() && t.State != "failed") {
			continue
		}
		name := mdEscape(t.Name)
		if t.Message != "" && t.State != "passed" {
			name += "<br>" + mdEscape(strings.ReplaceAll(t.Message, "\n", " "))
		}
		w("| %s | %s | %s |", t.State, name, t.Duration.Round(time.Second))
	}
	return b.String()
}

func mdEscape(s string) string {
	s = strings.ReplaceAll(s, "|", `\|`)
	if len(s) > 600 {
		s = s[:600] + "..."
	}
	return s
}

// Column is one run of a comparison.
type Column struct {
	Title   string
	Results Results
}

// Compare renders runs side by side in Markdown: the counts per run, then
// every test that did not pass in all of them (a test one proxy passes and
// another fails stands out), then how many passed everywhere.
func Compare(cols []Column) string {
	var b strings.Builder
	w := func(format string, args ...any) { fmt.Fprintf(&b, format+"\n", args...) }
	w("| | " + strings.Join(titles(cols), " | ") + " |")
	w("|---" + strings.Repeat("|---", len(cols)) + "|")
	for _, state := range []string{"passed", "failed", "skipped"} {
		row := []string{state}
		for _, c := range cols {
			row = append(row, strconv.Itoa(c.Results.Counts()[state]))
		}
		w("| " + strings.Join(row, " | ") + " |")
	}
	row := []string{"suite time"}
	for _, c := range cols {
		row = append(row, c.Results.Duration.Round(time.Minute).String())
	}
	w("| " + strings.Join(row, " | ") + " |")
	states := map[string][]string{}
	var names []string
	for i, c := range cols {
		for _, t := range c.Results.Tests {
			if _, ok := states[t.Name]; !ok {
				states[t.Name] = make([]string, len(cols))
				names = append(names, t.Name)
			}
			states[t.Name][i] = t.State
		}
	}
	sort.Strings(names)
	allPassed := 0
	w("")
	w("| test | " + strings.Join(titles(cols), " | ") + " |")
	w("|---" + strings.Repeat("|---", len(cols)) + "|")
	for _, n := range names {
		s := states[n]
		same, ran := true, false
		for _, x := range s {
			if x != "passed" {
				same = false
			}
			if x != "not-run" && x != "" {
				ran = true
			}
		}
		if same {
			if (Result{Name: n}).Spec() {
				allPassed++
			}
			continue
		}
		if !ran {
			continue
		}
		cells := make([]string, len(s))
		for i, x := range s {
			if x == "" {
				x = "-"
			}
			cells[i] = x
		}
		w("| %s | %s |", mdEscape(n), strings.Join(cells, " | "))
	}
	w("")
	w("%d tests passed in every run.", allPassed)
	return b.String()
}

func titles(cols []Column) []string {
	var t []string
	for _, c := range cols {
		t = append(t, c.Title)
	}
	return t
}

// MetricLine matches one sample of the proxies' last-sync timestamp:
// kproxy's kproxy_sync_proxy_rules_last_timestamp_seconds or kube-proxy's
// kubeproxy_sync_proxy_rules_last_timestamp_seconds.
var MetricLine = regexp.MustCompile(`(?m)^(kproxy|kubeproxy)_sync_proxy_rules_last_timestamp_seconds(\{[^}]*\})? (\S+)$`)
