package model

// SetVisit makes the tracer call f for every rule it evaluates (chain,
// rule number from 1), for the coverage test.
func (t *Tracer) SetVisit(f func(chain string, rule int)) { t.visit = f }

// Clone returns a deep copy of the model, for tests that break one.
func (m *Model) Clone() *Model { return m.clone() }
