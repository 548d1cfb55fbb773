package source

import (
	"bytes"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"regexp"
	"strconv"
	"strings"

	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	sigsjson "sigs.k8s.io/json"
	"sigs.k8s.io/yaml"
)

// objectKey identifies an object served by the manifest source.
type objectKey struct {
	kind            kind
	namespace, name string
}

func (k objectKey) String() string {
	if k.namespace == "" {
		return k.kind.String() + " " + k.name
	}
	return k.kind.String() + " " + k.namespace + "/" + k.name
}

// manifestObject is one object read from a manifest file. obj has no
// resourceVersion: the store assigns those.
type manifestObject struct {
	key  objectKey
	obj  runtime.Object
	line int
}

// fileError says where a manifest file, or one object in it, went wrong.
type fileError struct {
	File string
	// Line is the 1-based line the problem was found at (0: unknown). For an
	// object-level problem it is the line its document starts at.
	Line   int
	Reason string
}

func (e *fileError) Error() string {
	if e.Line > 0 {
		return fmt.Sprintf("%s:%d: %s", e.File, e.Line, e.Reason)
	}
	return e.File + ": " + e.Reason
}

// document is one YAML document or JSON value of a file.
type document struct {
	line int // 1-based line the document starts at
	data []byte
}

// parseManifest parses one manifest file (file names it in messages; data is
// its content). It returns the file's objects in order and the objects it
// skipped, or a *fileError when the file as a whole does not parse.
func parseManifest(file string, data []byte) (objs []manifestObject, skipped []*fileError, err error) {
	data = bytes.TrimPrefix(data, []byte("\xef\xbb\xbf"))
	var docs []document
	if strings.HasSuffix(strings.ToLower(file), ".json") {
		if docs, err = splitJSON(file, data); err != nil {
			return nil, nil, err
		}
	} else {
		for _, d := range splitYAML(data) {
			j, err := yaml.YAMLToJSONStrict(d.data)
			if err != nil {
				return nil, nil, yamlError(file, d.line, err)
			}
			docs = append(docs, document{line: d.line, data: j})
		}
	}
	p := parser{file: file}
	for i, d := range docs {
		if err := p.decode(d.line, fmt.Sprintf("document %d", i+1), d.data, false, metav1.TypeMeta{}); err != nil {
			return nil, nil, err
		}
	}
	return p.objs, p.skipped, nil
}

// splitYAML cuts data into documents at "---" lines (and "..." end markers).
func splitYAML(data []byte) []document {
	var (
		docs []document
		cur  []byte
		// start is the line the current document starts at.
		start = 1
	)
	flush := func(next int) {
		if len(bytes.TrimSpace(cur)) > 0 {
			docs = append(docs, document{line: start, data: cur})
		}
		cur, start = nil, next
	}
	line := 0
	for len(data) > 0 {
		line++
		var l []byte
		if i := bytes.IndexByte(data, '\n'); i >= 0 {
			l, data = data[:i+1], data[i+1:]
		} else {
			l, data = data, nil
		}
		t := bytes.TrimRight(l, " \t\r\n")
		switch {
		case bytes.Equal(t, []byte("...")):
			flush(line + 1)
		case bytes.HasPrefix(t, []byte("---")) && (len(t) == 3 || t[3] == ' ' || t[3] == '\t'):
			rest := bytes.TrimSpace(t[3:])
			if len(rest) == 0 || rest[0] == '#' {
				flush(line + 1)
			} else {
				// "--- {inline: doc}": the document starts on this line.
				flush(line)
				cur = append(append(cur, rest...), '\n')
			}
		case len(bytes.TrimSpace(cur)) == 0 && (len(bytes.TrimSpace(t)) == 0 || bytes.HasPrefix(bytes.TrimSpace(t), []byte("#"))):
			// Blank and comment lines before a document's content are
			// dropped so that its line is where its content starts.
			cur, start = nil, line+1
		default:
			cur = append(cur, l...)
		}
	}
	flush(line + 1)
	return docs
}

// splitJSON cuts data into concatenated JSON values.
func splitJSON(file string, data []byte) ([]document, error) {
	var docs []document
	dec := json.NewDecoder(bytes.NewReader(data))
	for {
		off := int(dec.InputOffset())
		for off < len(data) && isJSONSpace(data[off]) {
			off++
		}
		var raw json.RawMessage
		err := dec.Decode(&raw)
		if errors.Is(err, io.EOF) {
			return docs, nil
		}
		if err != nil {
			at := len(data)
			var se *json.SyntaxError
			if errors.As(err, &se) {
				at = int(se.Offset)
			}
			return nil, &fileError{File: file, Line: lineAt(data, at), Reason: err.Error()}
		}
		docs = append(docs, document{line: lineAt(data, off), data: raw})
	}
}

func isJSONSpace(c byte) bool { return c == ' ' || c == '\t' || c == '\r' || c == '\n' }

// lineAt returns the 1-based line of byte offset off.
func lineAt(data []byte, off int) int {
	off = min(max(off, 0), len(data))
	return bytes.Count(data[:off], []byte("\n")) + 1
}

var yamlLineRE = regexp.MustCompile(`\bline (\d+): `)

// yamlError turns a YAML-to-JSON error in the document starting at docLine
// into a fileError, with the absolute line of the first problem when the
// parser told one.
func yamlError(file string, docLine int, err error) *fileError {
	msg := strings.TrimPrefix(err.Error(), "error converting YAML to JSON: ")
	msg = strings.TrimPrefix(msg, "yaml: ")
	fe := &fileError{File: file, Line: docLine}
	if m := yamlLineRE.FindStringSubmatchIndex(msg); m != nil {
		if n, convErr := strconv.Atoi(msg[m[2]:m[3]]); convErr == nil && n > 0 {
			fe.Line = docLine + n - 1
			msg = msg[:m[0]] + msg[m[1]:]
		}
	}
	fe.Reason = strings.Join(strings.Fields(msg), " ")
	return fe
}

