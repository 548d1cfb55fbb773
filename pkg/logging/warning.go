// Package logging holds what kproxy's logging needs beyond logr: a
// warning severity.
package logging

import (
	"fmt"
	"reflect"
	"strconv"
	"strings"

	"k8s.io/klog/v2"
)

// klogSink is the type of the sink of klog's own logger (klog.Background()
// while no other logger is installed, as with the default text format).
var klogSink = reflect.TypeOf(klog.NewKlogr().GetSink())

// Warning logs msg with the key/value pairs at WARNING severity.
//
// logr has no warning level. When logger is klog's own (the text format),
// the line goes through klog.WarningDepth, so it starts with "W" like
// upstream kube-proxy's warnings, with msg and the pairs rendered as klog
// renders structured lines (`"msg" key="value"`); values attached to
// logger with WithValues are not carried over (kproxy's callers attach
// none). With any other logger (the JSON format, a test's), which has no
// severity either, it is an Info line whose message starts with
// "Warning: ".
func Warning(logger klog.Logger, msg string, keysAndValues ...any) {
	if sink := logger.GetSink(); sink == nil || reflect.TypeOf(sink) != klogSink {
		if sink != nil {
			logger.WithCallDepth(1).Info("Warning: "+msg, keysAndValues...)
		}
		return
	}
	klog.WarningDepth(1, Render(msg, keysAndValues...))
}

// Render renders msg and the key/value pairs as klog's text format does
// for structured lines: the message quoted, then key=value, strings,
// errors and Stringers quoted.
func Render(msg string, keysAndValues ...any) string {
	var b strings.Builder
	b.WriteString(strconv.Quote(msg))
	for i := 0; i < len(keysAndValues); i += 2 {
		b.WriteByte(' ')
		fmt.Fprint(&b, keysAndValues[i])
		b.WriteByte('=')
		if i+1 >= len(keysAndValues) {
			b.WriteString(`"(MISSING)"`)
			break
		}
		b.WriteString(value(keysAndValues[i+1]))
	}
	return b.String()
}

func value(v any) string {
	switch v := v.(type) {
	case nil:
		return "<nil>"
	case string:
		return strconv.Quote(v)
	case error:
		return strconv.Quote(v.Error())
	case fmt.Stringer:
		return strconv.Quote(v.String())
	}
	return fmt.Sprintf("%+v", v)
}
