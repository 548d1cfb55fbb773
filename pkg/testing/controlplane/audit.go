package controlplane

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
)

// Denial is one request that the API server's authorizer refused, read from
// the audit log.
type Denial struct {
	AuditID     string
	User        string
	Verb        string
	APIGroup    string
	Resource    string
	Subresource string
	Namespace   string
	Name        string
	// RequestURI is the path and query of the request.
	RequestURI string
	// Code is the HTTP status code (403).
	Code int
	// Reason is the authorizer's explanation (often empty for RBAC denials).
	Reason string
}

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

// auditEvent holds the audit.k8s.io/v1 Event fields that AuditDenials reads.
type auditEvent struct {
	AuditID    string `json:"auditID"`
	Stage      string `json:"stage"`
	RequestURI string `json:"requestURI"`
	Verb       string `json:"verb"`
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

// AuditDenials returns every request the authorizer refused since Start, in
// the order they were logged, one per request (Reset keeps the log). Filter by User for the
// Kproxy identity.
func (cp *ControlPlane) AuditDenials() ([]Denial, error) {
	f, err := os.Open(cp.files.auditLog())
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil // no request yet
	}
	if err != nil {
		return nil, fmt.Errorf("reading audit log: %w", err)
	}
	defer f.Close()
	return parseDenials(f)
}

// parseDenials reads an audit log (one JSON event per line). A last line
// without a newline is being written and is skipped; any other line that is
// not an event is an error naming its line number, after the denials that
// could be read.
func parseDenials(r io.Reader) ([]Denial, error) {
	var (
		out  []Denial
		errs []error
		seen = map[string]int{} // auditID -> index in out
	)
	br := bufio.NewReader(r)
	for lineNo := 1; ; lineNo++ {
		line, err := br.ReadBytes('\n')
		if errors.Is(err, io.EOF) {
			break // a partial last line, or nothing
		}
		if err != nil {
			return out, fmt.Errorf("reading audit log line %d: %w", lineNo, err)
		}
		line = bytes.TrimSpace(line)
		if len(line) == 0 {
			continue
		}
		var ev auditEvent
		if err := json.Unmarshal(line, &ev); err != nil {
			errs = append(errs, fmt.Errorf("audit log line %d: %w", lineNo, err))
			continue
		}
		if ev.Annotations[annotationDecision] != "forbid" {
			continue
		}
		d := Denial{
			AuditID:    ev.AuditID,
			User:       ev.User.Username,
			Verb:       ev.Verb,
			RequestURI: ev.RequestURI,
			Reason:     ev.Annotations[annotationReason],
		}
		if ev.ObjectRef != nil {
			d.APIGroup, d.Resource, d.Subresource = ev.ObjectRef.APIGroup, ev.ObjectRef.Resource, ev.ObjectRef.Subresource
			d.Namespace, d.Name = ev.ObjectRef.Namespace, ev.ObjectRef.Name
		}
		if ev.ResponseStatus != nil {
			d.Code = ev.ResponseStatus.Code
		}
		// A request can log several stages; the last one is the most
		// complete, and the first one fixes the position.
		if i, ok := seen[ev.AuditID]; ok && ev.AuditID != "" {
			out[i] = d
			continue
		}
		seen[ev.AuditID] = len(out)
		out = append(out, d)
	}
	return out, errors.Join(errs...)
}
