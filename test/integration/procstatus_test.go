package integration

import "testing"

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
