package image

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/kproxy/kproxy/platform/linux"
	v1 "k8s.io/api/core/v1"
)

// dynamicExecs are the exec calls of kproxy whose command is not a string
// literal, keyed by file and the expression, with the tools each can name.
// A new exec call with a computed name fails TestToolsCoverExecs until it
// is listed here (and its tools are in Tools).
var dynamicExecs = map[string][]string{
	"platform/linux/system_linux.go: CommandsFor(family, f).Save": iptablesTools(),
	"platform/linux/system_linux.go: base":                        {"iptables", "ip6tables"},
	"platform/linux/system_linux.go: cmds.Iptables":               iptablesTools(),
	"platform/linux/system_linux.go: c":                           iptablesTools(),
	"platform/linux/system_linux.go: s.cmds.Restore":              iptablesTools(),
	"platform/linux/system_linux.go: save":                        iptablesTools(),
	"platform/linux/counters_linux.go: bin":                       iptablesTools(),
	"platform/linux/nftables/exec.go: s.path":                     {"nft"},
}

func iptablesTools() []string {
	var out []string
	for _, fam := range []v1.IPFamily{v1.IPv4Protocol, v1.IPv6Protocol} {
		for _, f := range []linux.Flavour{linux.FlavourLegacy, linux.FlavourNFT} {
			c := linux.CommandsFor(fam, f)
			out = append(out, c.Iptables, c.Save, c.Restore)
		}
	}
	return out
}

