package integration

import (
	"testing"
	"time"
)

func TestParseProcStatus(t *testing.T) {
	for _, tc := range []struct {
		name, text string
		want       Memory
		err        bool
	}{
		{"process", "Name:\tkproxy\nVmPeak:\t 900000 kB\nVmHWM:\t   81920 kB\nVmRSS:\t   40960 kB\nThreads:\t9\n", Memory{RSS: 40 << 20, HWM: 80 << 20}, false},
		{"kernel thread", "Name:\tkthreadd\nThreads:\t1\n", Memory{}, true},
		{"bad unit", "VmHWM:\t1 MB\nVmRSS:\t1 kB\n", Memory{}, true},
		{"bad number", "VmHWM:\tx kB\nVmRSS:\t1 kB\n", Memory{}, true},
	} {
		got, err := parseProcStatus(tc.text)
		if (err != nil) != tc.err || got != tc.want {
			t.Errorf("%s: parseProcStatus = %+v, %v; want %+v, error %v", tc.name, got, err, tc.want, tc.err)
		}
	}
	if s := MiB(3 << 19); s != "1.5" {
		t.Errorf("MiB = %q", s)
	}
}

// TestParseProcStat reads utime and stime past a command name holding
// spaces and a parenthesis.
func TestParseProcStat(t *testing.T) {
	// pid (comm) state ppid pgrp session tty tpgid flags minflt cminflt majflt cmajflt utime stime ...
	line := "4242 (kproxy (x) y) S 1 4242 4242 0 -1 4194560 1200 0 3 0 250 125 0 0 20 0 12 0 100 1000 2000\n"
	got, err := parseProcStat(line)
	if err != nil {
		t.Fatal(err)
	}
	if want := 3750 * time.Millisecond; got != want {
		t.Errorf("CPU %v, want %v (250 + 125 ticks)", got, want)
	}
	for _, bad := range []string{"4242 kproxy S 1", "4242 (kproxy) S 1 2 3", "4242 (k) S 1 4242 4242 0 -1 4194560 1200 0 3 0 x 125 0"} {
		if _, err := parseProcStat(bad); err == nil {
			t.Errorf("%q: no error", bad)
		}
	}
}
