package controlplane

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"sort"
	"strconv"
	"time"
)

// Request is one API request read from the API server's audit log.
type Request struct {
	AuditID string
	User    string
	// Verb is the Kubernetes verb (get, list, watch, create, patch, ...).
	Verb        string
	APIGroup    string
	Resource    string
	Subresource string
	Namespace   string
	Name        string
	// RequestURI is the path and query.
	RequestURI string
	// Code is the HTTP status of the response (0 when the log has none yet).
	Code int
	// Received is when the API server received the request.
	Received time.Time
	// Decision is the authorizer's "allow" or "forbid", and Reason its
	// explanation (often empty).
	Decision, Reason string
}

// Call names what RBAC sees of a request: "verb group/resource[/sub]", or
// "verb URI" for a non-resource request.
func (r Request) Call() string {
	if r.Resource == "" {
		return r.Verb + " " + r.RequestURI
	}
	g := r.APIGroup
	if g == "" {
		g = "core"
	}
	res := r.Resource
	if r.Subresource != "" {
		res += "/" + r.Subresource
	}
	return r.Verb + " " + g + "/" + res
}

func (r Request) String() string {
	s := r.User + " " + r.Call()
	if r.Namespace != "" {
		s += " ns=" + r.Namespace
	}
	if r.Name != "" {
		s += " name=" + r.Name
	}
	s += " → " + strconv.Itoa(r.Code) + " " + r.Decision
	if r.Reason != "" {
		s += " (" + r.Reason + ")"
	}
	return s
}

// Denial is a request that the API server's authorizer refused (Decision
// "forbid", Code 403), with its own one-line rendering.
type Denial Request

// String renders the denial on one line for test failure messages.
func (d Denial) String() string {
	res := d.Resource
	if d.APIGroup != "" {
		res += "." + d.APIGroup
	}
	if d.Subresource != "" {
		res += "/" + d.Subresource
	}
	if res == "" {
		res = d.RequestURI
	}
	s := d.User + " " + d.Verb + " " + res
	switch {
	case d.Name != "" && d.Namespace != "":
		s += " " + d.Namespace + "/" + d.Name
	case d.Name != "":
		s += " " + d.Name
	case d.Namespace != "":
		s += " in namespace " + d.Namespace
	}
	s += fmt.Sprintf(" (%d)", d.Code)
	if d.Reason != "" {
		s += ": " + d.Reason
	}
	return s
}

// Annotations the API server adds to audit events with its authorization decision.
const (
	annotationDecision = "authorization.k8s.io/decision"
	annotationReason   = "authorization.k8s.io/reason"
)

// auditLine holds the audit.k8s.io/v1 Event fields ReadAudit and AuditDenials use.
type auditLine struct {
	AuditID    string    `json:"auditID"`
	Received   time.Time `json:"requestReceivedTimestamp"`
	RequestURI string    `json:"requestURI"`
	Verb       string    `json:"verb"`
	User       struct {
		Username string `json:"username"`
	} `json:"user"`
	ObjectRef *struct {
		Resource    string `json:"resource"`
		Namespace   string `json:"namespace"`
		Name        string `json:"name"`
		APIGroup    string `json:"apiGroup"`
		Subresource string `json:"subresource"`
	} `json:"objectRef"`
	ResponseStatus *struct {
		Code int `json:"code"`
	} `json:"responseStatus"`
	Annotations map[string]string `json:"annotations"`
}

// AuditRequests returns the requests of user ("" for everyone) since Start,
// read from the API server's audit log (see ReadAudit); none before the
// first request.
func (cp *ControlPlane) AuditRequests(user string) ([]Request, error) {
	reqs, err := ReadAudit(cp.files.auditLog(), user)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	return reqs, err
}

// AuditDenials returns every request the authorizer refused since Start, in
// the order they were logged, one per request (Reset keeps the log). Filter
// by User for the Kproxy identity.
func (cp *ControlPlane) AuditDenials() ([]Denial, error) {
	reqs, err := cp.AuditRequests("")
	return denials(reqs), err
}

// parseDenials is AuditDenials over a log read from r.
func parseDenials(r io.Reader) ([]Denial, error) {
	reqs, err := parseAudit(r, "")
	return denials(reqs), err
}

func denials(reqs []Request) []Denial {
	var out []Denial
	for _, r := range reqs {
		if r.Decision == "forbid" {
			out = append(out, Denial(r))
		}
	}
	return out
}

// ReadAudit returns the requests of user ("" for everyone) in a JSON-lines
// audit log, one per audit ID, in the order they were first logged (later
// stages of a request, such as a watch's ResponseComplete, update it). A
// last line without a newline is still being written and is skipped; a bad
// line is an error naming it, after the requests that could be read.
func ReadAudit(path, user string) ([]Request, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("reading audit log: %w", err)
	}
	defer func() { _ = f.Close() }()
	return parseAudit(f, user)
}

func parseAudit(r io.Reader, user string) ([]Request, error) {
	var (
		out  []Request
		errs []error
		seen = map[string]int{}
	)
	br := bufio.NewReader(r)
	for lineNo := 1; ; lineNo++ {
		line, err := br.ReadBytes('\n')
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return out, fmt.Errorf("audit log line %d: %w", lineNo, err)
		}
		if line = bytes.TrimSpace(line); len(line) == 0 {
			continue
		}
		var ev auditLine
		if err := json.Unmarshal(line, &ev); err != nil {
			errs = append(errs, fmt.Errorf("audit log line %d: %w", lineNo, err))
			continue
		}
		if user != "" && ev.User.Username != user {
			continue
		}
		req := Request{
			AuditID:    ev.AuditID,
			Received:   ev.Received,
			User:       ev.User.Username,
			Verb:       ev.Verb,
			RequestURI: ev.RequestURI,
			Decision:   ev.Annotations[annotationDecision],
			Reason:     ev.Annotations[annotationReason],
		}
		if o := ev.ObjectRef; o != nil {
			req.APIGroup, req.Resource, req.Subresource = o.APIGroup, o.Resource, o.Subresource
			req.Namespace, req.Name = o.Namespace, o.Name
		}
		if ev.ResponseStatus != nil {
			req.Code = ev.ResponseStatus.Code
		}
		if i, ok := seen[ev.AuditID]; ok && ev.AuditID != "" {
			if req.Code == 0 {
				req.Code = out[i].Code
			}
			if req.Decision == "" {
				req.Decision, req.Reason = out[i].Decision, out[i].Reason
			}
			if req.Received.IsZero() {
				req.Received = out[i].Received
			}
			out[i] = req
			continue
		}
		seen[ev.AuditID] = len(out)
		out = append(out, req)
	}
	return out, errors.Join(errs...)
}

// Calls returns the distinct Call values of reqs, sorted.
func Calls(reqs []Request) []string {
	set := map[string]bool{}
	for _, r := range reqs {
		set[r.Call()] = true
	}
	out := make([]string, 0, len(set))
	for c := range set {
		out = append(out, c)
	}
	sort.Strings(out)
	return out
}
