package main

import (
	"runtime/debug"
	"testing"
)

func TestTuneGC(t *testing.T) {
	defer debug.SetGCPercent(debug.SetGCPercent(100))
	for _, tc := range []struct {
		name       string
		gogc       string
		runtimeHas int // what the runtime read from GOGC at start
		want       int
	}{
		{"GOGC unset: kproxy's default", "", 100, defaultGCPercent},
		{"GOGC set: left alone", "200", 200, 200},
		{"GOGC=off: left alone", "off", -1, -1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			debug.SetGCPercent(tc.runtimeHas)
			got := tuneGC(func(k string) string {
				if k == "GOGC" {
					return tc.gogc
				}
				return ""
			})
			if got != tc.want || gcPercent() != tc.want {
				t.Errorf("tuneGC returned %d, runtime has %d; want %d", got, gcPercent(), tc.want)
			}
		})
	}
}
