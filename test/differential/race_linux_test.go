//go:build race

package differential

// raceEnabled builds kproxy with -race too when the tests run with -race.
const raceEnabled = true