// parser accumulates the objects of one file.
type parser struct {
	file    string
	objs    []manifestObject
	skipped []*fileError
}

func (p *parser) skip(line int, format string, args ...any) {
	p.skipped = append(p.skipped, &fileError{File: p.file, Line: line, Reason: fmt.Sprintf(format, args...)})
}

// listItemKinds maps the list kinds to the API version they need and the
// kind their items default to.
var listItemKinds = map[string]metav1.TypeMeta{
	"List":              {APIVersion: "v1"},
	"ServiceList":       {APIVersion: "v1", Kind: "Service"},
	"NodeList":          {APIVersion: "v1", Kind: "Node"},
	"EndpointSliceList": {APIVersion: discovery.SchemeGroupVersion.String(), Kind: "EndpointSlice"},
}

// objectKinds maps the served kinds to the API version they need.
var objectKinds = map[string]struct {
	apiVersion string
	kind       kind
}{
	"Service":       {"v1", kindService},
	"Node":          {"v1", kindNode},
	"EndpointSlice": {discovery.SchemeGroupVersion.String(), kindEndpointSlice},
}

// decode adds the object (or list items) of one JSON document. what names
// the document in messages. defaults fills a missing apiVersion and kind (the
// items of a typed list). A returned error means the file does not parse.
func (p *parser) decode(line int, what string, raw []byte, inList bool, defaults metav1.TypeMeta) error {
	if bytes.Equal(bytes.TrimSpace(raw), []byte("null")) {
		return nil // an empty document
	}
	var tm metav1.TypeMeta
	if err := json.Unmarshal(raw, &tm); err != nil {
		return &fileError{File: p.file, Line: line, Reason: fmt.Sprintf("%s: not a Kubernetes object: %v", what, err)}
	}
	if tm.Kind == "" && tm.APIVersion == "" {
		tm = defaults
	}
	if want, ok := listItemKinds[tm.Kind]; ok {
		if inList {
			p.skip(line, "%s: a %s inside a list is not supported", what, tm.Kind)
			return nil
		}
		if tm.APIVersion != want.APIVersion {
			p.skip(line, "%s: %s has apiVersion %q, want %q", what, tm.Kind, tm.APIVersion, want.APIVersion)
			return nil
		}
		var list struct {
			Items []json.RawMessage `json:"items"`
		}
		if err := json.Unmarshal(raw, &list); err != nil {
			return &fileError{File: p.file, Line: line, Reason: fmt.Sprintf("%s: %s items: %v", what, tm.Kind, err)}
		}
		for i, item := range list.Items {
			if err := p.decode(line, fmt.Sprintf("%s items[%d]", what, i), item, true, want); err != nil {
				return err
			}
		}
		return nil
	}
	k, ok := objectKinds[tm.Kind]
	switch {
	case tm.Kind == "":
		p.skip(line, "%s: missing kind", what)
		return nil
	case !ok:
		p.skip(line, "%s: unsupported kind %q (want Service, EndpointSlice, Node or List)", what, tm.Kind)
		return nil
	case tm.APIVersion != k.apiVersion:
		p.skip(line, "%s: %s has apiVersion %q, want %q", what, tm.Kind, tm.APIVersion, k.apiVersion)
		return nil
	}

	var (
		obj  runtime.Object
		meta *metav1.ObjectMeta
	)
	switch k.kind {
	case kindService:
		o := &v1.Service{}
		obj, meta = o, &o.ObjectMeta
	case kindEndpointSlice:
		o := &discovery.EndpointSlice{}
		obj, meta = o, &o.ObjectMeta
	default:
		o := &v1.Node{}
		obj, meta = o, &o.ObjectMeta
	}
	strictErrs, err := sigsjson.UnmarshalStrict(raw, obj)
	if err != nil {
		return &fileError{File: p.file, Line: line, Reason: fmt.Sprintf("%s: %s: %v", what, tm.Kind, err)}
	}
	if len(strictErrs) > 0 {
		return &fileError{File: p.file, Line: line, Reason: fmt.Sprintf("%s: %s: %v", what, tm.Kind, errors.Join(strictErrs...))}
	}
	if meta.Name == "" {
		p.skip(line, "%s: %s without metadata.name", what, tm.Kind)
		return nil
	}
	if k.kind == kindNode {
		meta.Namespace = ""
	} else if meta.Namespace == "" {
		meta.Namespace = metav1.NamespaceDefault
	}
	// Objects are served like a typed client returns them: no type meta, and
	// the store assigns resourceVersions.
	clearTypeMeta(obj)
	meta.ResourceVersion = ""
	key := objectKey{kind: k.kind, namespace: meta.Namespace, name: meta.Name}
	if meta.UID == "" {
		meta.UID = syntheticUID(key)
	}
	p.objs = append(p.objs, manifestObject{key: key, obj: obj, line: line})
	return nil
}

func clearTypeMeta(obj runtime.Object) {
	obj.GetObjectKind().SetGroupVersionKind(schema.GroupVersionKind{})
}

// syntheticUID derives a stable UID from an object's identity, for objects
// whose manifest has none.
func syntheticUID(k objectKey) types.UID {
	sum := sha256.Sum256([]byte(k.String()))
	h := fmt.Sprintf("%x", sum[:16])
	return types.UID(h[0:8] + "-" + h[8:12] + "-" + h[12:16] + "-" + h[16:20] + "-" + h[20:32])
}
