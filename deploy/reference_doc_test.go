package deploy

import (
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/spf13/pflag"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	logsapi "k8s.io/component-base/logs/api/v1"
	"k8s.io/kube-proxy/config/v1alpha1"

	"github.com/kproxy/kproxy/pkg/config"
)

var update = flag.Bool("update", false, "rewrite the generated tables of docs/reference.md")

// referenceDoc holds the generated reference; no other document may hold
// these tables (TestNoDuplicatedReference).
const referenceDoc = "../docs/reference.md"

// A generated block of the reference sits between these markers.
const (
	beginMarker = "<!-- BEGIN GENERATED %s: go test ./deploy -run TestReferenceDoc -update -->"
	endMarker   = "<!-- END GENERATED %s -->"
	todoNote    = "TODO: describe"
)

// TestReferenceDoc keeps the flag, configuration and metric tables of
// docs/reference.md equal to kproxy's flag set, configuration type and
// metrics registry: a flag, field or metric the reference does not cover
// fails the test. The flag table is generated whole (descriptions are the flags'
// help). In the configuration and metric tables the last column (what
// kproxy does with the field, what the metric means) is written in the
// reference and kept by -update; a new row gets a TODO that fails the test until
// someone describes it.
func TestReferenceDoc(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("the reference shows the defaults of Linux nodes")
	}
	data, err := os.ReadFile(referenceDoc)
	if err != nil {
		t.Fatal(err)
	}
	doc := string(data)
	fields := configFields()
	flagFields := probeFlagFields(t)

	notes := map[string]map[string]string{}
	for _, name := range []string{"config", "metrics"} {
		if notes[name], err = blockNotes(doc, name); err != nil {
			t.Fatal(err)
		}
	}
	blocks := map[string]string{
		"flags":   flagTable(t, flagFields),
		"config":  configTable(t, fields, flagFields, notes["config"]),
		"metrics": metricsTable(t, notes["metrics"]),
	}
	got := doc
	for _, name := range []string{"flags", "config", "metrics"} {
		got, err = replaceBlock(got, name, blocks[name])
		if err != nil {
			t.Fatal(err)
		}
	}
	if *update {
		if got != doc {
			if err := os.WriteFile(referenceDoc, []byte(got), 0o644); err != nil {
				t.Fatal(err)
			}
		}
	} else if got != doc {
		t.Errorf("%s: the generated tables are out of date; run go test ./deploy -run TestReferenceDoc -update and review the diff", referenceDoc)
	}

	rows := map[string][]string{"config": fields}
	for _, r := range servedMetrics(t) {
		rows["metrics"] = append(rows["metrics"], r.name)
	}
	for _, name := range []string{"config", "metrics"} {
		for _, key := range rows[name] {
			if n := notes[name][key]; n == "" || strings.Contains(n, todoNote) {
				t.Errorf("%s: %s %s is not described", referenceDoc, name, key)
			}
		}
		for key := range notes[name] {
			if !slicesContains(rows[name], key) {
				t.Errorf("%s describes %s %s, which does not exist", referenceDoc, name, key)
			}
		}
	}
}

func slicesContains(list []string, s string) bool {
	for _, v := range list {
		if v == s {
			return true
		}
	}
	return false
}

// replaceBlock replaces the content between the markers of block name.
func replaceBlock(doc, name, content string) (string, error) {
	begin, end := fmt.Sprintf(beginMarker, name), fmt.Sprintf(endMarker, name)
	i := strings.Index(doc, begin)
	j := strings.Index(doc, end)
	if i < 0 || j < i {
		return "", fmt.Errorf("%s: no %q ... %q block", referenceDoc, begin, end)
	}
	return doc[:i+len(begin)] + "\n" + content + doc[j:], nil
}

// configFields lists the path of every field of KubeProxyConfiguration, in
// the order of the type, as written in a configuration file.
func configFields() []string {
	leaves := map[reflect.Type]bool{
		reflect.TypeFor[metav1.Duration]():            true,
		reflect.TypeFor[logsapi.TimeOrMetaDuration](): true,
		reflect.TypeFor[logsapi.FormatOptions]():      true,
	}
	var out []string
	var walk func(t reflect.Type, prefix string)
	walk = func(t reflect.Type, prefix string) {
		for i := range t.NumField() {
			f := t.Field(i)
			name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
			if name == "-" {
				continue
			}
			if f.Anonymous && name == "" {
				walk(f.Type, prefix)
				continue
			}
			if name == "" {
				name = f.Name
			}
			ft := f.Type
			if ft.Kind() == reflect.Pointer {
				ft = ft.Elem()
			}
			if ft.Kind() == reflect.Struct && !leaves[ft] {
				walk(ft, prefix+name+".")
				continue
			}
			out = append(out, prefix+name)
		}
	}
	walk(reflect.TypeFor[v1alpha1.KubeProxyConfiguration](), "")
	return out
}

