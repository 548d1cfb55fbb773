package integration

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"
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

// clockTicks is USER_HZ, the unit of /proc/<pid>/stat's CPU times: 100 on
// every Linux architecture Go supports.
const clockTicks = 100

// parseProcStat returns the CPU time (user + system) a process has used
// from the text of /proc/<pid>/stat. The command name (field 2) is in
// parentheses and may hold spaces, so fields are counted after its last
// closing parenthesis: utime and stime are the 14th and 15th fields.
func parseProcStat(text string) (time.Duration, error) {
	i := strings.LastIndexByte(text, ')')
	if i < 0 {
		return 0, fmt.Errorf("/proc stat: no command name in %q", text)
	}
	f := strings.Fields(text[i+1:])
	// f[0] is field 3 (state): utime is f[11], stime f[12].
	if len(f) < 13 {
		return 0, fmt.Errorf("/proc stat: %d fields after the command name, want at least 13", len(f))
	}
	var ticks int64
	for _, s := range f[11:13] {
		n, err := strconv.ParseInt(s, 10, 64)
		if err != nil {
			return 0, fmt.Errorf("/proc stat: CPU time %q: %w", s, err)
		}
		ticks += n
	}
	return time.Duration(ticks) * time.Second / clockTicks, nil
}

// ProcCPU returns the CPU time process pid has used so far.
func ProcCPU(pid int) (time.Duration, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	return parseProcStat(string(b))
}
