package integration

import (
	"bufio"
	"fmt"
	"math"
	"strconv"
	"strings"
)

// Sample is one line of the Prometheus text format: a series and its value.
type Sample struct {
	Name   string
	Labels map[string]string
	Value  float64
}

// Metrics are the samples of one scrape.
type Metrics []Sample

// ParseMetrics reads the Prometheus text exposition format (version 0.0.4)
// as served on /metrics: comment lines are skipped, every other line is
// "name[{label="value",...}] value [timestamp]".
func ParseMetrics(text string) (Metrics, error) {
	var out Metrics
	sc := bufio.NewScanner(strings.NewReader(text))
	sc.Buffer(make([]byte, 64<<10), 4<<20)
	for lineNo := 1; sc.Scan(); lineNo++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		s, err := parseSample(line)
		if err != nil {
			return nil, fmt.Errorf("metrics line %d %q: %w", lineNo, line, err)
		}
		out = append(out, s)
	}
	return out, sc.Err()
}

func parseSample(line string) (Sample, error) {
	s := Sample{Labels: map[string]string{}}
	i := strings.IndexAny(line, "{ ")
	if i < 0 {
		return s, fmt.Errorf("no value")
	}
	s.Name = line[:i]
	rest := line[i:]
	if strings.HasPrefix(rest, "{") {
		rest = rest[1:]
		for {
			rest = strings.TrimLeft(rest, " ,")
			if strings.HasPrefix(rest, "}") {
				rest = rest[1:]
				break
			}
			eq := strings.Index(rest, `="`)
			if eq < 0 {
				return s, fmt.Errorf("bad label list")
			}
			key := strings.TrimSpace(rest[:eq])
			val, n, err := unquote(rest[eq+1:])
			if err != nil {
				return s, fmt.Errorf("label %s: %w", key, err)
			}
			s.Labels[key] = val
			rest = rest[eq+1+n:]
		}
	}
	fields := strings.Fields(rest)
	if len(fields) == 0 {
		return s, fmt.Errorf("no value")
	}
	v, err := parseValue(fields[0])
	if err != nil {
		return s, err
	}
	s.Value = v
	return s, nil
}

// unquote reads a double-quoted label value with \\, \" and \n escapes from
// the start of s and returns it with the number of bytes consumed.
func unquote(s string) (string, int, error) {
	if !strings.HasPrefix(s, `"`) {
		return "", 0, fmt.Errorf("value not quoted")
	}
	var b strings.Builder
	for i := 1; i < len(s); i++ {
		switch c := s[i]; c {
		case '"':
			return b.String(), i + 1, nil
		case '\\':
			if i+1 == len(s) {
				return "", 0, fmt.Errorf("dangling escape")
			}
			i++
			switch s[i] {
			case 'n':
				b.WriteByte('\n')
			default:
				b.WriteByte(s[i])
			}
		default:
			b.WriteByte(c)
		}
	}
	return "", 0, fmt.Errorf("unterminated value")
}

func parseValue(s string) (float64, error) {
	switch s {
	case "+Inf":
		return math.Inf(1), nil
	case "-Inf":
		return math.Inf(-1), nil
	case "NaN":
		return math.NaN(), nil
	}
	v, err := strconv.ParseFloat(s, 64)
	if err != nil {
		return 0, fmt.Errorf("bad value %q: %w", s, err)
	}
	return v, nil
}

// Get returns the value of the series name whose labels include every
// label in want (pairs: "ip_family", "IPv4"), and whether there is one.
// When several series match, their values are summed.
func (m Metrics) Get(name string, want ...string) (float64, bool) {
	var sum float64
	found := false
	for _, s := range m {
		if s.Name != name || !hasLabels(s.Labels, want) {
			continue
		}
		sum += s.Value
		found = true
	}
	return sum, found
}

func hasLabels(l map[string]string, want []string) bool {
	for i := 0; i+1 < len(want); i += 2 {
		if l[want[i]] != want[i+1] {
			return false
		}
	}
	return true
}

// Histogram returns the _count and _sum of a histogram's series matching
// want (summed over the series that match).
func (m Metrics) Histogram(name string, want ...string) (count, sum float64) {
	count, _ = m.Get(name+"_count", want...)
	sum, _ = m.Get(name+"_sum", want...)
	return count, sum
}
