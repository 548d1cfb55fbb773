package logging

import (
	"bytes"
	"errors"
	"flag"
	"os"
	"regexp"
	"strings"
	"testing"

	"k8s.io/klog/v2"
	"k8s.io/klog/v2/ktesting"
)

// captureKlog sends klog's text output to a buffer for the test.
func captureKlog(t *testing.T) *bytes.Buffer {
	t.Helper()
	fs := flag.NewFlagSet("klog", flag.ContinueOnError)
	klog.InitFlags(fs)
	var buf bytes.Buffer
	_ = fs.Set("logtostderr", "false")
	_ = fs.Set("alsologtostderr", "false")
	_ = fs.Set("stderrthreshold", "FATAL")
	klog.SetOutput(&buf)
	t.Cleanup(func() {
		klog.Flush()
		_ = fs.Set("logtostderr", "true")
		klog.SetOutput(os.Stderr)
	})
	return &buf
}

// TestWarningIsWSeverity: through klog's own logger (the text format) a
// warning is a W line naming the caller, with the pairs rendered.
func TestWarningIsWSeverity(t *testing.T) {
	buf := captureKlog(t)
	Warning(klog.Background(), "Configuration problem", "problem", "x is ignored", "err", errors.New("bad"), "n", 3)
	klog.Flush()
	line := strings.TrimSpace(buf.String())
	if !strings.HasPrefix(line, "W") {
		t.Fatalf("warning line %q does not start with W", line)
	}
	if !regexp.MustCompile(`warning_test\.go:\d+\] "Configuration problem" problem="x is ignored" err="bad" n=3$`).MatchString(line) {
		t.Errorf("warning line %q: want the caller's file and the structured message", line)
	}
	buf.Reset()
	klog.Background().Info("Plain")
	klog.Flush()
	if !strings.HasPrefix(buf.String(), "I") {
		t.Errorf("info line %q: the capture does not tell severities apart", buf.String())
	}
}

// TestWarningOtherLogger: a logger that is not klog's (JSON, tests) gets
// an Info line with a "Warning: " message.
func TestWarningOtherLogger(t *testing.T) {
	logger := ktesting.NewLogger(t, ktesting.NewConfig(ktesting.BufferLogs(true)))
	Warning(logger, "Configuration problem", "problem", "x")
	got := logger.GetSink().(ktesting.Underlier).GetBuffer().String()
	if !strings.Contains(got, `Warning: Configuration problem problem="x"`) {
		t.Errorf("logged %q", got)
	}
	Warning(logr0(), "ignored") // a zero logger discards, without panicking
}

func TestRender(t *testing.T) {
	if got, want := Render("M", "a", "s\n", "odd"), `"M" a="s\n" odd="(MISSING)"`; got != want {
		t.Errorf("Render = %s, want %s", got, want)
	}
}

func logr0() (l klog.Logger) { return l }
