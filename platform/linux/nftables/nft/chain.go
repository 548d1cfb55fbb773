package nft

import "strconv"

// BaseChain is the spec of a base chain: its type ("nat", "filter"), hook
// ("prerouting", "input", "forward", "output", "postrouting"), priority
// and policy ("" or "accept", "drop").
type BaseChain struct {
	Type, Hook string
	Priority   int
	Policy     string
}

// String writes the spec as a chain's definition holds it ("type nat hook
// prerouting priority -100", then " ; policy drop" when not accept).
func (c BaseChain) String() string {
	s := "type " + c.Type + " hook " + c.Hook + " priority " + strconv.Itoa(c.Priority)
	if c.Policy != "" && c.Policy != "accept" {
		s += " ; policy " + c.Policy
	}
	return s
}

// Elem is a set or map element: its key, and a data map's value (Data) or
// a verdict map's (Verdict).
type Elem struct {
	Key     Key
	Data    Key
	Verdict *Verdict
}

// String writes "key", or "key : value" for a map's element.
func (e Elem) String() string { return string(e.Append(nil)) }

// Append appends the element's text (what String returns) to b.
func (e Elem) Append(b []byte) []byte {
	b = e.Key.Append(b)
	switch {
	case e.Verdict != nil:
		b = append(b, " : "...)
		b = e.Verdict.Append(b)
	case e.Data != nil:
		b = append(b, " : "...)
		b = e.Data.Append(b)
	}
	return b
}
