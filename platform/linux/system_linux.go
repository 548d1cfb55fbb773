package linux

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	goipt "github.com/coreos/go-iptables/iptables"
	"github.com/kproxy/kproxy/platform/linux/conntrack"
	"github.com/kproxy/kproxy/platform/linux/nftables"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netlink/nl"
	"golang.org/x/sys/unix"
	v1 "k8s.io/api/core/v1"
)

// System holds the real seams.
type System struct {
	Flavour   Flavour
	Iptables  Iptables
	NFTables  NFTables
	Conntrack Conntrack
	Host      Host
}

// lockWaitSeconds bounds the wait for the xtables lock.
const lockWaitSeconds = 10

// NewSystem returns the real seams for family, in the current network
// namespace. With FlavourAuto it follows the flavour the host uses (see
// ChooseFlavour).
func NewSystem(family v1.IPFamily, flavour Flavour) (*System, error) {
	if flavour == FlavourAuto {
		var err error
		if flavour, err = DetectFlavour(context.Background(), family); err != nil {
			return nil, err
		}
	}
	ipt, err := NewSystemIptables(family, flavour)
	if err != nil {
		return nil, err
	}
	return &System{
		Flavour:   flavour,
		Iptables:  ipt,
		NFTables:  execNFT{},
		Conntrack: netlinkConntrack{},
		Host:      procHost{},
	}, nil
}

// DetectFlavour probes both flavours' tools (see ChooseFlavour): first the
// small mangle tables for kubelet's hint, and only without a clear hint
// the rules of every table.
func DetectFlavour(ctx context.Context, family v1.IPFamily) (Flavour, error) {
	var p FlavourProbe
	save := func(f Flavour, table string) []byte {
		// A table the flavour does not have yet is no error: no rules.
		out, _ := saveTable(ctx, family, f, table)
		return out
	}
	for _, f := range []Flavour{FlavourLegacy, FlavourNFT} {
		if _, err := exec.LookPath(CommandsFor(family, f).Save); err != nil {
			continue
		}
		hint := HasKubeletHint(save(f, "mangle"))
		if f == FlavourLegacy {
			p.LegacyOK, p.LegacyHint = true, hint
		} else {
			p.NFTOK, p.NFTHint = true, hint
		}
	}
	if p.LegacyOK && p.NFTOK && p.LegacyHint == p.NFTHint {
		for _, f := range []Flavour{FlavourLegacy, FlavourNFT} {
			var all []byte
			for _, t := range TakeoverTables {
				all = append(all, save(f, t)...)
			}
			if f == FlavourLegacy {
				p.LegacySave = all
			} else {
				p.NFTSave = all
			}
		}
	}
	base := "iptables"
	if family == v1.IPv6Protocol {
		base = "ip6tables"
	}
	if out, err := exec.CommandContext(ctx, base, "--version").Output(); err == nil {
		switch {
		case bytes.Contains(out, []byte("nf_tables")):
			p.SystemDefault = FlavourNFT
		case bytes.Contains(out, []byte("legacy")):
			p.SystemDefault = FlavourLegacy
		}
	}
	return ChooseFlavour(p)
}

// systemIptables runs the iptables tools of one family and flavour:
// iptables-restore and iptables-save directly, single-rule commands through
// go-iptables.
type systemIptables struct {
	cmds    Commands
	ipt     *goipt.IPTables
	version string
	// family and flavour: the legacy tools' save instantiates the table
	// it names, so Save first asks whether it exists (legacyTableAbsent).
	family  v1.IPFamily
	flavour Flavour
}

// legacyTableAbsent reports whether the legacy (xtables) table of family
// is known not to exist in the calling thread's network namespace: the
// kernel lists the instantiated ones in /proc/net/ip_tables_names (and
// ip6_tables_names), and iptables-legacy-save -t TABLE would create an
// empty one (and load its module), leaving a table nothing asked for on
// a node whose rules are all iptables-nft. false when it cannot tell.
func legacyTableAbsent(family v1.IPFamily, table string) bool {
	file := "/proc/thread-self/net/ip_tables_names"
	if family == v1.IPv6Protocol {
		file = "/proc/thread-self/net/ip6_tables_names"
	}
	data, err := os.ReadFile(file)
	switch {
	case errors.Is(err, os.ErrNotExist):
		// No legacy table module is loaded in the kernel: no table.
		return true
	case err != nil:
		return false
	}
	for _, name := range strings.Fields(string(data)) {
		if name == table {
			return false
		}
	}
	return true
}