// TestToolsCoverExecs reads kproxy's code (cmd/kproxy, pkg and
// platform/linux, without tests, test harnesses and this image builder) for exec.Command,
// exec.CommandContext and exec.LookPath calls, and fails unless every tool
// they can run is in Tools, which CheckTools requires in the image.
func TestToolsCoverExecs(t *testing.T) {
	have := map[string]bool{}
	for _, tool := range Tools() {
		have[tool.Name] = true
	}
	repo := filepath.Join("..", "..")
	seen := map[string]bool{}
	var calls int
	for _, dir := range []string{"cmd/kproxy", "pkg", "platform/linux"} {
		err := filepath.WalkDir(filepath.Join(repo, dir), func(p string, d os.DirEntry, err error) error {
			if err != nil {
				return err
			}
			rel, _ := filepath.Rel(repo, p)
			rel = filepath.ToSlash(rel)
			if d.IsDir() {
				// Test harnesses and tools, not kproxy.
				for _, skip := range []string{"test/netns", "test/e2e", "test/cluster", "test/integration",
					"pkg/testing", "hack/image"} {
					if rel == skip {
						return filepath.SkipDir
					}
				}
				return nil
			}
			if !strings.HasSuffix(p, ".go") || strings.HasSuffix(p, "_test.go") {
				return nil
			}
			f, err := parser.ParseFile(token.NewFileSet(), p, nil, 0)
			if err != nil {
				return err
			}
			ast.Inspect(f, func(n ast.Node) bool {
				call, ok := n.(*ast.CallExpr)
				if !ok {
					return true
				}
				sel, ok := call.Fun.(*ast.SelectorExpr)
				if !ok {
					return true
				}
				pkg, ok := sel.X.(*ast.Ident)
				if !ok || pkg.Name != "exec" {
					return true
				}
				arg := -1
				switch sel.Sel.Name {
				case "Command", "LookPath":
					arg = 0
				case "CommandContext":
					arg = 1
				}
				if arg < 0 || len(call.Args) <= arg {
					return true
				}
				calls++
				var names []string
				if lit, ok := call.Args[arg].(*ast.BasicLit); ok && lit.Kind == token.STRING {
					s, _ := strconv.Unquote(lit.Value)
					names = []string{s}
				} else {
					key := rel + ": " + exprString(call.Args[arg])
					var ok bool
					if names, ok = dynamicExecs[key]; !ok {
						t.Errorf("%s: exec of a computed command %q: list it in dynamicExecs with the tools it can name", rel, key)
					}
					seen[key] = true
				}
				for _, name := range names {
					if !have[filepath.Base(name)] {
						t.Errorf("%s runs %s, which Tools (hence the image check) does not list", rel, name)
					}
				}
				return true
			})
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	if calls < 10 {
		t.Fatalf("found only %d exec calls: the scan is broken", calls)
	}
	for key := range dynamicExecs {
		if !seen[key] {
			t.Errorf("dynamicExecs lists %q, which the code no longer has", key)
		}
	}
	// The DaemonSet's init container runs /bin/sh and modprobe.
	ds, err := os.ReadFile(filepath.Join(repo, "deploy/linux/daemonset.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	for _, tool := range []string{"/bin/sh", "modprobe"} {
		if strings.Contains(string(ds), tool) && !have[filepath.Base(tool)] {
			t.Errorf("deploy/linux/daemonset.yaml runs %s, which Tools does not list", tool)
		}
	}
}

func exprString(e ast.Expr) string {
	switch e := e.(type) {
	case *ast.Ident:
		return e.Name
	case *ast.SelectorExpr:
		return exprString(e.X) + "." + e.Sel.Name
	case *ast.CallExpr:
		var args []string
		for _, a := range e.Args {
			args = append(args, exprString(a))
		}
		return exprString(e.Fun) + "(" + strings.Join(args, ", ") + ")"
	}
	return "?"
}

// TestCheckTools: a root without one tool fails, naming it; links are
// followed inside the root, and a link to a missing file does not count.
func TestCheckTools(t *testing.T) {
	root := t.TempDir()
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(os.MkdirAll(filepath.Join(root, "usr/sbin"), 0o755))
	must(os.MkdirAll(filepath.Join(root, "bin"), 0o755))
	must(os.WriteFile(filepath.Join(root, "usr/sbin/xtables-nft-multi"), []byte("x"), 0o755))
	must(os.WriteFile(filepath.Join(root, "bin/plain"), []byte("x"), 0o644))
	must(os.Symlink("xtables-nft-multi", filepath.Join(root, "usr/sbin/iptables-nft")))
	must(os.Symlink("/usr/sbin/iptables-nft", filepath.Join(root, "bin/iptables")))
	must(os.Symlink("gone", filepath.Join(root, "usr/sbin/nft")))
	err := CheckTools(root, []Tool{{"iptables", ""}, {"iptables-nft", ""}, {"nft", ""}, {"plain", ""}, {"ipset", ""}})
	if err == nil {
		t.Fatal("no error")
	}
	for _, want := range []string{"no nft", "no plain", "no ipset"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not say %q", err, want)
		}
	}
	for _, ok := range []string{"no iptables ", "no iptables-nft "} {
		if strings.Contains(err.Error(), ok) {
			t.Errorf("error %q names a tool that is there", err)
		}
	}
	if err := CheckTools(root, []Tool{{"iptables", ""}}); err != nil {
		t.Errorf("iptables through two links: %v", err)
	}
}

// TestParseInst: apt-get -s's Inst lines (with and without the trailing
// "[]", an epoch in the version, an "all" package) become packages and the
// .deb names apt-get downloads them as; Conf and other lines are ignored.
func TestParseInst(t *testing.T) {
	out := []byte(`NOTE: This is only a simulation!
Inst netbase (6.4 Debian:12.15/oldstable [all])
Inst libgcc-s1 (12.2.0-14+deb12u1 Debian:12.15/oldstable [amd64]) []
Inst conntrack (1:1.4.7-1+b2 Debian:12.15/oldstable [amd64])
Inst libc6 (2.36-9+deb12u14 Debian-Security:12/oldstable-security [amd64])
Conf libc6 (2.36-9+deb12u14 Debian-Security:12/oldstable-security [amd64])
`)
	got := parseInst(out)
	var files []string
	for _, p := range got {
		files = append(files, p.File())
	}
	want := "conntrack_1%3a1.4.7-1+b2_amd64.deb libc6_2.36-9+deb12u14_amd64.deb libgcc-s1_12.2.0-14+deb12u1_amd64.deb netbase_6.4_all.deb"
	if strings.Join(files, " ") != want {
		t.Errorf("got %v\nwant %s", files, want)
	}
}
