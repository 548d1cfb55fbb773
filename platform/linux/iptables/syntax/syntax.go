// Package syntax spells and splits iptables-restore and iptables-save
// lines: the quoting both the iptables renderer (rule comments) and its
// model (parsing iptables-save) and the take-over (reading kube-proxy's
// rules) must agree on.
package syntax

import (
	"errors"
	"strings"
)

// Split splits one line of iptables-restore input into arguments, honouring
// double quotes (with backslash escapes) the way iptables-restore does.
func Split(line string) ([]string, error) {
	var out []string
	var cur strings.Builder
	inQuote, have := false, false
	for i := 0; i < len(line); i++ {
		c := line[i]
		switch {
		case inQuote && c == '\\' && i+1 < len(line):
			i++
			cur.WriteByte(line[i])
		case c == '"':
			inQuote = !inQuote
			have = true
		case !inQuote && (c == ' ' || c == '\t'):
			if have {
				out = append(out, cur.String())
				cur.Reset()
				have = false
			}
		default:
			cur.WriteByte(c)
			have = true
		}
	}
	if inQuote {
		return nil, errors.New("unterminated quote")
	}
	if have {
		out = append(out, cur.String())
	}
	return out, nil
}

// SaveString spells a string option value the way iptables-save does.
func SaveString(s string) string {
	bare := s != ""
	for _, c := range s {
		if (c < 'a' || c > 'z') && (c < 'A' || c > 'Z') && (c < '0' || c > '9') && c != '_' && c != '-' {
			bare = false
			break
		}
	}
	if bare {
		return s
	}
	var b strings.Builder
	b.WriteByte('"')
	for _, c := range s {
		if c == '"' || c == '\\' || c == '\'' {
			b.WriteByte('\\')
		}
		b.WriteRune(c)
	}
	b.WriteByte('"')
	return b.String()
}