// NewSystemIptables returns the Iptables seam for the tools of family and
// flavour (FlavourLegacy or FlavourNFT).
func NewSystemIptables(family v1.IPFamily, flavour Flavour) (Iptables, error) {
	if flavour != FlavourLegacy && flavour != FlavourNFT {
		return nil, fmt.Errorf("iptables flavour %q: want legacy or nft", flavour)
	}
	cmds := CommandsFor(family, flavour)
	path, err := exec.LookPath(cmds.Iptables)
	if err != nil {
		return nil, fmt.Errorf("iptables tools: %w", err)
	}
	for _, c := range []string{cmds.Restore, cmds.Save} {
		if _, err := exec.LookPath(c); err != nil {
			return nil, fmt.Errorf("iptables tools: %w", err)
		}
	}
	proto := goipt.ProtocolIPv4
	if family == v1.IPv6Protocol {
		proto = goipt.ProtocolIPv6
	}
	ipt, err := goipt.New(goipt.IPFamily(proto), goipt.Path(path), goipt.Timeout(lockWaitSeconds))
	if err != nil {
		return nil, fmt.Errorf("iptables tools %s: %w", path, err)
	}
	maj, min, patch := ipt.GetIptablesVersion()
	return &systemIptables{cmds: cmds, ipt: ipt, version: fmt.Sprintf("%s v%d.%d.%d", filepath.Base(path), maj, min, patch),
		family: family, flavour: flavour}, nil
}

// HasRandomFully reports whether MASQUERADE --random-fully is supported by
// the tools (the kernel has supported it since 3.14).
func HasRandomFully(ipt Iptables) bool {
	s, ok := ipt.(*systemIptables)
	return !ok || s.ipt.HasRandomFully()
}

func (s *systemIptables) Describe() string { return s.version }

func (s *systemIptables) Restore(ctx context.Context, data []byte) error {
	cmd := exec.CommandContext(ctx, s.cmds.Restore, "--noflush", fmt.Sprintf("--wait=%d", lockWaitSeconds))
	cmd.Stdin = bytes.NewReader(data)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("%s: %w: %s", s.cmds.Restore, err, firstLines(stderr.String(), 5))
	}
	return nil
}

func (s *systemIptables) Save(ctx context.Context, table string) ([]byte, error) {
	return saveTable(ctx, s.family, s.flavour, table)
}

// saveTable runs iptables-save -t table of family and flavour. A legacy
// table the kernel does not list is not asked about (asking would create
// it): no rules.
func saveTable(ctx context.Context, family v1.IPFamily, flavour Flavour, table string) ([]byte, error) {
	if flavour == FlavourLegacy && legacyTableAbsent(family, table) {
		return nil, nil
	}
	save := CommandsFor(family, flavour).Save
	cmd := exec.CommandContext(ctx, save, "-t", table)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("%s -t %s: %w: %s", save, table, err, firstLines(stderr.String(), 3))
	}
	return out, nil
}

func (s *systemIptables) List(_ context.Context, table, chain string) ([]string, error) {
	out, err := s.ipt.List(table, chain)
	return out, classify(err)
}

func (s *systemIptables) Delete(_ context.Context, table, chain string, spec ...string) error {
	return classify(s.ipt.Delete(table, chain, spec...))
}

// classify wraps "no such chain or rule" errors with ErrNotExist.
func classify(err error) error {
	var e *goipt.Error
	if errors.As(err, &e) && e.IsNotExist() {
		return fmt.Errorf("%w: %w", ErrNotExist, err)
	}
	return err
}

func firstLines(s string, n int) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	if len(lines) > n {
		lines = append(lines[:n], "...")
	}
	return strings.Join(lines, "; ")
}

// execNFT runs the nft tool; a missing tool means there are no tables.
type execNFT struct{}

func (execNFT) ListTables(ctx context.Context) ([]string, error) {
	if _, err := exec.LookPath("nft"); err != nil {
		return nil, nil
	}
	// Over netlink: "nft list tables" reads every table whole first.
	if tables, err := nftables.ListTables(); err == nil {
		return tables, nil
	}
	out, err := exec.CommandContext(ctx, "nft", "list", "tables").Output()
	if err != nil {
		return nil, fmt.Errorf("nft list tables: %w", err)
	}
	var tables []string
	for _, l := range strings.Split(string(out), "\n") {
		if f := strings.Fields(l); len(f) == 3 && f[0] == "table" {
			tables = append(tables, f[1]+" "+f[2])
		}
	}
	return tables, nil
}

func (execNFT) DeleteTable(ctx context.Context, family, name string) error {
	out, err := exec.CommandContext(ctx, "nft", "delete", "table", family, name).CombinedOutput()
	if err != nil {
		if bytes.Contains(out, []byte("No such file or directory")) {
			return fmt.Errorf("nft delete table %s %s: %w", family, name, ErrNotExist)
		}
		return fmt.Errorf("nft delete table %s %s: %w: %s", family, name, err, firstLines(string(out), 3))
	}
	return nil
}

