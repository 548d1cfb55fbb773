//go:build !race

package integration

// raceEnabled builds kproxy with -race too when the tests run with -race.
const raceEnabled = false