// completeWith completes kproxy's options from args, as kproxy does.
func completeWith(args ...string) (*config.Options, error) {
	fs := pflag.NewFlagSet("kproxy", pflag.ContinueOnError)
	o := config.NewOptions()
	o.AddFlags(fs)
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	return o, o.Complete(fs)
}

// flatten renders the configuration as field path -> JSON value.
func flatten(c *v1alpha1.KubeProxyConfiguration) (map[string]string, error) {
	data, err := json.Marshal(c)
	if err != nil {
		return nil, err
	}
	var m map[string]any
	if err := json.Unmarshal(data, &m); err != nil {
		return nil, err
	}
	out := map[string]string{}
	for _, f := range configFields() {
		var v any = m
		for _, seg := range strings.Split(f, ".") {
			mm, ok := v.(map[string]any)
			if !ok {
				v = nil
				break
			}
			v = mm[seg]
		}
		js, err := json.Marshal(v)
		if err != nil {
			return nil, err
		}
		out[f] = string(js)
	}
	return out, nil
}

// probeFlagFields finds the configuration field each flag sets by setting
// it and looking at what changes; flags of kproxy's own options set none.
func probeFlagFields(t *testing.T) map[string]string {
	t.Helper()
	t.Cleanup(resetKlog)
	base, err := completeWith()
	if err != nil {
		t.Fatal(err)
	}
	before, err := flatten(base.Config)
	if err != nil {
		t.Fatal(err)
	}
	fs := pflag.NewFlagSet("kproxy", pflag.ContinueOnError)
	config.NewOptions().AddFlags(fs)
	out := map[string]string{}
	minimal := filepath.Join(t.TempDir(), "config.yaml")
	if err := os.WriteFile(minimal, []byte("apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	fs.VisitAll(func(f *pflag.Flag) {
		value := probeValue(t, f)
		if f.Name == "config" {
			value = minimal
		}
		o, err := completeWith("--" + f.Name + "=" + value)
		resetKlog()
		if err != nil {
			t.Errorf("--%s: %v", f.Name, err)
			return
		}
		after, err := flatten(o.Config)
		if err != nil {
			t.Fatal(err)
		}
		var changed []string
		for path, v := range after {
			if before[path] != v {
				changed = append(changed, path)
			}
		}
		sort.Strings(changed)
		if len(changed) > 1 {
			t.Errorf("--%s changes several configuration fields: %v", f.Name, changed)
		}
		if len(changed) == 1 {
			out[f.Name] = changed[0]
		}
	})
	return out
}

// probeValue is a value of the flag's type that differs from its default.
func probeValue(t *testing.T, f *pflag.Flag) string {
	switch f.Value.Type() {
	case "bool":
		b, _ := strconv.ParseBool(f.DefValue)
		return strconv.FormatBool(!b)
	case "int32", "int", "Level":
		n, _ := strconv.Atoi(f.DefValue)
		return strconv.Itoa(n + 1)
	case "float32", "float64":
		n, _ := strconv.ParseFloat(f.DefValue, 64)
		return strconv.FormatFloat(n+1, 'f', -1, 64)
	case "duration":
		d, _ := time.ParseDuration(f.DefValue)
		return (d + time.Second).String()
	case "stringSlice":
		return "192.0.2.0/24"
	case "string":
		return "probe-value"
	case "mapStringBool":
		return "ProbeGate=true"
	case "quantity":
		return "1Ki"
	case "version":
		return "false"
	}
	if f.Name == "vmodule" {
		return "probe=1"
	}
	t.Errorf("--%s: no probe value for type %s", f.Name, f.Value.Type())
	return ""
}

// resetKlog puts klog's -v and --vmodule back after a probe set them.
func resetKlog() {
	fs := pflag.NewFlagSet("reset", pflag.ContinueOnError)
	config.NewOptions().AddFlags(fs)
	_ = fs.Set("v", "0")
	_ = fs.Set("vmodule", "")
}

func flagTable(t *testing.T, fields map[string]string) string {
	t.Helper()
	fs := pflag.NewFlagSet("kproxy", pflag.ContinueOnError)
	config.NewOptions().AddFlags(fs)
	var b strings.Builder
	b.WriteString("| flag | config field | default | meaning |\n|---|---|---|---|\n")
	fs.VisitAll(func(f *pflag.Flag) {
		name := "`--" + f.Name + "`"
		if f.Shorthand != "" {
			name = "`-" + f.Shorthand + "`, " + name
		}
		field := "—"
		if p, ok := fields[f.Name]; ok {
			field = "`" + p + "`"
		}
		def := f.DefValue
		if def == "" || def == "[]" {
			def = "—"
		} else {
			def = "`" + def + "`"
		}
		fmt.Fprintf(&b, "| %s | %s | %s | %s |\n", name, field, def, cell(f.Usage))
	})
	return b.String()
}

