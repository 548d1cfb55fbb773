package integration

import (
	"fmt"
	"strconv"
	"strings"
)

// Memory is a process's resident memory from /proc/<pid>/status.
type Memory struct {
	// RSS is VmRSS, HWM is VmHWM (the peak RSS), in bytes.
	RSS, HWM int64
}

// parseProcStatus reads VmRSS and VmHWM ("VmRSS:   12345 kB") from the text
// of /proc/<pid>/status.
func parseProcStatus(text string) (Memory, error) {
	var m Memory
	found := 0
	for _, line := range strings.Split(text, "\n") {
		key, val, ok := strings.Cut(line, ":")
		if !ok || (key != "VmRSS" && key != "VmHWM") {
			continue
		}
		f := strings.Fields(val)
		if len(f) != 2 || f[1] != "kB" {
			return Memory{}, fmt.Errorf("/proc status: %s: unexpected value %q", key, strings.TrimSpace(val))
		}
		kb, err := strconv.ParseInt(f[0], 10, 64)
		if err != nil {
			return Memory{}, fmt.Errorf("/proc status: %s: %w", key, err)
		}
		if key == "VmRSS" {
			m.RSS = kb << 10
		} else {
			m.HWM = kb << 10
		}
		found++
	}
	if found != 2 {
		return Memory{}, fmt.Errorf("/proc status: VmRSS or VmHWM missing (a kernel thread, or a zombie)")
	}
	return m, nil
}

// MiB renders bytes in MiB with one decimal.
func MiB(b int64) string { return strconv.FormatFloat(float64(b)/(1<<20), 'f', 1, 64) }
