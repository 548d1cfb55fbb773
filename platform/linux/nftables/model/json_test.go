package model_test

import (
	"bytes"
	"compress/gzip"
	"context"
	"fmt"
	"io"
	"maps"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	nftmodel "github.com/kproxy/kproxy/platform/linux/nftables/model"
	"github.com/kproxy/kproxy/platform/linux/nftables/nft"
	"github.com/kproxy/kproxy/platform/linux/trace"

	"github.com/kproxy/kproxy/platform/linux/nftables/nfttest"

	"github.com/kproxy/kproxy/platform/linux/nftables"
	v1 "k8s.io/api/core/v1"
	"sigs.k8s.io/knftables"
)

// captureEnv, set to 1 (as root, with ip and nft), makes TestParseJSON
// capture its testdata again from the kernel: each rendered table is
// loaded with nft -f into a throwaway network namespace and listed with
// nft -j list table.
const captureEnv = "KPROXY_NFT_CAPTURE"

// kernelJSON loads a transaction's text into a fresh network namespace
// and returns `nft -j list table FAMILY kproxy`.
func kernelJSON(t *testing.T, fam knftables.Family, txText string) []byte {
	t.Helper()
	why := ""
	for _, tool := range []string{"ip", "nft"} {
		if _, err := exec.LookPath(tool); err != nil {
			why = tool + " is not installed"
		}
	}
	if os.Geteuid() != 0 {
		why = "needs root"
	}
	if why != "" {
		if os.Getenv("CI") == "true" {
			t.Fatalf("CI=true: %s", why)
		}
		t.Skip(why)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	ns := fmt.Sprintf("kpx-nftjson-%d", os.Getpid())
	if out, err := exec.CommandContext(ctx, "ip", "netns", "add", ns).CombinedOutput(); err != nil {
		t.Fatalf("ip netns add %s: %v\n%s", ns, err, out)
	}
	defer func() {
		if out, err := exec.Command("ip", "netns", "del", ns).CombinedOutput(); err != nil {
			t.Errorf("ip netns del %s: %v\n%s", ns, err, out)
		}
	}()
	load := exec.CommandContext(ctx, "ip", "netns", "exec", ns, "nft", "-f", "-")
	load.Stdin = strings.NewReader(txText)
	if out, err := load.CombinedOutput(); err != nil {
		t.Fatalf("nft -f: %v\n%s", err, out)
	}
	out, err := exec.CommandContext(ctx, "ip", "netns", "exec", ns, "nft", "-j", "list", "table", string(fam), nftables.TableName).Output()
	if err != nil {
		t.Fatalf("nft -j list table: %v", err)
	}
	return out
}

func readGz(t *testing.T, path string) []byte {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatalf("%v (capture it: as root, %s=1 go test -run TestParseJSON ./platform/linux/nftables/model/)", err, captureEnv)
	}
	defer f.Close()
	zr, err := gzip.NewReader(f)
	if err != nil {
		t.Fatal(err)
	}
	b, err := io.ReadAll(zr)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func writeGz(t *testing.T, path string, data []byte) {
	t.Helper()
	var b bytes.Buffer
	zw, _ := gzip.NewWriterLevel(&b, gzip.BestCompression)
	zw.ModTime = time.Time{}
	if _, err := zw.Write(data); err != nil {
		t.Fatal(err)
	}
	if err := zw.Close(); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, b.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
}

// sameModel reports every difference between the table the Fake holds and
// the one read back: chains, base chain specs, rules (by SameRule), sets,
// their kind and elements (by SameElem).
func sameModel(want, got *nftmodel.Model) []string {
	var out []string
	for _, n := range slices.Sorted(maps.Keys(want.Chains)) {
		w, g := want.Chains[n], got.Chains[n]
		if g == nil {
			out = append(out, "missing chain "+n)
			continue
		}
		if (w.Base == nil) != (g.Base == nil) || (w.Base != nil && *w.Base != *g.Base) {
			out = append(out, fmt.Sprintf("chain %s: base %v, want %v", n, g.Base, w.Base))
		}
		if len(w.Rules) != len(g.Rules) {
			out = append(out, fmt.Sprintf("chain %s: %d rules, want %d:\n\t%s\nwant\n\t%s", n, len(g.Rules), len(w.Rules),
				ruleLines(g.Rules), ruleLines(w.Rules)))
			continue
		}
		for i := range w.Rules {
			if !nftmodel.SameRule(w.Rules[i], g.Rules[i]) {
				out = append(out, fmt.Sprintf("chain %s rule %d:\n\tread  %s\n\twant  %s", n, i+1, g.Rules[i], w.Rules[i]))
			}
		}
	}
	for n := range got.Chains {
		if want.Chains[n] == nil {
			out = append(out, "extra chain "+n)
		}
	}
	for _, n := range slices.Sorted(maps.Keys(want.Sets)) {
		w, g := want.Sets[n], got.Sets[n]
		if g == nil {
			out = append(out, "missing set "+n)
			continue
		}
		if w.IsMap != g.IsMap || w.IsVerdictMap() != g.IsVerdictMap() {
			out = append(out, fmt.Sprintf("set %s: spec %s, want %s", n, g.Spec, w.Spec))
		}
		if !maps.EqualFunc(w.Elements, g.Elements, nftmodel.SameElem) {
			out = append(out, fmt.Sprintf("set %s: elements %v, want %v", n, g.Elements, w.Elements))
		}
	}
	for n := range got.Sets {
		if want.Sets[n] == nil {
			out = append(out, "extra set "+n)
		}
	}
	return out
}

func ruleLines(rs []nft.Rule) string {
	out := make([]string, len(rs))
	for i, r := range rs {
		out[i] = r.String()
	}
	return strings.Join(out, "\n\t")
}

// TestParseJSON reads back what the kernel listed (nft -j list table,
// captured in testdata/json from nft 1.0.6 after loading the renderer's
// transaction) for rich ports under every detect-local mode and NodePort
// setting, both families: the table read is the one the Fake holds after
// the same transaction, rule for rule in the renderer's own text (source
// range sets compared as sets: nft sorts and merges them), element for
// element; no rule is left unread, and tracing every packet of every
// frontend through either gives the same outcomes. With KPROXY_KERNEL_TESTS=1
// (root) it also checks the kernel of this machine directly;
// KPROXY_NFT_CAPTURE=1 captures the testdata again.
func TestParseJSON(t *testing.T) {
	capture := os.Getenv(captureEnv) == "1"
	kernel := os.Getenv("KPROXY_KERNEL_TESTS") == "1"
	for _, fam := range []v1.IPFamily{v1.IPv4Protocol, v1.IPv6Protocol} {
		fa := addrsOf(fam)
		for _, tc := range traceConfigs(fa) {
			t.Run(string(fam)+"/"+tc.name, func(t *testing.T) {
				ports := richPorts(t, fa, tc)
				f := nftmodel.NewFake(nftables.Family(fam), nftables.TableName)
				plan, _ := nfttest.Renderer(t, tc.cfg).Render(nftables.Input{Full: true, Ports: ports, Node: tc.node}, nil)
				nfttest.Run(t, f, plan)
				path := filepath.Join("testdata", "json", strings.ToLower(string(fam))+"-"+tc.name+".json.gz")
				if capture {
					writeGz(t, path, kernelJSON(t, nftables.Family(fam), plan.Tx.String()))
				}
				sources := map[string][]byte{"testdata": readGz(t, path)}
				if kernel {
					sources["kernel"] = kernelJSON(t, nftables.Family(fam), plan.Tx.String())
				}
				for src, data := range sources {
					l, err := nftmodel.ParseJSON(nftables.Family(fam), nftables.TableName, data)
					if err != nil {
						t.Fatalf("%s: %v", src, err)
					}
					if len(l.Unreadable) > 0 {
						t.Errorf("%s: unread: %v", src, l.Unreadable)
					}
					if l.Model == nil {
						t.Fatalf("%s: no table", src)
					}
					for _, d := range sameModel(f.Model(), l.Model) {
						t.Errorf("%s: %s", src, d)
					}
					compareTraces(t, fa, tc, f.Model(), l.Model)
				}
			})
		}
	}
}

// compareTraces traces the packets of traceEverything through both models
// and requires the same outcomes.
func compareTraces(t *testing.T, fa famAddrs, tc traceConfig, want, got *nftmodel.Model) {
	t.Helper()
	tw, err := nftmodel.NewTracer(nftables.Family(fa.fam), want)
	if err != nil {
		t.Fatal(err)
	}
	tg, err := nftmodel.NewTracer(nftables.Family(fa.fam), got)
	if err != nil {
		t.Fatal(err)
	}
	h := trace.Host{LocalAddrs: []netip.Addr{fa.node, fa.loopback}}
	n := 0
	for _, s := range want.Sets[nftables.MapFrontends].Elements {
		dst, dport := s.Key[0].Addr, uint16(s.Key[2].Num)
		if dport == 0 {
			continue
		}
		for _, src := range []trace.Packet{{Src: fa.pod, InIface: tc.iface}, {Src: fa.outside, InIface: "eth0"}, {Src: fa.inRange, InIface: "eth0"}, {Src: fa.node, Local: true}} {
			p := src
			p.Dst, p.DstPort, p.Proto, p.SrcPort = dst, dport, s.Key[1].String(), 40000
			ow, err := tw.Trace(h, p)
			if err != nil {
				t.Fatal(err)
			}
			og, err := tg.Trace(h, p)
			if err != nil {
				t.Fatal(err)
			}
			if !slices.EqualFunc(ow, og, func(a, b trace.Outcome) bool {
				return a.Verdict == b.Verdict && a.Dst == b.Dst && a.Masquerade == b.Masquerade && a.Probability == b.Probability
			}) {
				t.Errorf("%s: read back %v, rendered %v", p, og, ow)
			}
			n++
		}
	}
	if n < 100 {
		t.Errorf("%d packets compared", n)
	}
}

// TestParseJSONRefusesForeignShapes: a rule with a statement, expression
// or comment kproxy never writes is not read as something else: it becomes
// an opaque rule, listed as unreadable, and a packet that reaches it ends
// there, its fate not simulated; an object kind kproxy never creates is
// listed; a range nft merged an interval set into is read as the prefixes
// covering it exactly.
func TestParseJSONRefusesForeignShapes(t *testing.T) {
	doc := `{"nftables": [
{"metainfo": {"version": "1.0.6", "json_schema_version": 1}},
{"table": {"family": "ip", "name": "kproxy", "handle": 1}},
{"table": {"family": "ip", "name": "other", "handle": 2}},
{"set": {"family": "ip", "name": "pod-cidrs", "table": "kproxy", "type": "ipv4_addr", "flags": ["interval"], "elem": [{"range": ["10.0.0.1", "10.0.0.6"]}, {"prefix": {"addr": "10.1.0.0", "len": 16}}]}},
{"counter": {"family": "ip", "name": "c", "table": "kproxy", "handle": 3, "packets": 0, "bytes": 0}},
{"chain": {"family": "ip", "table": "kproxy", "name": "nat-prerouting", "handle": 4, "type": "nat", "hook": "prerouting", "prio": -100, "policy": "accept"}},
{"chain": {"family": "ip", "table": "other", "name": "x", "handle": 5}},
{"rule": {"family": "ip", "table": "kproxy", "chain": "nat-prerouting", "handle": 6, "expr": [{"match": {"op": "==", "left": {"payload": {"protocol": "ip", "field": "saddr"}}, "right": "@pod-cidrs"}}, {"log": {"prefix": "x"}}, {"accept": null}]}},
{"rule": {"family": "ip", "table": "kproxy", "chain": "nat-prerouting", "handle": 7, "comment": "mine", "expr": [{"accept": null}]}},
{"rule": {"family": "ip", "table": "kproxy", "chain": "nat-prerouting", "handle": 8, "expr": [{"match": {"op": "==", "left": {"payload": {"protocol": "ip", "field": "ttl"}}, "right": 1}}, {"drop": null}]}},
{"rule": {"family": "ip", "table": "kproxy", "chain": "nat-prerouting", "handle": 9, "expr": [{"match": {"op": "==", "left": {"payload": {"protocol": "ip", "field": "daddr"}}, "right": "10.96.0.1"}}, {"drop": null}]}},
{"rule": {"family": "ip", "table": "other", "chain": "x", "handle": 10, "expr": [{"counter": null}]}}
]}`
	l, err := nftmodel.ParseJSON(knftables.IPv4Family, nftables.TableName, []byte(doc))
	if err != nil {
		t.Fatal(err)
	}
	rs := l.Model.Chains["nat-prerouting"].Rules
	if len(rs) != 4 || !nftmodel.IsOpaque(rs[0]) || !nftmodel.IsOpaque(rs[1]) || !nftmodel.IsOpaque(rs[2]) || rs[3].String() != "ip daddr 10.96.0.1 drop" {
		t.Fatalf("rules %q: want three opaque rules and a readable one", rs)
	}
	var what []string
	for _, u := range l.Unreadable {
		what = append(what, u.String())
	}
	got := strings.Join(what, "\n")
	for _, want := range []string{`chain nat-prerouting rule 1: statement "log" is not one kproxy writes`, "chain nat-prerouting rule 2: a rule with a comment",
		"chain nat-prerouting rule 3: ip ttl: not a header field kproxy reads", "counter c: an object kproxy does not create"} {
		if !strings.Contains(got, want) {
			t.Errorf("unreadable:\n%s\nwant %q", got, want)
		}
	}
	if len(l.Unreadable) != 4 {
		t.Errorf("%d unreadable, want 4 (the other table is not read):\n%s", len(l.Unreadable), got)
	}
	var keys []string
	for k := range l.Model.Sets["pod-cidrs"].Elements {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	if want := []string{"10.0.0.1", "10.0.0.2/31", "10.0.0.4/31", "10.0.0.6", "10.1.0.0/16"}; !slices.Equal(keys, want) {
		t.Errorf("pod-cidrs %v, want %v", keys, want)
	}
	tr, err := nftmodel.NewTracer(knftables.IPv4Family, l.Model)
	if err != nil {
		t.Fatal(err)
	}
	for _, src := range []string{"10.0.0.3", "192.168.1.1"} {
		outs, err := tr.Trace(trace.Host{}, trace.Packet{Src: netip.MustParseAddr(src), Dst: netip.MustParseAddr("10.96.0.1"), Proto: "tcp", SrcPort: 1, DstPort: 80, InIface: "eth0"})
		if err != nil {
			t.Fatal(err)
		}
		if len(outs) != 1 || outs[0].Verdict != trace.VerdictUnknown {
			t.Errorf("from %s: %v, want one outcome not simulated (the first rule is opaque)", src, outs)
		}
	}
}

// TestSameRule: rules compare as values: the members of an anonymous set
// in any order (addresses as the addresses they cover, as nft lists them
// back sorted and merged), numbers whatever their name or digits; another
// member, port, operator or verdict is another rule.
func TestSameRule(t *testing.T) {
	for _, tc := range []struct {
		a, b string
		same bool
	}{
		{"ip saddr != { 192.168.50.0/24, 198.51.100.0/24, 192.168.70.12 } drop", "ip saddr != { 192.168.50.0/24, 192.168.70.12, 198.51.100.0/24 } drop", true},
		{"ip saddr != { 10.0.0.0/25, 10.0.0.128/25 } drop", "ip saddr != { 10.0.0.0/24 } drop", true},
		{"ip saddr != { 10.0.1.0/24, 10.0.1.5 } drop", "ip saddr != { 10.0.1.0/24 } drop", true},
		{"ct state != { established, related } drop", "ct state != { related, established } drop", true},
		{"meta l4proto { tcp, udp } th dport { 80, 443 } accept", "meta l4proto { udp, 6 } th dport { 443, 80 } accept", true},
		{"meta mark & 0x00004000 == 0 return", "meta mark & 0x4000 == 0 return", true},
		{"ip saddr != { 10.0.0.0/24 } drop", "ip saddr != { 10.0.0.0/25 } drop", false},
		{"ip saddr != { 10.0.0.0/24 } drop", "ip saddr != { 10.0.0.0/24 } accept", false},
		{"ip saddr != { 10.0.0.0/24 } drop", "ip saddr { 10.0.0.0/24 } drop", false},
		{"th dport { 80, 443 } accept", "th dport { 80, 8443 } accept", false},
		{"th dport { 80, 443 } accept", "th dport { 80 } accept", false},
		{"tcp dport 80 accept", "tcp dport 81 accept", false},
		{"tcp dport 80 accept", "udp dport 80 accept", false},
		{"ct state != { established, related } drop", "ct state != { established, new } drop", false},
		{"ip daddr 10.0.0.1 jump a", "ip daddr 10.0.0.1 goto a", false},
	} {
		a, err := nftmodel.ParseRule("ip", tc.a)
		if err != nil {
			t.Fatal(err)
		}
		b, err := nftmodel.ParseRule("ip", tc.b)
		if err != nil {
			t.Fatal(err)
		}
		if got := nftmodel.SameRule(a, b); got != tc.same {
			t.Errorf("SameRule(%q, %q) = %v", tc.a, tc.b, got)
		}
	}
}

// TestParseJSONTimedElements: the clients an affinity set holds are listed
// as timed elements (captured from nft 1.0.6: one added with the set's
// timeout, one with its own); they are read as the set's elements.
func TestParseJSONTimedElements(t *testing.T) {
	const doc = `{"nftables": [{"metainfo": {"version": "1.0.6", "release_name": "Lester Gooch #5", "json_schema_version": 1}}, {"table": {"family": "ip", "name": "kproxy", "handle": 1}}, {"set": {"family": "ip", "name": "aff-x", "table": "kproxy", "type": "ipv4_addr", "handle": 1, "flags": ["timeout"], "timeout": 30, "elem": [{"elem": {"val": "10.0.0.1", "expires": 29}}, {"elem": {"val": "10.0.0.2", "timeout": 10, "expires": 9}}]}}]}`
	l, err := nftmodel.ParseJSON(knftables.IPv4Family, nftables.TableName, []byte(doc))
	if err != nil {
		t.Fatal(err)
	}
	s := l.Model.Sets["aff-x"]
	if s == nil || s.IsMap || len(s.Elements) != 2 || s.Elements["10.0.0.1"].Key.String() != "10.0.0.1" || s.Elements["10.0.0.2"].Key.String() != "10.0.0.2" {
		t.Fatalf("aff-x: %+v", s)
	}
	if !strings.Contains(s.Spec.String(), "timeout 30s") {
		t.Errorf("spec %q", s.Spec)
	}
}
