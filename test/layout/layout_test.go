// Package layout checks the import rules of the repository's layout
// (docs/architecture.md, "Package map"): product code (cmd/, pkg/,
// platform/) never imports the test harnesses and dev tools under test/ and
// hack/, pkg/ never imports platform/, and the Linux renderers never import
// a model or tracer package (iptables/model, nftables/model, trace). Tests
// may import anything.
package layout

import (
	"encoding/json"
	"io"
	"os/exec"
	"strings"
	"testing"
)

const module = "github.com/kproxy/kproxy"

type pkg struct {
	ImportPath string
	Imports    []string
}

// listProduct lists the non-test imports of every product package, for goos.
func listProduct(t *testing.T, goos string) []pkg {
	t.Helper()
	cmd := exec.Command("go", "list", "-json=ImportPath,Imports", "./cmd/...", "./pkg/...", "./platform/...")
	cmd.Dir = "../.."
	cmd.Env = append(cmd.Environ(), "GOOS="+goos)
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list (GOOS=%s): %v", goos, err)
	}
	dec := json.NewDecoder(strings.NewReader(string(out)))
	var pkgs []pkg
	for {
		var p pkg
		if err := dec.Decode(&p); err == io.EOF {
			break
		} else if err != nil {
			t.Fatal(err)
		}
		pkgs = append(pkgs, p)
	}
	if len(pkgs) < 10 {
		t.Fatalf("go list found only %d product packages", len(pkgs))
	}
	return pkgs
}

// renderer reports whether path is a platform renderer package.
func renderer(path string) bool {
	switch strings.TrimPrefix(path, module+"/") {
	case "platform/linux/iptables", "platform/linux/nftables", "platform/linux/facts", "platform/linux/conntrack", "pkg/intent":
		return true
	}
	return false
}

// forbidden says why importer may not import imp ("" when it may).
func forbidden(importer, imp string) string {
	under := func(path, dir string) bool {
		return path == module+"/"+dir || strings.HasPrefix(path, module+"/"+dir+"/")
	}
	switch {
	case under(imp, "test") || under(imp, "hack"):
		return "product code imports a test harness or dev tool"
	case under(importer, "pkg") && under(imp, "platform"):
		return "pkg/ imports platform/ (only cmd/ chooses a platform)"
	case renderer(importer) && (strings.HasSuffix(imp, "/model") || under(imp, "platform/linux/trace")):
		return "a renderer imports a model or tracer package (models are for tests, explain and dry runs)"
	}
	return ""
}

func TestProductImports(t *testing.T) {
	for _, goos := range []string{"linux", "windows"} {
		for _, p := range listProduct(t, goos) {
			for _, imp := range p.Imports {
				if why := forbidden(p.ImportPath, imp); why != "" {
					t.Errorf("GOOS=%s: %s imports %s: %s", goos, p.ImportPath, imp, why)
				}
			}
		}
	}
}

// TestForbiddenCatches keeps the rules honest: each must catch its case.
func TestForbiddenCatches(t *testing.T) {
	for _, c := range [][2]string{
		{module + "/pkg/app", module + "/test/netns"},
		{module + "/platform/linux", module + "/hack/image"},
		{module + "/pkg/app", module + "/platform/linux"},
		{module + "/platform/linux/iptables", module + "/platform/linux/iptables/model"},
		{module + "/platform/linux/nftables", module + "/platform/linux/nftables/model"},
		{module + "/platform/linux/nftables", module + "/platform/linux/trace"},
	} {
		if forbidden(c[0], c[1]) == "" {
			t.Errorf("%s importing %s is not caught", c[0], c[1])
		}
	}
	if why := forbidden(module+"/cmd/kproxy", module+"/platform/linux"); why != "" {
		t.Errorf("cmd importing platform is refused: %s", why)
	}
}