// netlinkConntrack deletes flows over netlink in the current network namespace.
type netlinkConntrack struct{}

func (netlinkConntrack) DeleteFlows(family v1.IPFamily, match func(conntrack.Flow) bool) (int, error) {
	fam := netlink.FAMILY_V4
	if family == v1.IPv6Protocol {
		fam = netlink.FAMILY_V6
	}
	n, err := netlink.ConntrackDeleteFilters(netlink.ConntrackTable, netlink.InetFamily(fam), flowFilter(match))
	return int(n), err
}

// CountEstablished dumps the conntrack table of family and counts the
// established TCP flows per reply source in eps.
func (netlinkConntrack) CountEstablished(family v1.IPFamily, eps map[netip.AddrPort]bool) (map[netip.AddrPort]int, error) {
	fam := netlink.FAMILY_V4
	if family == v1.IPv6Protocol {
		fam = netlink.FAMILY_V6
	}
	flows, err := netlink.ConntrackTableList(netlink.ConntrackTable, netlink.InetFamily(fam))
	if err != nil {
		return nil, fmt.Errorf("listing conntrack flows: %w", err)
	}
	out := map[netip.AddrPort]int{}
	for _, flow := range flows {
		if flow.Forward.Protocol != 6 {
			continue
		}
		tcp, ok := flow.ProtoInfo.(*netlink.ProtoInfoTCP)
		if !ok || tcp.State != nl.TCP_CONNTRACK_ESTABLISHED {
			continue
		}
		src, ok := netip.AddrFromSlice(flow.Reverse.SrcIP)
		if !ok {
			continue
		}
		if ap := netip.AddrPortFrom(src.Unmap(), flow.Reverse.SrcPort); eps[ap] {
			out[ap]++
		}
	}
	return out, nil
}

// flowFilter adapts a match function to netlink's filter interface.
type flowFilter func(conntrack.Flow) bool

func (f flowFilter) MatchConntrackFlow(flow *netlink.ConntrackFlow) bool {
	var proto v1.Protocol
	switch flow.Forward.Protocol {
	case 6:
		proto = v1.ProtocolTCP
	case 17:
		proto = v1.ProtocolUDP
	case 132:
		proto = v1.ProtocolSCTP
	default:
		return false
	}
	dst, ok1 := netip.AddrFromSlice(flow.Forward.DstIP)
	src, ok2 := netip.AddrFromSlice(flow.Reverse.SrcIP)
	if !ok1 || !ok2 {
		return false
	}
	return f(conntrack.Flow{
		Protocol: proto,
		OrigDst:  netip.AddrPortFrom(dst.Unmap(), flow.Forward.DstPort),
		ReplySrc: netip.AddrPortFrom(src.Unmap(), flow.Reverse.SrcPort),
	})
}

// procHost reads addresses over netlink and writes sysctls under /proc/sys,
// both in the current network namespace.
type procHost struct{}

func (procHost) LocalAddresses() ([]netip.Addr, error) {
	list, err := netlink.AddrList(nil, netlink.FAMILY_ALL)
	if err != nil {
		return nil, fmt.Errorf("listing addresses: %w", err)
	}
	out := make([]netip.Addr, 0, len(list))
	for _, a := range list {
		if ip, ok := netip.AddrFromSlice(a.IP); ok {
			out = append(out, ip.Unmap())
		}
	}
	return out, nil
}

func (procHost) SetSysctl(name, value string) error {
	path := filepath.Join("/proc/sys", filepath.Clean("/"+name))
	if cur, err := os.ReadFile(path); err == nil && strings.TrimSpace(string(cur)) == value {
		return nil
	}
	if err := os.WriteFile(path, []byte(value), 0o644); err != nil {
		return fmt.Errorf("sysctl %s=%s: %w", name, value, err)
	}
	return nil
}

// ProcHost returns the host seam of the calling thread's network namespace:
// addresses over netlink, sysctls under /proc/sys.
func ProcHost() Host { return procHost{} }

// NetlinkConntrack returns the conntrack seam over netlink.
func NetlinkConntrack() Conntrack { return netlinkConntrack{} }

// KernelVersion returns the running kernel's major and minor version.
func KernelVersion() (major, minor int, ok bool) {
	var u unix.Utsname
	if err := unix.Uname(&u); err != nil {
		return 0, 0, false
	}
	rel := unix.ByteSliceToString(u.Release[:])
	if _, err := fmt.Sscanf(rel, "%d.%d", &major, &minor); err != nil {
		return 0, 0, false
	}
	return major, minor, true
}
