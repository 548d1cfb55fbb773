package config

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"reflect"
	"regexp"
	"sort"
	"strconv"
	"strings"

	yamlv3 "go.yaml.in/yaml/v3"
	"k8s.io/kube-proxy/config/v1alpha1"
	sigsjson "sigs.k8s.io/json"
	"sigs.k8s.io/yaml"
)

// Problem is one thing wrong in a configuration file.
type Problem struct {
	// Line is the 1-based line of the offending key in the file (0 when unknown).
	Line int
	// Field is the path of the offending field, as in the file
	// ("iptables.masqueradeBit", "nodePortAddresses[1]"); "" for the whole file.
	Field string
	// Message says what is wrong; it names the field.
	Message string
	// Lenient is set for the problems upstream kube-proxy only warns about
	// (it retries a failed strict decode leniently): an unknown or removed
	// field, a duplicate field. LoadLenient accepts a file whose problems
	// are all Lenient.
	Lenient bool
}

// DecodeError lists every problem found in a configuration file.
type DecodeError struct {
	// File is the path as given to Load ("" for Decode).
	File     string
	Problems []Problem
}

// Error renders one line per problem: "file:line: message".
func (e *DecodeError) Error() string {
	var b strings.Builder
	for i, p := range e.Problems {
		if i > 0 {
			b.WriteByte('\n')
		}
		switch {
		case e.File != "" && p.Line > 0:
			fmt.Fprintf(&b, "%s:%d: ", e.File, p.Line)
		case e.File != "":
			fmt.Fprintf(&b, "%s: ", e.File)
		case p.Line > 0:
			fmt.Fprintf(&b, "line %d: ", p.Line)
		}
		b.WriteString(p.Message)
	}
	return b.String()
}

// Load reads a KubeProxyConfiguration (kubeproxy.config.k8s.io/v1alpha1) from
// a YAML or JSON file, strictly: a wrong apiVersion or kind, an unknown or
// duplicate field, or a value of the wrong type is an error naming the file,
// the line and the field; every such problem is reported at once, as a
// *DecodeError. Defaults are not applied.
func Load(path string) (*v1alpha1.KubeProxyConfiguration, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("reading kube-proxy configuration: %w", err)
	}
	c, err := Decode(data)
	if err != nil {
		var de *DecodeError
		if errors.As(err, &de) {
			de.File = path
		}
		return nil, err
	}
	return c, nil
}

// LoadLenient reads a KubeProxyConfiguration as upstream kube-proxy does:
// strictly first and, when the only problems are unknown (or removed) and
// duplicate fields, again leniently, returning those problems as warnings
// (one per field). Any other problem is an error, as with Load.
func LoadLenient(path string) (*v1alpha1.KubeProxyConfiguration, []Problem, error) {
	c, warnings, _, err := loadLenient(path)
	return c, warnings, err
}

// loadLenient is LoadLenient, also returning the bytes it decoded.
func loadLenient(path string) (*v1alpha1.KubeProxyConfiguration, []Problem, []byte, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, nil, nil, fmt.Errorf("reading kube-proxy configuration: %w", err)
	}
	c, warnings, err := DecodeLenient(data)
	if err != nil {
		var de *DecodeError
		if errors.As(err, &de) {
			de.File = path
		}
		return nil, nil, nil, err
	}
	return c, warnings, data, nil
}

// DecodeLenient is LoadLenient on data.
func DecodeLenient(data []byte) (*v1alpha1.KubeProxyConfiguration, []Problem, error) {
	c, err := Decode(data)
	if err == nil {
		return c, nil, nil
	}
	var de *DecodeError
	if !errors.As(err, &de) {
		return nil, nil, err
	}
	for _, p := range de.Problems {
		if !p.Lenient {
			return nil, nil, err
		}
	}
	// Every problem is an unknown or duplicate field: decode again without
	// those checks (a duplicate key keeps its last value, as upstream).
	js, yerr := yaml.YAMLToJSON(data)
	if yerr != nil {
		return nil, nil, err
	}
	c = &v1alpha1.KubeProxyConfiguration{}
	if uerr := sigsjson.UnmarshalCaseSensitivePreserveInts(js, c); uerr != nil || c.APIVersion != kubeProxyConfigAPIVersion || c.Kind != kubeProxyConfigKind {
		return nil, nil, err
	}
	return c, de.Problems, nil
}

