//go:build race

package e2e

// raceEnabled builds kproxy with -race too when the tests run with -race.
const raceEnabled = true
