package cache

import (
	"fmt"
	"strconv"
	"strings"
	"unicode"

	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/validation"
)

// Names are validated here, once, for both sources (API server and manifest
// directory), with the API server's own rules, so that nothing downstream (a
// rule comment, a chain-name hash input, a log line, an Event) ever sees a
// newline, a quote or another control character from object data:
//
//   - namespaces and Service names: DNS-1123 labels (Service names are
//     DNS-1035 labels, or DNS-1123 labels with RelaxedServiceNameValidation;
//     the wider rule is used so that no Service the API server accepts is
//     rejected);
//   - EndpointSlice names: DNS-1123 subdomains; the slice's Service label
//     names a Service, so it is a DNS-1123 label;
//   - port names of Services and EndpointSlices: DNS-1123 labels, the rule
//     the API server applies to both. (IANA_SVC_NAME, 15 characters at most,
//     is the rule for container ports: applying it here would reject legal
//     Services.)
//
// An object with a bad namespace or name is rejected whole, with one
// Problem; a port with a bad name is dropped like any other bad port.

// nameRule checks one name; it returns the reasons it is invalid.
type nameRule func(string) []string

var (
	dnsLabel     nameRule = fastValid(isLabel, 63, validation.IsDNS1123Label)
	dnsSubdomain nameRule = fastValid(isSubdomain, 253, validation.IsDNS1123Subdomain)
)

// fastValid answers for a name valid by ok (and at most max bytes) without
// rule, whose regular expression took a sixth of the initial lists' time
// in the cache; anything else goes to rule, which says why it is invalid.
func fastValid(ok func(string) bool, max int, rule nameRule) nameRule {
	return func(s string) []string {
		if len(s) <= max && ok(s) {
			return nil
		}
		return rule(s)
	}
}

// isLabel: [a-z0-9]([-a-z0-9]*[a-z0-9])?, at most 63 bytes.
func isLabel(s string) bool {
	if len(s) == 0 || len(s) > 63 || s[0] == '-' || s[len(s)-1] == '-' {
		return false
	}
	for i := 0; i < len(s); i++ {
		if c := s[i]; (c < 'a' || c > 'z') && (c < '0' || c > '9') && c != '-' {
			return false
		}
	}
	return true
}

// isSubdomain: labels joined by dots (each as isLabel, without its length
// bound: the subdomain's is 253).
func isSubdomain(s string) bool {
	for part := range strings.SplitSeq(s, ".") {
		if len(part) == 0 || part[0] == '-' || part[len(part)-1] == '-' {
			return false
		}
		for i := 0; i < len(part); i++ {
			if c := part[i]; (c < 'a' || c > 'z') && (c < '0' || c > '9') && c != '-' {
				return false
			}
		}
	}
	return true
}

// nameProblem returns the Problem for the first invalid name among checks
// (field, value, rule triples), or nil when all are valid.
func nameProblem(kind string, obj types.NamespacedName, checks ...nameCheck) *Problem {
	for _, c := range checks {
		if msgs := c.rule(c.value); len(msgs) > 0 {
			return &Problem{Kind: kind, Object: safeName(obj), Field: c.field,
				Reason: fmt.Sprintf("invalid name %q: %s", c.value, strings.Join(msgs, "; "))}
		}
	}
	return nil
}

type nameCheck struct {
	field string
	value string
	rule  nameRule
}

// safeName makes a name printable on one line: a rejected object is named in
// the warning, and the warning must not carry its control characters.
func safeName(n types.NamespacedName) types.NamespacedName {
	return types.NamespacedName{Namespace: printable(n.Namespace), Name: printable(n.Name)}
}

func printable(s string) string {
	if strings.IndexFunc(s, func(r rune) bool { return !unicode.IsPrint(r) || r == '"' || r == '\\' }) < 0 {
		return s
	}
	q := strconv.Quote(s)
	return q[1 : len(q)-1]
}