// Decode parses a KubeProxyConfiguration from YAML or JSON, strictly (see Load).
func Decode(data []byte) (*v1alpha1.KubeProxyConfiguration, error) {
	fail := func(ps ...Problem) (*v1alpha1.KubeProxyConfiguration, error) {
		lines := lineFinder(data)
		for i := range ps {
			if ps[i].Line == 0 && ps[i].Field != "" {
				ps[i].Line = lines(ps[i].Field)
			}
		}
		sort.SliceStable(ps, func(i, j int) bool { return lineLess(ps[i].Line, ps[j].Line) })
		return nil, &DecodeError{Problems: ps}
	}

	// YAML is a superset of JSON: one path for both. The strict conversion
	// rejects duplicate keys.
	js, err := yaml.YAMLToJSONStrict(data)
	if err != nil {
		ps := yamlProblems(err)
		if _, lerr := yaml.YAMLToJSON(data); lerr == nil {
			// Only the strict conversion failed: duplicate keys.
			for i := range ps {
				ps[i].Lenient = true
			}
		}
		return fail(ps...)
	}
	dec := json.NewDecoder(bytes.NewReader(js))
	dec.UseNumber()
	var obj map[string]any
	if err := dec.Decode(&obj); err != nil || obj == nil {
		return fail(Problem{Message: "not a KubeProxyConfiguration: the document must be a mapping with apiVersion " +
			strconv.Quote(kubeProxyConfigAPIVersion) + " and kind " + strconv.Quote(kubeProxyConfigKind)})
	}
	if ps := typeMetaProblems(obj); len(ps) > 0 {
		return fail(ps...)
	}

	// Values of the wrong type or form are found leaf by leaf, so that all are
	// reported with their path, then removed so the strict decoder can report
	// every unknown field too.
	problems := valueProblems(obj, reflect.TypeFor[v1alpha1.KubeProxyConfiguration](), "")
	if len(problems) > 0 {
		if js, err = json.Marshal(obj); err != nil {
			return fail(append(problems, Problem{Message: err.Error()})...)
		}
	}
	c := &v1alpha1.KubeProxyConfiguration{}
	strict, err := sigsjson.UnmarshalStrict(js, c)
	for _, s := range strict {
		p := Problem{Message: s.Error(), Lenient: true}
		var fe sigsjson.FieldError
		if errors.As(s, &fe) {
			p.Field = fe.FieldPath()
		}
		problems = append(problems, p)
	}
	if err != nil {
		problems = append(problems, Problem{Message: strings.TrimPrefix(err.Error(), "json: ")})
	}
	if len(problems) > 0 {
		return fail(problems...)
	}
	return c, nil
}

var yamlLineRE = regexp.MustCompile(`line (\d+): (.+)`)

// yamlProblems turns a YAML parser error into problems with line numbers.
func yamlProblems(err error) []Problem {
	var ps []Problem
	for _, m := range yamlLineRE.FindAllStringSubmatch(err.Error(), -1) {
		line, _ := strconv.Atoi(m[1])
		ps = append(ps, Problem{Line: line, Message: "invalid YAML: " + m[2]})
	}
	if len(ps) == 0 {
		ps = append(ps, Problem{Message: "invalid YAML: " + strings.TrimPrefix(err.Error(), "error converting YAML to JSON: ")})
	}
	return ps
}

func typeMetaProblems(obj map[string]any) []Problem {
	var ps []Problem
	for _, want := range []struct{ field, value string }{
		{"apiVersion", kubeProxyConfigAPIVersion},
		{"kind", kubeProxyConfigKind},
	} {
		got, present := obj[want.field]
		s, _ := got.(string)
		switch {
		case !present:
			ps = append(ps, Problem{Message: fmt.Sprintf("missing %s: must be %q", want.field, want.value)})
		case s != want.value:
			ps = append(ps, Problem{Field: want.field, Message: fmt.Sprintf("%s: must be %q, not %s", want.field, want.value, render(got))})
		}
	}
	return ps
}

