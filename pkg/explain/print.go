package explain

import (
	"encoding/json"
	"fmt"
	"io"
	"strings"
)

// WriteJSON prints the result as indented JSON.
func WriteJSON(w io.Writer, r *Result) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	if err := enc.Encode(r); err != nil {
		return fmt.Errorf("writing the explanation: %w", err)
	}
	return nil
}

// WriteText prints the result for a person.
func WriteText(w io.Writer, r *Result) error {
	var b strings.Builder
	how := "planned"
	if r.Live {
		how = "live"
	}
	fmt.Fprintf(&b, "connection  %s from %s (%s) on node %s, %s %s\n", r.To, r.From, r.Origin, r.Node, r.Mode, how)
	if r.Frontend != nil {
		fmt.Fprintf(&b, "frontend    %s %s of %s\n", r.Frontend.Kind, r.Frontend.Address, r.Frontend.Service)
	} else {
		b.WriteString("frontend    none: no Service has this address and port\n")
	}
	fmt.Fprintf(&b, "verdict     %s\n", r.Verdict)
	for _, t := range r.Targets {
		if t.Verdict != DNAT {
			if r.Verdict == Mixed {
				fmt.Fprintf(&b, "            %5.1f%%  %s\n", 100*t.Probability, t.Verdict)
			}
			continue
		}
		var facts []string
		if t.Node != "" {
			facts = append(facts, "node "+t.Node)
		}
		if t.Zone != "" {
			facts = append(facts, "zone "+t.Zone)
		}
		if t.Local {
			facts = append(facts, "local")
		}
		if t.Terminating {
			facts = append(facts, "terminating")
		}
		if t.Masquerade && r.Masquerade != "yes" {
			facts = append(facts, "masqueraded")
		}
		extra := ""
		if len(facts) > 0 {
			extra = "  (" + strings.Join(facts, ", ") + ")"
		}
		fmt.Fprintf(&b, "            %5.1f%%  %s%s\n", 100*t.Probability, t.Endpoint, extra)
	}
	if r.Algorithm != "" {
		fmt.Fprintf(&b, "algorithm   %s\n", r.Algorithm)
	}
	fmt.Fprintf(&b, "masquerade  %s\n", r.Masquerade)
	if len(r.Decisions) > 0 {
		b.WriteString("decided by\n")
		for _, d := range r.Decisions {
			fmt.Fprintf(&b, "  - %s\n", d)
		}
	}
	if len(r.Path) > 0 {
		b.WriteString("path\n")
		for i, s := range r.Path {
			fmt.Fprintf(&b, "  %2d. %s: %s\n", i+1, s.Where, s.Why)
			if s.What != "" {
				fmt.Fprintf(&b, "      %s\n", s.What)
			}
		}
	}
	if r.Live {
		if len(r.Drift) == 0 {
			b.WriteString("drift       none: what is programmed matches kproxy's plan\n")
		} else {
			b.WriteString("drift\n")
			for _, d := range r.Drift {
				fmt.Fprintf(&b, "  ! %s\n", d)
			}
		}
	}
	for _, n := range r.Notes {
		fmt.Fprintf(&b, "note        %s\n", n)
	}
	_, err := io.WriteString(w, b.String())
	if err != nil {
		return fmt.Errorf("writing the explanation: %w", err)
	}
	return nil
}
