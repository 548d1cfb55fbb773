package deploy

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"unicode"

	"github.com/spf13/pflag"

	"github.com/kproxy/kproxy/pkg/config"
)

// documents are the Markdown files the docs tests read, relative to deploy/.
func documents(t *testing.T) []string {
	t.Helper()
	docs, err := filepath.Glob("../docs/*.md")
	if err != nil {
		t.Fatal(err)
	}
	if len(docs) < 5 {
		t.Fatalf("found %d documents under docs/", len(docs))
	}
	return append([]string{"../README.md"}, docs...)
}

func readDoc(t *testing.T, path string) string {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(data)
}

// generatedHeaders start the tables only the reference may hold.
var generatedHeaders = []string{"| flag |", "| field | flag |", "| metric | type |"}

// TestNoDuplicatedReference: the flag, configuration and metric tables live
// in docs/reference.md only (generated there). Another document duplicates
// them when it has a table of flags, fields or metrics (by its header, or
// by three rows or more that each describe one flag, field or metric), or
// a generated block.
func TestNoDuplicatedReference(t *testing.T) {
	fs := pflag.NewFlagSet("kproxy", pflag.ContinueOnError)
	config.NewOptions().AddFlags(fs)
	known := map[string]bool{}
	fs.VisitAll(func(f *pflag.Flag) { known["--"+f.Name] = true })
	for _, f := range configFields() {
		known[f] = true
	}
	for _, r := range servedMetrics(t) {
		known[r.name] = true
	}
	for _, path := range documents(t) {
		if filepath.Clean(path) == filepath.Clean(referenceDoc) {
			continue
		}
		rows := 0
		for i, l := range strings.Split(readDoc(t, path), "\n") {
			for _, h := range generatedHeaders {
				if strings.HasPrefix(l, h) {
					t.Errorf("%s:%d: a table of %ss: link to %s instead (%s)", path, i+1, strings.Fields(strings.Trim(h, "| "))[0], referenceDoc, l)
				}
			}
			if strings.Contains(l, "<!-- BEGIN GENERATED") {
				t.Errorf("%s:%d: a generated block outside %s", path, i+1, referenceDoc)
			}
			cells := splitRow(l)
			if len(cells) < 2 {
				rows = 0 // a table ends
				continue
			}
			first := strings.TrimPrefix(cells[0], "`-v`, ")
			if strings.HasPrefix(first, "`") && strings.HasSuffix(first, "`") && known[strings.Trim(first, "`")] {
				if rows++; rows == 3 {
					t.Errorf("%s:%d: a third row of one table describing one flag, field or metric each (%s): the reference has them", path, i+1, first)
				}
			}
		}
	}
}

// mdLink is a Markdown link or image target; the target has no spaces.
var mdLink = regexp.MustCompile(`\]\(([^)\s]+)\)`)

// TestDocLinks checks every relative link of the README and docs/: the file
// exists, and an anchor names a heading of the target document.
func TestDocLinks(t *testing.T) {
	anchors := map[string]map[string]bool{}
	anchorsOf := func(path string) map[string]bool {
		if a, ok := anchors[path]; ok {
			return a
		}
		a := headingAnchors(readDoc(t, path))
		anchors[path] = a
		return a
	}
	for _, path := range documents(t) {
		text := withoutCode(readDoc(t, path))
		for _, m := range mdLink.FindAllStringSubmatch(text, -1) {
			target := m[1]
			if strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") {
				continue
			}
			file, anchor, _ := strings.Cut(target, "#")
			dest := path
			if file != "" {
				dest = filepath.Join(filepath.Dir(path), file)
			}
			if _, err := os.Stat(dest); err != nil {
				t.Errorf("%s: link %s: %v", path, target, err)
				continue
			}
			if anchor != "" && strings.HasSuffix(dest, ".md") && !anchorsOf(dest)[anchor] {
				t.Errorf("%s: link %s: %s has no heading with anchor #%s", path, target, dest, anchor)
			}
		}
	}
}

// withoutCode removes fenced code blocks and inline code spans, where
// link syntax is not a link.
func withoutCode(text string) string {
	var out []string
	fenced := false
	for _, l := range strings.Split(text, "\n") {
		if strings.HasPrefix(strings.TrimSpace(l), "```") {
			fenced = !fenced
			continue
		}
		if !fenced {
			out = append(out, regexp.MustCompile("`[^`]*`").ReplaceAllString(l, ""))
		}
	}
	return strings.Join(out, "\n")
}

// headingAnchors returns the anchors GitHub gives a document's headings:
// lower case, punctuation but hyphens and underscores dropped, spaces made
// hyphens, "-1", "-2"... for repeats.
func headingAnchors(text string) map[string]bool {
	out := map[string]bool{}
	seen := map[string]int{}
	fenced := false
	for _, l := range strings.Split(text, "\n") {
		if strings.HasPrefix(strings.TrimSpace(l), "```") {
			fenced = !fenced
			continue
		}
		if fenced || !strings.HasPrefix(l, "#") {
			continue
		}
		h := strings.TrimSpace(strings.TrimLeft(l, "#"))
		var b strings.Builder
		for _, r := range strings.ToLower(h) {
			switch {
			case unicode.IsLetter(r) || unicode.IsDigit(r) || r == '-' || r == '_':
				b.WriteRune(r)
			case r == ' ':
				b.WriteRune('-')
			}
		}
		a := b.String()
		if n := seen[a]; n > 0 {
			out[fmt.Sprintf("%s-%d", a, n)] = true
		} else {
			out[a] = true
		}
		seen[a]++
	}
	return out
}