// valueProblems decodes every leaf of obj into the type of the matching field
// of t and returns one problem per leaf that does not fit, removing it from
// obj. Unknown keys are left for the strict decoder.
func valueProblems(obj map[string]any, t reflect.Type, prefix string) []Problem {
	fields := jsonFields(t)
	keys := make([]string, 0, len(obj))
	for k := range obj {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var ps []Problem
	for _, k := range keys {
		ft, known := fields[k]
		if !known {
			continue
		}
		path := k
		if prefix != "" {
			path = prefix + "." + k
		}
		if sub, isObject := obj[k].(map[string]any); isObject && isPlainStruct(ft) {
			ps = append(ps, valueProblems(sub, derefType(ft), path)...)
			continue
		}
		raw, err := json.Marshal(obj[k])
		if err == nil {
			err = json.Unmarshal(raw, reflect.New(ft).Interface())
		}
		if err != nil {
			ps = append(ps, Problem{Field: path, Message: path + ": " + describeValueError(err, obj[k], ft)})
			delete(obj, k)
		}
	}
	return ps
}

// jsonFields maps the JSON names of t's fields (including inlined embedded
// structs) to their types.
func jsonFields(t reflect.Type) map[string]reflect.Type {
	out := map[string]reflect.Type{}
	if t.Kind() != reflect.Struct {
		return out
	}
	for i := 0; i < t.NumField(); i++ {
		f := t.Field(i)
		name, opts, _ := strings.Cut(f.Tag.Get("json"), ",")
		if name == "-" && opts == "" {
			continue
		}
		if f.Anonymous && (name == "" || strings.Contains(opts, "inline")) {
			for k, v := range jsonFields(derefType(f.Type)) {
				out[k] = v
			}
			continue
		}
		if !f.IsExported() {
			continue
		}
		if name == "" {
			name = f.Name
		}
		out[name] = f.Type
	}
	return out
}

var jsonUnmarshaler = reflect.TypeFor[json.Unmarshaler]()

// isPlainStruct reports whether t (or *t) is a struct decoded field by field.
func isPlainStruct(t reflect.Type) bool {
	t = derefType(t)
	return t.Kind() == reflect.Struct && !reflect.PointerTo(t).Implements(jsonUnmarshaler)
}

func derefType(t reflect.Type) reflect.Type {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	return t
}

// describeValueError explains why value does not fit a field of type t.
func describeValueError(err error, value any, t reflect.Type) string {
	var te *json.UnmarshalTypeError
	if errors.As(err, &te) {
		return fmt.Sprintf("got %s, want %s", render(value), describeType(t))
	}
	msg := strings.TrimPrefix(err.Error(), "json: ")
	return fmt.Sprintf("invalid value %s: %s", render(value), msg)
}

// describeType names what a field of type t accepts, for error messages.
func describeType(t reflect.Type) string {
	t = derefType(t)
	if t.Name() == "Duration" && strings.HasSuffix(t.PkgPath(), "apis/meta/v1") {
		return `a duration such as "30s"`
	}
	switch t.Kind() {
	case reflect.Bool:
		return "true or false"
	case reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64, reflect.Int:
		return "an integer (" + t.Kind().String() + ")"
	case reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64, reflect.Uint:
		return "a non-negative integer (" + t.Kind().String() + ")"
	case reflect.Float32, reflect.Float64:
		return "a number"
	case reflect.String:
		return "a string"
	case reflect.Slice, reflect.Array:
		return "a list of " + strings.TrimPrefix(strings.TrimPrefix(describeType(t.Elem()), "a "), "an ") + "s"
	case reflect.Map:
		return "a mapping"
	case reflect.Struct:
		return "a mapping"
	}
	return t.String()
}

// render shows a decoded JSON value the way the user wrote it, shortened.
func render(v any) string {
	switch x := v.(type) {
	case nil:
		return "null"
	case string:
		return strconv.Quote(x)
	case map[string]any:
		return "a mapping"
	case []any:
		return "a list"
	}
	b, err := json.Marshal(v)
	if err != nil {
		return fmt.Sprint(v)
	}
	return string(b)
}

// lineFinder returns a function mapping a field path ("a.b[2].c") to the
// line of its key in data, or of the deepest ancestor found; 0 when data is
// not parseable YAML or the path names no key.
func lineFinder(data []byte) func(path string) int {
	var doc yamlv3.Node
	if err := yamlv3.Unmarshal(data, &doc); err != nil || len(doc.Content) == 0 {
		return func(string) int { return 0 }
	}
	root := doc.Content[0]
	return func(path string) int {
		node, line := root, 0
		for _, seg := range splitPath(path) {
			next, keyLine := child(node, seg)
			if next == nil {
				break
			}
			node, line = next, keyLine
		}
		return line
	}
}

// splitPath splits "a.b[2].c" into "a", "b", "[2]", "c".
func splitPath(path string) []string {
	var segs []string
	for _, part := range strings.Split(path, ".") {
		for part != "" {
			i := strings.IndexByte(part[1:], '[')
			if i < 0 {
				segs = append(segs, part)
				break
			}
			segs = append(segs, part[:i+1])
			part = part[i+1:]
		}
	}
	return segs
}

// child returns the node under key (or index "[i]") of a mapping (sequence)
// and the line where it is named.
func child(n *yamlv3.Node, seg string) (*yamlv3.Node, int) {
	for n.Kind == yamlv3.AliasNode && n.Alias != nil {
		n = n.Alias
	}
	if strings.HasPrefix(seg, "[") && strings.HasSuffix(seg, "]") {
		i, err := strconv.Atoi(seg[1 : len(seg)-1])
		if err != nil || n.Kind != yamlv3.SequenceNode || i < 0 || i >= len(n.Content) {
			return nil, 0
		}
		return n.Content[i], n.Content[i].Line
	}
	if n.Kind != yamlv3.MappingNode {
		return nil, 0
	}
	for i := 0; i+1 < len(n.Content); i += 2 {
		if n.Content[i].Value == seg {
			return n.Content[i+1], n.Content[i].Line
		}
	}
	return nil, 0
}

// lineLess orders known lines first, ascending.
func lineLess(a, b int) bool {
	switch {
	case a == 0:
		return false
	case b == 0:
		return true
	}
	return a < b
}
