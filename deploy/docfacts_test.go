package deploy

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

// logMessages returns the constant messages kproxy logs: the first string
// argument of every logging call (InfoS, ErrorS, Info, Error, V(n).Info,
// logging.Warning) in cmd/, pkg/ and platform/, without tests.
func logMessages(t *testing.T) map[string]bool {
	t.Helper()
	out := map[string]bool{}
	for _, dir := range []string{"../cmd", "../pkg", "../platform"} {
		err := filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
			if err != nil || d.IsDir() || !strings.HasSuffix(p, ".go") || strings.HasSuffix(p, "_test.go") {
				return err
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
				arg := -1
				switch sel.Sel.Name {
				case "InfoS", "Info":
					arg = 0
				case "ErrorS", "Error", "Warning":
					arg = 1
				}
				if arg < 0 || len(call.Args) <= arg {
					return true
				}
				if lit, ok := call.Args[arg].(*ast.BasicLit); ok && lit.Kind == token.STRING {
					if s, err := strconv.Unquote(lit.Value); err == nil && len(s) >= 12 && strings.Contains(s, " ") {
						out[s] = true
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
	if len(out) < 20 {
		t.Fatalf("found %d log messages: the scan is broken", len(out))
	}
	return out
}

// TestQuotedLogLinesMatchCase: where the README, docs/ or deploy/'s
// manifests quote a log message of kproxy's, they quote it as kproxy
// writes it: an operator greps for it, and grep is case-sensitive. A
// quote is the message right after a backtick or a quotation mark; one
// that differs from the message only in case fails.
func TestQuotedLogLinesMatchCase(t *testing.T) {
	msgs := logMessages(t)
	files := documents(t)
	for _, pattern := range []string{"*/*.yaml", "*/*/*.yaml", "../charts/kproxy/templates/*"} {
		more, err := filepath.Glob(pattern)
		if err != nil {
			t.Fatal(err)
		}
		files = append(files, more...)
	}
	for _, path := range files {
		text := readDoc(t, path)
		for msg := range msgs {
			re := regexp.MustCompile("(?i)[`\"']" + regexp.QuoteMeta(msg))
			for _, got := range re.FindAllString(text, -1) {
				if got = got[1:]; got != msg {
					t.Errorf("%s quotes the log line %q as %q", path, msg, got)
				}
			}
		}
	}
}

// TestDocumentedConfigPaths: a path under /var/lib/kproxy/ in the README,
// docs/ or the chart names a file the DaemonSets mount there (the config
// volume's items), so a command copied from the docs finds its file.
func TestDocumentedConfigPaths(t *testing.T) {
	mounted := map[string]bool{}
	r := renderMain(t)
	for _, ds := range r.daemonSets {
		for _, v := range ds.Spec.Template.Spec.Volumes {
			if v.ConfigMap == nil {
				continue
			}
			for _, it := range v.ConfigMap.Items {
				mounted["/var/lib/kproxy/"+it.Path] = true
			}
		}
	}
	if !mounted["/var/lib/kproxy/config.conf"] {
		t.Fatalf("the DaemonSets mount %v: the rendering is broken", mounted)
	}
	re := regexp.MustCompile(`/var/lib/kproxy/[A-Za-z0-9._-]+`)
	files := documents(t)
	more, _ := filepath.Glob("../charts/kproxy/templates/*")
	files = append(files, more...)
	for _, path := range files {
		for _, p := range re.FindAllString(readDoc(t, path), -1) {
			p = strings.TrimRight(p, ".")
			if !mounted[p] {
				t.Errorf("%s names %s, which no DaemonSet mounts (they mount %v)", path, p, mounted)
			}
		}
	}
}
