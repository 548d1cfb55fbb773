//go:build unix

package windows

import "syscall"

// processCPU returns the CPU time (user + system) the process has used, in
// nanoseconds: benchmarks report it per operation, since wall time on a
// shared machine measures the neighbours too.
func processCPU() (int64, bool) {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0, false
	}
	return ru.Utime.Nano() + ru.Stime.Nano(), true
}
