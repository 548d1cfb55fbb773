package integration

import (
	"fmt"
	"strconv"
	"strings"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// Sample is one line of the Prometheus text format: a series and its value.
type Sample struct {
	Name   string
	Labels map[string]string
	Value  float64
}

// Metrics are the samples of one scrape.
type Metrics []Sample

// ParseMetrics reads the Prometheus text exposition format as served on
// /metrics, with the Prometheus parser, and flattens it into one Sample per
// series line: a histogram or summary becomes its _bucket (le) or quantile
// series, _sum and _count.
func ParseMetrics(text string) (Metrics, error) {
	parser := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := parser.TextToMetricFamilies(strings.NewReader(text))
	if err != nil {
		return nil, fmt.Errorf("metrics: %w", err)
	}
	var out Metrics
	add := func(name string, labels map[string]string, v float64) {
		out = append(out, Sample{Name: name, Labels: labels, Value: v})
	}
	for name, f := range fams {
		for _, m := range f.GetMetric() {
			labels := func(extra ...string) map[string]string {
				l := make(map[string]string, len(m.GetLabel())+1)
				for _, p := range m.GetLabel() {
					l[p.GetName()] = p.GetValue()
				}
				for i := 0; i+1 < len(extra); i += 2 {
					l[extra[i]] = extra[i+1]
				}
				return l
			}
			switch f.GetType() {
			case dto.MetricType_COUNTER:
				add(name, labels(), m.GetCounter().GetValue())
			case dto.MetricType_GAUGE:
				add(name, labels(), m.GetGauge().GetValue())
			case dto.MetricType_HISTOGRAM, dto.MetricType_GAUGE_HISTOGRAM:
				h := m.GetHistogram()
				for _, b := range h.GetBucket() {
					add(name+"_bucket", labels("le", strconv.FormatFloat(b.GetUpperBound(), 'g', -1, 64)), float64(b.GetCumulativeCount()))
				}
				add(name+"_sum", labels(), h.GetSampleSum())
				add(name+"_count", labels(), float64(h.GetSampleCount()))
			case dto.MetricType_SUMMARY:
				sm := m.GetSummary()
				for _, q := range sm.GetQuantile() {
					add(name, labels("quantile", strconv.FormatFloat(q.GetQuantile(), 'g', -1, 64)), q.GetValue())
				}
				add(name+"_sum", labels(), sm.GetSampleSum())
				add(name+"_count", labels(), float64(sm.GetSampleCount()))
			default:
				add(name, labels(), m.GetUntyped().GetValue())
			}
		}
	}
	return out, nil
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