func configTable(t *testing.T, fields []string, flagFields, notes map[string]string) string {
	t.Helper()
	defaults, err := flatten(config.NewDefault())
	if err != nil {
		t.Fatal(err)
	}
	byField := map[string]string{}
	for fl, f := range flagFields {
		// Several flags may set one field (logging.options): name the first.
		if cur, ok := byField[f]; !ok || fl < cur {
			byField[f] = fl
		}
	}
	var b strings.Builder
	b.WriteString("| field | flag | kproxy default | what kproxy does with it |\n|---|---|---|---|\n")
	for _, f := range fields {
		fl := "—"
		if n, ok := byField[f]; ok {
			fl = "`--" + n + "`"
		}
		def := defaults[f]
		switch def {
		case "", "null", `""`, "{}", "[]", "0", "false":
			def = "—"
		default:
			def = "`" + strings.Trim(def, `"`) + "`"
		}
		note := notes[f]
		if note == "" {
			note = todoNote
		}
		fmt.Fprintf(&b, "| `%s` | %s | %s | %s |\n", f, fl, def, note)
	}
	return b.String()
}

// blockNotes reads the last column of the table in the generated block
// name, by the first column's value.
func blockNotes(doc, name string) (map[string]string, error) {
	begin, end := fmt.Sprintf(beginMarker, name), fmt.Sprintf(endMarker, name)
	i, j := strings.Index(doc, begin), strings.Index(doc, end)
	if i < 0 || j < i {
		return nil, fmt.Errorf("%s: no %q ... %q block", referenceDoc, begin, end)
	}
	notes := map[string]string{}
	for _, l := range strings.Split(doc[i+len(begin):j], "\n") {
		cells := splitRow(l)
		if len(cells) < 2 || !strings.HasPrefix(cells[0], "`") {
			continue // header, separator
		}
		notes[strings.Trim(cells[0], "`")] = cells[len(cells)-1]
	}
	return notes, nil
}

// splitRow splits a Markdown table row into its cells ("\|" is no border).
func splitRow(line string) []string {
	line = strings.TrimSpace(line)
	if !strings.HasPrefix(line, "| ") || !strings.HasSuffix(line, " |") {
		return nil
	}
	line = line[2 : len(line)-2]
	var cells []string
	start := 0
	for k := 0; k+2 < len(line); k++ {
		if line[k] == ' ' && line[k+1] == '|' && line[k+2] == ' ' && (k == 0 || line[k-1] != '\\') {
			cells = append(cells, line[start:k])
			start = k + 3
			k += 2
		}
	}
	return append(cells, line[start:])
}

// cell makes text fit in a Markdown table cell.
func cell(s string) string {
	return strings.ReplaceAll(strings.ReplaceAll(s, "|", `\|`), "\n", " ")
}

// kubeadmConfig is kubeadm's generated config.conf: every field spelled,
// most of them empty or zero.
const kubeadmConfig = "../cmd/kproxy/testdata/kubeadm-config.conf"

// blockRows returns the cells of the table rows (not the header) of the
// generated block name, as the document has them.
func blockRows(t *testing.T, doc, name string) [][]string {
	t.Helper()
	begin, end := fmt.Sprintf(beginMarker, name), fmt.Sprintf(endMarker, name)
	i, j := strings.Index(doc, begin), strings.Index(doc, end)
	if i < 0 || j < i {
		t.Fatalf("%s: no %q ... %q block", referenceDoc, begin, end)
	}
	var rows [][]string
	for _, l := range strings.Split(doc[i+len(begin):j], "\n") {
		if cells := splitRow(l); len(cells) > 1 && strings.HasPrefix(cells[0], "`") {
			rows = append(rows, cells)
		}
	}
	return rows
}

// unquote returns the content of a `code` cell, "" for "—".
func unquote(cell string) string {
	if cell == "—" {
		return ""
	}
	return strings.Trim(cell, "`")
}

// renderDefault is a configuration value (JSON) as the reference's default
// column shows it.
func renderDefault(js string) string {
	switch js {
	case "", "null", `""`, "{}", "[]", "0", "false":
		return "—"
	}
	return "`" + strings.Trim(js, `"`) + "`"
}