// subcommandFlags reads the flags a subcommand of cmd/kproxy registers on
// its own flag set (fs.String("name", ...), fs.StringVar(&v, "name", ...)).
func subcommandFlags(t *testing.T, file string) map[string]bool {
	t.Helper()
	re := regexp.MustCompile(`(?:fs|own)\.\w+\((?:&[\w.]+, )?"([a-z][a-z0-9-]*)"(?:, "([a-z])")?`)
	out := map[string]bool{}
	for _, m := range re.FindAllStringSubmatch(readDoc(t, filepath.Join("..", filepath.FromSlash(file))), -1) {
		out[m[1]] = true
		if m[2] != "" {
			out[m[2]] = true
		}
	}
	if len(out) < 5 {
		t.Fatalf("%s: found only %d flags (%v): the pattern no longer matches how it registers them", file, len(out), out)
	}
	return out
}

// kproxyInvocation finds a kproxy command line: the binary under any of its
// names and paths, or go run of its package, then the rest of the line.
var kproxyInvocation = regexp.MustCompile(`(?:^|[\s(])(?:[\w./$-]*/)?(?:kproxy(?:\.exe)?|go run \./cmd/kproxy)\s+(.*)$`)

var flagName = regexp.MustCompile(`^[a-z][a-z0-9_-]*$`)

// TestDocumentedFlagsExist: every flag a kproxy command line of the README
// and docs/ passes (in code blocks and inline code) is one kproxy has, or
// one of its explain and check-hns subcommands.
func TestDocumentedFlagsExist(t *testing.T) {
	fs := pflag.NewFlagSet("kproxy", pflag.ContinueOnError)
	config.NewOptions().AddFlags(fs)
	subs := map[string]map[string]bool{
		"explain":   subcommandFlags(t, "cmd/internal/explaincmd/explaincmd.go"),
		"check-hns": subcommandFlags(t, "cmd/kproxy/checkhns.go"),
	}
	checked := 0
	for _, path := range documents(t) {
		for _, cmd := range commandLines(readDoc(t, path)) {
			if strings.HasPrefix(strings.TrimSpace(cmd), "helm ") {
				continue // helm's flags; the release is named kproxy
			}
			if strings.Contains(cmd, "kubectl") {
				// kubectl's own flags, or kproxy run by kubectl exec ... --.
				_, after, ok := strings.Cut(cmd, " -- ")
				if !ok {
					continue
				}
				cmd = after
			}
			m := kproxyInvocation.FindStringSubmatch(cmd)
			if m == nil {
				continue
			}
			fields := strings.Fields(m[1])
			sub := map[string]bool(nil)
			if len(fields) > 0 {
				sub = subs[fields[0]]
			}
			var words []string
			for _, f := range fields {
				if strings.HasPrefix(f, "#") || f == "|" || f == "&&" || f == ";" || f == ">" || strings.HasPrefix(f, "2>") {
					break
				}
				words = append(words, strings.Split(strings.Trim(f, "[]"), "|")...)
			}
			for _, f := range words {
				if !strings.HasPrefix(f, "-") || f == "-" || f == "--" {
					continue
				}
				name := strings.TrimLeft(f, "-")
				name, _, _ = strings.Cut(name, "=")
				name = strings.TrimRight(name, "`'\").,;:]")
				if name == "" || !flagName.MatchString(name) {
					continue
				}
				checked++
				norm := strings.ReplaceAll(name, "_", "-")
				// -h and --help: pflag's own, which every command has.
				if fs.Lookup(norm) != nil || (len(norm) == 1 && fs.ShorthandLookup(norm) != nil) || sub[norm] || norm == "help" || norm == "h" {
					continue
				}
				t.Errorf("%s: %q passes --%s, which kproxy does not have", path, strings.TrimSpace(cmd), name)
			}
		}
	}
	if checked < 30 {
		t.Errorf("checked only %d flags in the documents' kproxy command lines: the scan no longer finds them", checked)
	}
}

// commandLines returns the lines of fenced code blocks (continuation lines
// joined) and the inline code spans of a document.
func commandLines(text string) []string {
	var out []string
	fenced := false
	cur := ""
	for _, l := range strings.Split(text, "\n") {
		if strings.HasPrefix(strings.TrimSpace(l), "```") {
			fenced = !fenced
			cur = ""
			continue
		}
		if fenced {
			if s, ok := strings.CutSuffix(strings.TrimRight(l, " "), "\\"); ok {
				cur += s + " "
				continue
			}
			if s, ok := strings.CutSuffix(strings.TrimRight(l, " "), "`"); ok { // PowerShell
				cur += s + " "
				continue
			}
			out = append(out, cur+l)
			cur = ""
			continue
		}
		for _, m := range regexp.MustCompile("`([^`]+)`").FindAllStringSubmatch(l, -1) {
			out = append(out, m[1])
		}
	}
	return out
}