// TestReferenceDefaults reads the flag and configuration tables of
// docs/reference.md as they are written, not as the generator would write
// them, and checks each row against kproxy itself:
//   - the flag exists, sets the configuration field the row names, and its
//     default is the flag's; giving the flag its documented default
//     changes nothing in the configuration kproxy runs with;
//   - the field exists, and its documented default is what kproxy runs with
//     when a file leaves the field out, and also when the file spells it
//     empty or zero, as kubeadm's config.conf does (an empty field is the
//     default, never "disabled").
func TestReferenceDefaults(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("the reference shows the defaults of Linux nodes")
	}
	doc := readDoc(t, referenceDoc)
	fs := pflag.NewFlagSet("kproxy", pflag.ContinueOnError)
	config.NewOptions().AddFlags(fs)
	fields := probeFlagFields(t)
	base, err := completeWith()
	if err != nil {
		t.Fatal(err)
	}
	before, err := flatten(base.Config)
	if err != nil {
		t.Fatal(err)
	}

	listed := map[string]bool{}
	for _, row := range blockRows(t, doc, "flags") {
		if len(row) != 4 {
			t.Errorf("flag row %q: %d cells, want 4", row, len(row))
			continue
		}
		names := strings.Split(row[0], ", ")
		name := strings.TrimPrefix(unquote(names[len(names)-1]), "--")
		f := fs.Lookup(name)
		if f == nil {
			t.Errorf("%s lists --%s, which kproxy does not have", referenceDoc, name)
			continue
		}
		listed[name] = true
		if got, want := unquote(row[1]), fields[name]; got != want {
			t.Errorf("--%s: the reference says it sets %q, it sets %q", name, got, want)
		}
		def := unquote(row[2])
		real := f.DefValue
		if real == "[]" {
			real = ""
		}
		if def != real {
			t.Errorf("--%s: documented default %q, the flag's is %q", name, def, real)
			continue
		}
		if def == "" {
			continue // as good as not given
		}
		o, err := completeWith("--" + name + "=" + def)
		resetKlog()
		if err != nil {
			t.Errorf("--%s=%s (its documented default): %v", name, def, err)
			continue
		}
		after, err := flatten(o.Config)
		if err != nil {
			t.Fatal(err)
		}
		for _, path := range configFields() {
			if before[path] != after[path] {
				t.Errorf("--%s=%s, its documented default, changes %s from %s to %s: the default is not the one kproxy runs with", name, def, path, before[path], after[path])
			}
		}
	}
	fs.VisitAll(func(f *pflag.Flag) {
		if !listed[f.Name] {
			t.Errorf("%s does not list --%s", referenceDoc, f.Name)
		}
	})

	// What kproxy runs with for a file without the field, and for
	// kubeadm's file, which spells nearly every field empty or zero.
	dir := t.TempDir()
	minimal := filepath.Join(dir, "minimal.yaml")
	if err := os.WriteFile(minimal, []byte("apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	effective := func(file string) map[string]string {
		o, err := completeWith("--config=" + file)
		resetKlog()
		if err != nil {
			t.Fatalf("--config=%s: %v", file, err)
		}
		m, err := flatten(o.Config)
		if err != nil {
			t.Fatal(err)
		}
		return m
	}
	absent, kubeadm := effective(minimal), effective(kubeadmConfig)
	raw, err := config.Load(kubeadmConfig)
	if err != nil {
		t.Fatal(err)
	}
	spelled, err := flatten(raw)
	if err != nil {
		t.Fatal(err)
	}
	known := map[string]bool{}
	for _, f := range configFields() {
		known[f] = true
	}
	emptyInKubeadm := 0
	for _, row := range blockRows(t, doc, "config") {
		if len(row) != 4 {
			t.Errorf("configuration row %q: %d cells, want 4", row, len(row))
			continue
		}
		field := unquote(row[0])
		if !known[field] {
			t.Errorf("%s lists the field %s, which KubeProxyConfiguration does not have", referenceDoc, field)
			continue
		}
		if got := renderDefault(absent[field]); got != row[2] {
			t.Errorf("%s: documented default %s, kproxy runs with %s when a file leaves it out", field, row[2], got)
		}
		switch spelled[field] {
		case "null", `""`, "0", "false", `"0s"`, "[]", "{}":
			emptyInKubeadm++
			if got := renderDefault(kubeadm[field]); got != row[2] {
				t.Errorf("%s: documented default %s, kproxy runs with %s when a file spells it %s (kubeadm's config.conf)", field, row[2], got, spelled[field])
			}
		}
	}
	if emptyInKubeadm < 30 {
		t.Errorf("only %d fields of %s are empty or zero: is it still kubeadm's generated file?", emptyInKubeadm, kubeadmConfig)
	}
}
